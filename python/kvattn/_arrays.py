"""Framework-neutral array helpers: where an array lives, and new arrays "like" it.

kvattn never imports numpy, torch, CuPy or JAX itself; it recognises an array by the module its
type comes from and allocates outputs with that same framework, so results come back as the
caller's kind of array. Everything else goes through DLPack in the C extension.
"""

_DTYPE_NAMES = {
    "float32": "float32", "f32": "float32", "float": "float32", "fp32": "float32",
    "float16": "float16", "f16": "float16", "half": "float16", "fp16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
}


def dtype_name(dtype):
    """'float32' | 'float16' | 'bfloat16' from a string, numpy/torch/JAX dtype or an array."""
    if hasattr(dtype, "dtype") and not isinstance(dtype, type):
        dtype = dtype.dtype
    s = str(dtype).replace("torch.", "").replace("<class '", "").replace("'>", "")
    s = s.split(".")[-1]
    if s not in _DTYPE_NAMES:
        raise TypeError("unsupported dtype %r: kvattn computes on float32, float16 or bfloat16" % (dtype,))
    return _DTYPE_NAMES[s]


def framework(x):
    """'torch' | 'numpy' | 'cupy' | 'jax' | 'other'."""
    mod = type(x).__module__.split(".", 1)[0]
    if mod in ("torch", "numpy", "cupy"):
        return mod
    if mod in ("jax", "jaxlib"):
        return "jax"
    return "other"


def where(x):
    """(device_type, device_id): (0, 0) for host memory, (1, n) for CUDA device n."""
    fw = framework(x)
    if fw == "torch":
        d = x.device
        return (1, d.index or 0) if d.type == "cuda" else (0, 0)
    if fw == "numpy":
        return (0, 0)
    dev_type, dev_id = x.__dlpack_device__()
    dev_type = int(dev_type)
    if dev_type in (1, 3):  # CPU, CUDA host
        return (0, 0)
    if dev_type in (2, 13):  # CUDA, CUDA managed
        return (1, int(dev_id))
    raise ValueError("kvattn runs on CPU or CUDA arrays; this one is on DLPack device %d" % dev_type)


def parse_device(device):
    """'cpu' | 'cuda' | 'cuda:N' | torch.device | an array -> (device_type, device_id)."""
    if device is None:
        return (0, 0)
    if not isinstance(device, str) and hasattr(device, "__dlpack_device__"):
        return where(device)
    s = str(device)
    if s == "cpu":
        return (0, 0)
    if s.startswith("cuda"):
        return (1, int(s.split(":", 1)[1]) if ":" in s else 0)
    raise ValueError("device must be 'cpu', 'cuda' or 'cuda:N', got %r" % (device,))


class _JaxOut:
    """JAX arrays are immutable: kvattn writes into host numpy arrays and converts at the end."""


def empty_like(ref, shape, dtype=None):
    """A new uninitialised array of ref's framework and device; dtype None means ref's dtype,
    'float32' for float32. Returns (array_to_write, finish) where finish(a) gives the array to
    hand back to the caller (the same array except for JAX)."""
    fw = framework(ref)
    if fw == "torch":
        import torch
        dt = ref.dtype if dtype is None else getattr(torch, dtype)
        return torch.empty(shape, dtype=dt, device=ref.device), _same
    if fw == "cupy":
        import cupy
        return cupy.empty(shape, dtype=ref.dtype if dtype is None else dtype), _same
    dev_type, _ = where(ref)
    if dev_type != 0:
        raise TypeError("kvattn cannot allocate outputs for %s arrays on CUDA: pass out= "
                        "(a torch or CuPy array)" % type(ref).__name__)
    import numpy
    if dtype is None:
        dtype = ref.dtype
        if dtype_name(dtype) == "bfloat16":  # numpy cannot export bfloat16 through DLPack
            raise TypeError("bfloat16 outputs in host memory need torch tensors (or pass out=)")
    a = numpy.empty(shape, dtype=dtype)
    if fw == "jax":
        import jax.numpy as jnp
        return a, jnp.asarray
    return a, _same


def _same(a):
    return a


def host_ints(x):
    """A host int32-compatible object the extension reads: lists and host arrays pass through,
    device tensors are copied to the host."""
    if isinstance(x, (list, tuple)):
        return x
    fw = framework(x)
    if fw == "torch" and x.device.type != "cpu":
        return x.to("cpu")
    if fw == "cupy":
        return x.get()
    if fw == "jax":
        import numpy
        return numpy.asarray(x)
    return x


def _one_d(x, what):
    if getattr(x, "ndim", 1) != 1:
        raise ValueError("%s: expected a 1-D sequence or array of ints, got %d dimensions" % (what, x.ndim))


def last_int(x, what="indptr"):
    _one_d(x, what)
    if len(x) == 0:
        raise ValueError("%s: needs batch + 1 entries, got none" % what)
    return int(x[-1])


def max_plus_one(x, what="indices"):
    if isinstance(x, (list, tuple)):
        return (max(x) + 1) if len(x) else 1
    _one_d(x, what)
    if len(x) == 0:
        return 1
    return int(x.max()) + 1
