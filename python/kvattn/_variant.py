"""GPU attention variants: score modifiers written as CUDA C and compiled at run time (NVRTC).

The Python face of kva_variant (include/kvattn.h, "Attention variants"). A Variant is made once
and handed to the attention calls with variant=; its caller data (a device pointer the function
reads through `user`) comes from the Variant itself or from variant_data= on the call.
"""
import struct

from . import _ext
from ._arrays import dtype_name, parse_device, where

_KINDS = {"decode": _ext.VARIANT_DECODE, "prefill": _ext.VARIANT_PREFILL}
_DTYPE_BITS = {"float32": 1 << _ext.F32, "float16": 1 << _ext.F16, "bfloat16": 1 << _ext.BF16}


def alibi_slopes(num_heads):
    """The ALiBi slopes of Press et al. for num_heads heads, as a list of float (2^(-8 (h+1) / n)
    for a power of two n, the usual interleaved extension otherwise)."""
    return _ext.alibi_slopes(int(num_heads))


def _names(x):
    """A str / dtype, or an iterable of them, as a list."""
    if x is None:
        return []
    if isinstance(x, str) or not hasattr(x, "__iter__"):
        return [x]
    return list(x)


def _options(options):
    """options dict -> (kinds bits, dtype bits, head_dim) of kva_variant_options (0: all)."""
    if options is None:
        return 0, 0, 0
    if not isinstance(options, dict):
        raise TypeError("options: expected a dict with keys kinds, dtypes, head_dim, got %s" % type(options).__name__)
    unknown = sorted(set(options) - {"kinds", "dtypes", "head_dim"})
    if unknown:
        raise ValueError("options: unknown key(s) %s (kinds, dtypes, head_dim)" % ", ".join(map(repr, unknown)))
    kinds = 0
    for k in _names(options.get("kinds")):
        if k not in _KINDS:
            raise ValueError("options['kinds']: %r is not 'decode' or 'prefill'" % (k,))
        kinds |= _KINDS[k]
    dtypes = 0
    for d in _names(options.get("dtypes")):
        dtypes |= _DTYPE_BITS[dtype_name(d)]
    head_dim = options.get("head_dim") or 0
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 0:
        raise ValueError("options['head_dim']: expected an int >= 0 (0: every head dim), got %r" % (head_dim,))
    return kinds, dtypes, head_dim


def _check_device(dev):
    if dev[0] != _ext.DEVICE_CUDA:
        raise ValueError("kvattn.Variant: variants are compiled for CUDA devices (device='cuda' or 'cuda:N'). "
                         "CPU calls have no score modifier in the Python API: the built-in causal, "
                         "window_left and soft_cap run there")


class Variant:
    """A score modifier for the GPU kernels: CUDA C source compiled at run time with NVRTC and
    inlined into the decode and prefill kernels (the GPU form of the C library's score_mod).

        src = '''
        float doc_mask(float score, int32_t q_pos, int32_t kv_pos, int32_t qo_head, const void *user) {
            const int32_t *doc = (const int32_t *)user;
            return doc[kv_pos] == doc[q_pos] ? score : -INFINITY;
        }'''
        mask = kvattn.Variant(src, "doc_mask", device="cuda",
                              options={"dtypes": ["bfloat16"], "head_dim": 128})
        o = kvattn.attention(q, k, v, causal=True, variant=mask, variant_data=doc_ids)  # int32 CUDA tensor

    The source defines the function `name` with exactly that signature (device code by default:
    no __device__ needed); helper functions, constants and __device__ arrays may sit beside it.
    Names starting with kva_ or KVA_ belong to the library.

    When it is called: on every score a query can see, in natural-log units, after sm_scale and
    the soft cap and before the causal and window masks. q_pos and kv_pos are positions inside the
    request: keys 0 .. kv_len-1, queries kv_len-qo_len+i (bottom-right aligned, decode's query at
    kv_len-1; negative only when a request has more queries than keys); qo_head is 0 .. Hq-1.
    Masked keys and keys past the request's end are never passed, so data indexed by these
    numbers is read in range (kernels may evaluate it for padding rows with a real query's
    position, and in place of a masked key with a key the same query sees and a score of 0, and
    discard those results). Return -INFINITY (or kva_masked()) to mask a key; a query that sees
    no key gets output 0 and LSE -inf. NaN, or a score beyond f32's range, makes the row NaN.

    What it may use: float and integer arithmetic, the CUDA math functions (compiled with
    --use_fast_math, so expf/tanhf are the fast approximations; kva_tanhf is the built-in soft
    cap's tanh in the same kernel: the hardware tanh in f16/bf16 prefill, accurate elsewhere),
    loads through `user` (a division by a value loaded there is faster written x * (1.0f / c):
    a reciprocal per tile instead of one per score), and the prelude's names: int32_t and the
    other fixed-width integers,
    INFINITY, NAN, kva_tanhf, kva_masked(), kva_int_to_float. It must be a pure function of its
    arguments and the memory behind `user` (kernels may call it several times for one score, in
    any order, from any thread); it may not write memory, synchronise or #include headers.

    `user` is device memory of the variant's GPU: `data` here (the default of every call: host
    bytes or a host array are copied to the device once, a CUDA array is referenced and kept
    alive, an int is taken as a device address), or variant_data= of a call (a CUDA array on the
    same device or an int address), which replaces it for that call.

    options: which kernels to compile, {"kinds": "decode" | "prefill" | both (default both),
    "dtypes": ["bfloat16", ...] (default all three), "head_dim": 128 (default 0: every head dim)}.
    Each kernel costs about a second of NVRTC the first time; later creations load it from the
    context or from the disk cache ($XDG_CACHE_HOME/kvattn, else ~/.cache/kvattn). A call that
    needs a kernel the variant was not compiled for raises KvattnError (KVA_ERR_UNSUPPORTED).

    Errors: a source that does not compile raises KvattnError with status KVA_ERR_INVALID_ARG and
    NVRTC's log in .message (lines of the source are named "variant.cu(N)"); a missing libnvrtc
    raises KVA_ERR_UNSUPPORTED naming the file (KVA_NVRTC_LIBRARY names another); a build without
    CUDA KVA_ERR_NOT_BUILT; device="cpu" a ValueError (variants run on CUDA only), as does passing
    a variant to a call on another device.

    Lifetime and threads: a Variant is immutable; any thread may use it in calls on its device,
    at once. Creation compiles while holding the GIL. Keep the Variant and any variant_data
    alive while runs that use them may be in flight (calls on CUDA only enqueue) and while a CUDA
    graph captured with them may be replayed: the wrappers keep the variant and variant_data
    given to plan() alive until their next plan().
    """

    def __init__(self, source, name, device="cuda", options=None, data=None):
        if not isinstance(source, str) or not isinstance(name, str):
            raise TypeError("Variant(source, name): both must be str")
        self._make(source, name, device, options, data, None)

    def _make(self, source, name, device, options, data, heads):
        kinds, dtypes, head_dim = _options(options)
        dev = parse_device(device)
        _check_device(dev)
        self._v = _ext.Variant(dev[0], dev[1], source, name, kinds, dtypes, head_dim, data)
        self._dev = dev
        self._heads = heads  # ALiBi: the number of slopes (query heads it serves), else None
        self.source = source if source is not None else _ext.alibi_source()
        self.name = name if source is not None else "kva_alibi"
        self.device = "cuda:%d" % dev[1]
        self.data = data

    @classmethod
    def alibi(cls, slopes, device="cuda", options=None):
        """The built-in ALiBi variant: score + slopes[qo_head] * (kv_pos - q_pos).

        slopes: an int n (the standard slopes of n heads, alibi_slopes(n)), a host sequence or
        array of floats (copied to the device), or a float32 CUDA array (referenced). Give one
        slope per query head at least; calls with more query heads are refused. Exact for
        distances below 2^22 tokens, for any finite slope and sm_scale."""
        self = cls.__new__(cls)
        if isinstance(slopes, int) and not isinstance(slopes, bool):
            vals = alibi_slopes(slopes)
        elif hasattr(slopes, "__dlpack_device__") and where(slopes)[0] == _ext.DEVICE_CUDA:
            if dtype_name(slopes) != "float32" or len(slopes.shape) != 1:
                raise ValueError("slopes: a CUDA array of slopes must be 1-D float32")
            self._make(None, None, device, options, slopes, int(slopes.shape[0]))
            return self
        else:
            vals = [float(x) for x in slopes]
        if not vals:
            raise ValueError("slopes: expected at least one slope")
        self._make(None, None, device, options, struct.pack("=%df" % len(vals), *vals), len(vals))
        self.slopes = list(vals)
        return self

    @staticmethod
    def alibi_source():
        """The CUDA C source of the built-in ALiBi variant (function kva_alibi), to start from."""
        return _ext.alibi_source()

    def stats(self):
        """dict: what creation cost: modules (compiled units: one per kind, dtype and head dim),
        compiled (by NVRTC in that call), disk_hits, context_hits, compile_ms, total_ms."""
        return self._v.stats()

    @property
    def data_ptr(self):
        """int: device address of the default caller data (0: none)."""
        return self._v.data_ptr

    def __repr__(self):
        return "Variant(%r, %s)" % (self.name, self.device)


def variant_args(variant, variant_data, device, num_qo_heads=None):
    """(the extension's variant or None, variant_data) for a call on device (type, id) with
    num_qo_heads query heads; clear errors for a wrong type, device or head count."""
    if variant is None:
        if variant_data is not None:
            raise ValueError("variant_data= given without variant=")
        return None, None
    if not isinstance(variant, Variant):
        raise TypeError("variant: expected a kvattn.Variant, got %s" % type(variant).__name__)
    if tuple(device) != variant._dev:
        where_ = "the CPU" if device[0] == _ext.DEVICE_CPU else "cuda:%d" % device[1]
        raise ValueError("variant: %r runs on %s but this call runs on %s%s" % (
            variant, variant.device, where_,
            " (CPU calls take only the built-in causal, window_left and soft_cap)"
            if device[0] == _ext.DEVICE_CPU else ""))
    if variant_data is None and variant._heads is not None and num_qo_heads is not None \
            and num_qo_heads > variant._heads:
        raise ValueError("variant: the ALiBi variant has %d slopes but the call has %d query heads" % (
            variant._heads, num_qo_heads))
    return variant._v, variant_data
