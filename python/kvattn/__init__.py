"""kvattn -- attention for LLM inference over a paged KV cache, on the CPU and NVIDIA GPUs.

The Python face of the C library (include/kvattn.h). Arrays of any framework that speaks DLPack
(numpy, torch, CuPy, JAX) go in; results come back as arrays of the same framework. CUDA arrays
run on the caller's current stream (torch's for torch tensors, CuPy's for CuPy arrays, or stream=).

Shapes (names used throughout):
    T   query tokens (summed over a batch)      Hq  query heads      D  head dim
    S   key tokens (summed over a batch)        Hk  KV heads (divides Hq; GQA/MQA)
    B   batch (requests)                        P   pages in the pool, page size p
    D is a multiple of 16: up to 256 on the CPU, 32..256 on CUDA.

    q [T, Hq, D]   k, v [S, Hk, D]   out like q   lse float32 [T, Hq] (natural log)
    paged K/V: (k_pages, v_pages) each [P, p, Hk, D] ("NHD") or [P, Hk, p, D] ("HND"), or one
               interleaved array [P, 2, p, Hk, D], or a KVPages / PagedKVCache.layer(l) object
    page table (CSR): indptr [B+1], indices [indptr[B]], last_page_len [B] (host ints)

Entry points:
    attention, attention_varlen          one-shot attention without a cache
    BatchDecodeWrapper                   plan once per step, run per layer (decode, paged)
    BatchPrefillWrapper                  the same for prefill (ragged K/V or paged)
    merge_states, block_table_to_csr     building blocks
    PagedKVCache, attention_with_kv_cache   the cache manager and attention on top of it
    Variant, alibi_slopes                GPU score modifiers (CUDA C compiled at run time): the
                                         variant= / variant_data= keywords of the calls above
    KvattnError (.status, .status_name, .message), NoSpaceError

Positions: a request with n queries and m keys has its queries at m-n .. m-1 (bottom-right
aligned, as in chunked prefill and decode); `causal` masks keys after a query's position and
`window_left >= 0` keys before position - window_left.
"""
import math
import struct

from . import _ext
from ._arrays import dtype_name, empty_like, framework, host_ints, last_int, max_plus_one, parse_device, where
from ._ext import KvattnError, KVPages, NoSpaceError
from ._variant import Variant, alibi_slopes
from ._variant import variant_args as _variant_args

__version__ = _ext.__version__
__all__ = [
    "attention", "attention_varlen", "BatchDecodeWrapper", "BatchPrefillWrapper", "merge_states",
    "block_table_to_csr", "PagedKVCache", "attention_with_kv_cache", "KVPages", "KvattnError",
    "NoSpaceError", "cuda_available", "set_num_threads", "device_info", "Variant", "alibi_slopes",
]

_DTYPE_CODE = {"float32": _ext.F32, "float16": _ext.F16, "bfloat16": _ext.BF16}


def cuda_available():
    """True if this build has the CUDA backend and a CUDA device is visible."""
    return bool(_ext.cuda_available())


def set_num_threads(n):
    """Threads of CPU calls, the calling one included (0: the cores this process may run on).

    The library's own worker pool runs them (no OpenMP, so nothing to clash with PyTorch's
    runtime): workers start at the first call that splits work, poll briefly after a call, then
    sleep; a call never waits for a worker that has not started on it."""
    _ext.set_num_threads(int(n))


def device_info(device="cpu"):
    """dict(name, num_sms, l2_bytes, total_memory, threads) of 'cpu' or 'cuda:N'."""
    return _ext.device_info(*parse_device(device))


def _layout(kv_layout, name="kv_layout"):
    """'NHD' | 'HND' (either case); anything else is a mistake, not NHD."""
    s = str(kv_layout).upper()
    if s not in ("NHD", "HND"):
        raise ValueError("%s must be 'NHD' or 'HND', got %r" % (name, kv_layout))
    return s


def _scale(sm_scale):
    """The library's sm_scale: 0 for None (1/sqrt(D)). The library also reads any value <= 0 as
    1/sqrt(D), so an explicit one must be positive, or a 0 or negative scale would silently be
    replaced by the default."""
    if sm_scale is None:
        return 0.0
    s = float(sm_scale)
    if not 0.0 < s < float("inf"):
        raise ValueError("sm_scale must be positive and finite (None: 1/sqrt(head_dim)), got %r" % (sm_scale,))
    return s


def _f32(x):
    """x rounded to float32 as C's (float) cast does (+-inf beyond its range)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _check_soft_cap(soft_cap, sm_scale, head_dim):
    """The C library's rule (kva__check_params), for calls that must check before they change
    anything: NaN refused; a cap > 0 and < inf must keep the kernels' float32 constants
    cap * log2(e) and sm_scale / cap normal."""
    cap = _f32(float(soft_cap))
    if cap != cap:
        raise ValueError("soft_cap is NaN")
    if not 0.0 < cap < math.inf:
        return
    scale = _f32(float(sm_scale)) if sm_scale else _f32(1.0 / _f32(math.sqrt(head_dim)))
    flt_min, flt_max, log2e = 2.0 ** -126, _f32(3.4028234663852886e38), _f32(1.4426950408889634)
    inv = _f32(scale / cap)
    if cap < flt_min or _f32(cap * log2e) == math.inf or not flt_min <= inv < math.inf:
        raise ValueError("soft_cap=%r is outside [%.9g, %.9g], where the kernels' cap * log2(e) and sm_scale / cap "
                         "(sm_scale %g) are normal floats (0 or inf: no cap)"
                         % (soft_cap, max(flt_min, _f32(scale / flt_max)), min(_f32(flt_max / log2e),
                                                                             _f32(scale / flt_min)), scale))


def _shape(x, name):
    s = getattr(x, "shape", None)
    if s is None or isinstance(x, (list, tuple)):
        raise TypeError("%s: expected an array (numpy, torch, CuPy, JAX, ...), got %s" % (name, type(x).__name__))
    return tuple(s)


def _dims(x, name, ndim):
    s = _shape(x, name)
    if len(s) != ndim:
        raise ValueError("%s: expected %d dimensions, got shape %s" % (name, ndim, s))
    return s


# ---------------------------------------------------------------------------------------------
# One-shot attention
# ---------------------------------------------------------------------------------------------

def attention(q, k, v, causal=False, sm_scale=None, window_left=-1, soft_cap=0.0, return_lse=False,
              out=None, planned=True, stream=None, variant=None, variant_data=None):
    """Attention of one sequence, or of a batch of equal-length sequences, without a cache.

    q: [Lq, Hq, D] or [B, Lq, Hq, D];  k, v: [Lk, Hk, D] or [B, Lk, Hk, D]  (flash-attn layout).
    Returns out shaped like q (and lse float32 [..., Lq, Hq] when return_lse).
    causal: bottom-right aligned (query i sits at position Lk - Lq + i). sm_scale None means
    1/sqrt(D) (a given one must be > 0); soft_cap > 0 applies soft_cap * tanh(s / soft_cap) to
    the scores (0 or inf: none; a cap whose float32 constants cap * log2(e) or sm_scale / cap
    leave the normal range is refused, KvattnError); window_left >= 0 keeps only keys with position >= query position - window_left.
    planned: True (default) plans the call as a prefill batch (keys split across work items when
    that fills the GPU better; a temporary workspace, see attention_varlen). False calls the C
    library's kva_attention once per sequence: no plan, no workspace, no split of the keys (the
    dense kernel; what bench/bench_torch.py's "dense" column times).
    variant: a kvattn.Variant (CUDA arrays only) applied to every score; variant_data: its caller
    data for this call (a CUDA array or an int device address; None: the Variant's own data).
    Positions inside each sequence as in causal; a 4-D batch passes the same data to every b.
    """
    if not planned:
        return _attention_dense(q, k, v, causal, sm_scale, window_left, soft_cap, return_lse, out, stream,
                                variant, variant_data)
    qs = _shape(q, "q")
    if len(qs) == 3:
        return attention_varlen(q, k, v, None, None, causal=causal, sm_scale=sm_scale,
                                window_left=window_left, soft_cap=soft_cap, return_lse=return_lse, out=out,
                                stream=stream, variant=variant, variant_data=variant_data)
    if len(qs) != 4:
        raise ValueError("q: expected [Lq, Hq, D] or [B, Lq, Hq, D], got %s" % (qs,))
    B, Lq, Hq, D = qs
    ks = _batch_dims(q, k, v)
    Lk = ks[1]
    cu_q = [i * Lq for i in range(B + 1)]
    cu_k = [i * Lk for i in range(B + 1)]
    o3 = None
    if out is not None:
        if _shape(out, "out") != qs:
            raise ValueError("out: expected q's shape %s, got %s" % (qs, _shape(out, "out")))
        if dtype_name(out) != dtype_name(q):
            raise TypeError("out: dtype %s, expected q's %s" % (dtype_name(out), dtype_name(q)))
        st = _ext.array_info(out)[4]
        if B <= 1 or Lq <= 1 or st[0] == Lq * st[1]:  # B and Lq merge: the reshape is a view of out
            o3 = out.reshape(B * Lq, Hq, D)
    res = attention_varlen(q.reshape(B * Lq, Hq, D), k.reshape(B * Lk, ks[2], ks[3]),
                           v.reshape(B * Lk, ks[2], ks[3]), cu_q, cu_k, causal=causal,
                           sm_scale=sm_scale, window_left=window_left, soft_cap=soft_cap,
                           return_lse=return_lse, out=o3, stream=stream, variant=variant,
                           variant_data=variant_data)
    o, lse = res if return_lse else (res, None)
    if out is None:
        out = o.reshape(B, Lq, Hq, D)
    elif o3 is None:  # an out= whose B and Lq do not merge: computed aside, copied in
        out[...] = o.reshape(B, Lq, Hq, D)
    return (out, lse.reshape(B, Lq, Hq)) if return_lse else out


def _batch_dims(q, k, v):
    """k's shape [B, Lk, Hk, D] after checking that v has the same and B is q's: a v in another
    layout (say [B, Hk, Lk, D]) would otherwise be read through a reshape as if it were k's."""
    B = _shape(q, "q")[0]
    ks, vs = _dims(k, "k", 4), _dims(v, "v", 4)
    if ks[0] != B or vs != ks:
        raise ValueError("k, v: expected equal shapes [B, Lk, Hk, D] with q's B = %d, got k %s and v %s"
                         % (B, ks, vs))
    return ks


def _attention_dense(q, k, v, causal, sm_scale, window_left, soft_cap, return_lse, out, stream, variant=None,
                     variant_data=None):
    """attention(planned=False): kva_attention per sequence (3-D q, or each b of a 4-D batch)."""
    qs = _shape(q, "q")
    if len(qs) not in (3, 4):
        raise ValueError("q: expected [Lq, Hq, D] or [B, Lq, Hq, D], got %s" % (qs,))
    variant, variant_data = _variant_args(variant, variant_data, where(q), qs[-2])
    if len(qs) == 4:
        _batch_dims(q, k, v)
    else:
        _dims(k, "k", 3)
        _dims(v, "v", 3)
    fin = fin_l = _same
    if out is None:
        out, fin = empty_like(q, qs)
    lse = None
    if return_lse:
        lse, fin_l = empty_like(q, qs[:-1], "float32")
    kw = dict(causal=bool(causal), sm_scale=_scale(sm_scale), window_left=int(window_left),
              soft_cap=float(soft_cap), stream=stream, variant=variant, variant_data=variant_data)
    if len(qs) == 3:
        _ext.attention(q, k, v, out, lse, **kw)
    else:
        for b in range(qs[0]):
            _ext.attention(q[b], k[b], v[b], out[b], None if lse is None else lse[b], **kw)
    return (fin(out), fin_l(lse)) if return_lse else fin(out)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, sm_scale=None, window_left=-1,
                     soft_cap=0.0, return_lse=False, out=None, stream=None, variant=None, variant_data=None):
    """Attention of a ragged batch (cu_seqlens style, as flash-attn's varlen functions).

    q: [T, Hq, D] with request b's queries in rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1;
    k, v: [S, Hk, D] likewise with cu_seqlens_k. cu_seqlens_*: B+1 host ints (list or host
    array; None means one request holding every row). Returns out [T, Hq, D] (and lse [T, Hq]).
    Plans into a temporary workspace (on CUDA: allocated, and waited for before it is freed, on
    every call): for repeated calls use BatchPrefillWrapper, which keeps its workspace.
    variant, variant_data: a kvattn.Variant and its caller data, as in attention() (positions
    are per request: each request's keys start at 0).
    """
    T, Hq, D = _dims(q, "q", 3)
    S, Hk, _ = _dims(k, "k", 3)
    if cu_seqlens_q is None:
        cu_seqlens_q = [0, T]
    if cu_seqlens_k is None:
        cu_seqlens_k = [0, S]
    cu_q, cu_k = host_ints(cu_seqlens_q), host_ints(cu_seqlens_k)
    batch = len(cu_q) - 1
    dev = where(q)
    variant, variant_data = _variant_args(variant, variant_data, dev, Hq)
    ws = _ext.Workspace(dev[0], dev[1], _ext.WS_PREFILL, max(batch, 1), 0, max(S, 1), max(T, 1), Hq, Hk, D, 0)
    ws.plan_prefill(cu_q, cu_k, None, None, None, 1, Hq, Hk, D, 0, causal=bool(causal),
                    sm_scale=_scale(sm_scale), window_left=int(window_left), soft_cap=float(soft_cap),
                    variant=variant, variant_data=variant_data)
    o, fin = (out, _same) if out is not None else empty_like(q, (T, Hq, D))
    lse, fin_l = empty_like(q, (T, Hq), "float32") if return_lse else (None, None)
    ws.prefill_run(q, k, v, o, lse, stream=stream)
    del ws  # on CUDA this waits for the run before freeing the workspace
    return (fin(o), fin_l(lse)) if return_lse else fin(o)


def _same(a):
    return a


# ---------------------------------------------------------------------------------------------
# Plan / run wrappers
# ---------------------------------------------------------------------------------------------

class _Planned:
    """Shared workspace management: fixed limits (CUDA-graph friendly) or grow on demand."""

    _kind = None

    def __init__(self, device, limits, use_cuda_graph):
        self._dev = parse_device(device)
        self._fixed = limits
        self._graph = bool(use_cuda_graph)
        if self._graph and limits is None:
            raise ValueError("use_cuda_graph=True needs fixed limits (max_batch, ...): a captured run "
                             "must keep its workspace")
        self._ws = None
        self._lim = None
        self._hnd = False
        self._shape = None

    def _forget(self):
        """Called first by every plan(): a plan() that fails anywhere (here or in the library)
        leaves the wrapper unplanned, so a later run() raises instead of running the plan before."""
        self._shape = None
        if self._ws is not None:
            self._ws.invalidate()

    def _need(self, want):
        """Makes sure the workspace covers `want` (a dict of limits); regrows unless fixed."""
        lim = self._lim
        ok = lim is not None and all(lim[k] >= want[k] for k in ("max_batch", "max_total_pages",
                                                                   "max_total_kv", "max_total_qo")) \
            and all(lim[k] == want[k] for k in ("num_qo_heads", "num_kv_heads", "head_dim")) \
            and (lim["page_size"] == want["page_size"] or want["page_size"] == 0)
        if ok:
            return
        if self._fixed is not None:
            over = {k: want[k] for k, cap in self._fixed.items() if cap is not None and want[k] > cap}
            if over or self._ws is not None:
                raise ValueError("plan exceeds the wrapper's fixed limits %s: %s" % (
                    self._lim or self._fixed, over or want))
        new = dict(want)
        if self._fixed is not None:
            for key, val in self._fixed.items():
                if val is not None:
                    new[key] = max(new.get(key, 0), val)
        elif lim is not None:  # grow geometrically so re-planning does not reallocate every step
            for key in ("max_batch", "max_total_pages", "max_total_kv", "max_total_qo"):
                if new[key] > lim[key]:
                    new[key] = max(new[key], 2 * lim[key])
                else:
                    new[key] = lim[key]
        # the old workspace is freed before the new one is allocated; if that fails, the wrapper is
        # left unplanned (not with limits that no workspace backs)
        self._ws = self._lim = self._shape = None
        self._ws = _ext.Workspace(self._dev[0], self._dev[1], self._kind, max(new["max_batch"], 1),
                                  new["max_total_pages"], new["max_total_kv"], new["max_total_qo"],
                                  new["num_qo_heads"], new["num_kv_heads"], new["head_dim"], new["page_size"])
        self._lim = new

    @property
    def plan_info(self):
        """dict: what the last plan decided (kv_chunk_size, num_work, split_kv, ...)."""
        return self._ws.info() if self._ws is not None else {"planned": 0}

    def _outputs(self, q, out, lse, return_lse, rows, hq, d):
        if out is None:
            out, fin = empty_like(q, (rows, hq, d))
        else:
            fin = _same
        fin_l = _same
        if return_lse and lse is None:
            lse, fin_l = empty_like(q, (rows, hq), "float32")
        return out, fin, lse, fin_l


def _pool_pages(paged_kv):
    if isinstance(paged_kv, PagedKVCache):
        raise TypeError("pass cache.layer(l), not the cache itself")
    return paged_kv


class BatchDecodeWrapper(_Planned):
    """Batched decode over a paged KV cache: one query token per request.

        w = kvattn.BatchDecodeWrapper("cuda")            # owns its workspace
        w.plan(indptr, indices, last_page_len, Hq, Hk, D, page_size)   # once per step
        for layer in layers:
            o = w.run(q[layer], kv_pages[layer])         # q [B, Hq, D] -> o [B, Hq, D]

    Limits (max_batch, max_total_pages) fix the workspace size; without them it grows as plans
    need. use_cuda_graph=True (needs the limits) pads the launch so that a run captured in a CUDA
    graph replays correctly after any later plan() within the limits: plan outside the graph,
    run inside. The page table is host memory (lists or CPU arrays; device tensors are copied).
    Not thread-safe: plan() and run() of one wrapper from one thread at a time (a plan() while
    another thread's run() is under way would change the workspace under it).
    """

    _kind = _ext.WS_DECODE

    def __init__(self, device="cpu", max_batch=None, max_total_pages=None, use_cuda_graph=False,
                 kv_layout="NHD"):
        limits = None
        if max_batch is not None or max_total_pages is not None:
            limits = {"max_batch": max_batch, "max_total_pages": max_total_pages}  # None: first plan's
        super().__init__(device, limits, use_cuda_graph)
        self._layout = _layout(kv_layout)

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             num_pages=None, sm_scale=None, window_left=-1, logits_soft_cap=0.0, kv_layout=None,
             no_split=False, fixed_chunk_size=0, algorithm="partial_rowmax", stream=None, variant=None,
             variant_data=None):
        """Plans a decode step. indptr [B+1], indices [indptr[B]], last_page_len [B] (1..page_size,
        ignored for requests with no pages): request b's keys fill pages indices[indptr[b]:
        indptr[b+1]] in order. num_pages: pool size the pages are checked against (default:
        max(indices) + 1). algorithm: 'partial_rowmax' (default) or 'global_rowmax' (CPU and CUDA decode).
        On CUDA the plan is uploaded on `stream` (default: torch's current stream): run on the
        same stream, or order the streams yourself.
        variant: a kvattn.Variant of the wrapper's CUDA device, applied by every run of this plan;
        variant_data: its caller data (a CUDA array or an int device address; None: the Variant's
        own). The wrapper keeps both alive until the next plan(); run(variant_data=) replaces the
        data for one run (decode's query of request b sits at position kv_len(b) - 1).
        A plan() that raises leaves the wrapper with no plan: run() raises until the next one."""
        self._forget()
        if algorithm not in ("partial_rowmax", "global_rowmax"):
            raise ValueError("algorithm must be 'partial_rowmax' or 'global_rowmax', got %r" % (algorithm,))
        hnd = _layout(kv_layout or self._layout) == "HND"
        variant, variant_data = _variant_args(variant, variant_data, self._dev, num_qo_heads)
        indptr, indices, last_page_len = host_ints(indptr), host_ints(indices), host_ints(last_page_len)
        batch = len(indptr) - 1
        total = last_int(indptr)
        if num_pages is None:
            num_pages = max_plus_one(indices)
        self._need({"max_batch": batch, "max_total_pages": total, "max_total_kv": 0, "max_total_qo": 0,
                    "num_qo_heads": num_qo_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim,
                    "page_size": page_size})
        self._hnd = hnd
        self._ws.plan_decode(indptr, indices, last_page_len, int(num_pages), num_qo_heads, num_kv_heads,
                             head_dim, page_size, sm_scale=_scale(sm_scale), window_left=int(window_left),
                             soft_cap=float(logits_soft_cap), hnd=self._hnd, no_split=bool(no_split),
                             graph=self._graph, fixed_chunk=int(fixed_chunk_size),
                             algo=1 if algorithm == "global_rowmax" else 0, stream=stream, variant=variant,
                             variant_data=variant_data)
        self._shape = (batch, num_qo_heads, head_dim)

    def _plan_cache(self, cache, seq_ids, num_qo_heads, sm_scale=None, window_left=-1, logits_soft_cap=0.0,
                    variant=None, variant_data=None):
        self._forget()
        c = cache._cfg
        n = len(seq_ids)
        self._need({"max_batch": n, "max_total_pages": cache._table_pages(seq_ids), "max_total_kv": 0, "max_total_qo": 0,
                    "num_qo_heads": num_qo_heads, "num_kv_heads": c["num_kv_heads"],
                    "head_dim": c["head_dim"], "page_size": c["page_size"]})
        self._ws.plan_decode(seq_ids, None, None, c["num_pages"], num_qo_heads, c["num_kv_heads"],
                             c["head_dim"], c["page_size"], sm_scale=_scale(sm_scale),
                             window_left=int(window_left), soft_cap=float(logits_soft_cap),
                             graph=self._graph, cache=cache._c, variant=variant, variant_data=variant_data)
        self._shape = (n, num_qo_heads, c["head_dim"])

    def run(self, q, paged_kv, out=None, lse=None, return_lse=False, stream=None, variant_data=None):
        """q [B, Hq, D] -> out [B, Hq, D] (and lse float32 [B, Hq] with return_lse or lse=).
        paged_kv: (k_pages, v_pages), an interleaved [P, 2, ...] array, or a KVPages object
        (fastest: the pool is read once). out/lse: preallocated outputs (CUDA graphs).
        variant_data: caller data of the plan's variant for this run only (e.g. per layer)."""
        if out is not None and not return_lse:  # the fast path: nothing to allocate
            ws = self._ws
            if ws is None:
                raise RuntimeError("run() before a successful plan()")
            if variant_data is None:
                ws.decode_run(q, paged_kv, out, lse, stream)
            else:
                ws.decode_run(q, paged_kv, out, lse, stream, variant_data)
            return out if lse is None else (out, lse)
        if self._shape is None:
            raise RuntimeError("run() before a successful plan()")
        out, fin, lse, fin_l = self._outputs(q, out, lse, return_lse, *self._shape)
        self._ws.decode_run(q, _pool_pages(paged_kv), out, lse, stream, variant_data)
        return (fin(out), fin_l(lse)) if lse is not None else fin(out)

    def time_c_call(self, q, paged_kv, out, iters=1000):
        """Median ns of the bare C kva_decode_run with these arrays (no Python in between); the
        host-overhead benchmark subtracts it from the time of run()."""
        return self._ws.time_decode_run(q, paged_kv, out, iters)


class BatchPrefillWrapper(_Planned):
    """Batched prefill: many query tokens per request, keys either ragged contiguous K/V
    (kv_indptr, cu_seqlens style) or a paged cache (chunked prefill over a cached prefix).

        w = kvattn.BatchPrefillWrapper("cpu")
        w.plan(qo_indptr, kv_indptr, Hq, Hk, D, causal=True)                # ragged K/V
        o = w.run(q, k, v)                      # q [T, Hq, D], k/v [S, Hk, D] -> o [T, Hq, D]
        w.plan(qo_indptr, None, Hq, Hk, D, page_size=16, paged_kv_indptr=..., paged_kv_indices=...,
               paged_kv_last_page_len=..., causal=True)                     # paged K/V
        o = w.run(q, kv_pages)

    Limits, use_cuda_graph and threads as in BatchDecodeWrapper (max_batch, max_total_qo,
    max_total_kv, max_total_pages).
    """

    _kind = _ext.WS_PREFILL

    def __init__(self, device="cpu", max_batch=None, max_total_qo=None, max_total_kv=None,
                 max_total_pages=None, use_cuda_graph=False, kv_layout="NHD"):
        limits = None
        if any(x is not None for x in (max_batch, max_total_qo, max_total_kv, max_total_pages)):
            limits = {"max_batch": max_batch, "max_total_qo": max_total_qo, "max_total_kv": max_total_kv,
                      "max_total_pages": max_total_pages}  # None: sized by the first plan
        super().__init__(device, limits, use_cuda_graph)
        self._layout = _layout(kv_layout)

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim, page_size=0,
             paged_kv_indptr=None, paged_kv_indices=None, paged_kv_last_page_len=None, num_pages=None,
             causal=False, sm_scale=None, window_left=-1, logits_soft_cap=0.0, kv_layout=None,
             no_split=False, fixed_chunk_size=0, stream=None, variant=None, variant_data=None):
        """Plans a prefill batch. qo_indptr [B+1]: request b's queries are rows qo_indptr[b] ..
        of q. Keys: kv_indptr [B+1] (ragged k/v rows), or None and the paged table
        (paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, page_size).
        variant, variant_data: a kvattn.Variant and its caller data, as in
        BatchDecodeWrapper.plan (positions per request: keys from 0, queries bottom-right).
        causal=False without a window_left also tells the planner that every query sees all of
        its request's keys (KVA_PLAN_FULL_ATTENTION): on a Hopper GPU it may then cut the longest
        work item so that the launch's last wave ends evenly. A plan() that raises leaves the
        wrapper with no plan: run() raises until the next one."""
        self._forget()
        hnd = _layout(kv_layout or self._layout) == "HND"
        variant, variant_data = _variant_args(variant, variant_data, self._dev, num_qo_heads)
        qo = host_ints(qo_indptr)
        batch = len(qo) - 1
        total_qo = last_int(qo, "qo_indptr")
        paged = kv_indptr is None
        kv = None if paged else host_ints(kv_indptr)
        want = {"max_batch": batch, "max_total_qo": total_qo, "num_qo_heads": num_qo_heads,
                "num_kv_heads": num_kv_heads, "head_dim": head_dim}
        if paged:
            if paged_kv_indptr is None or page_size <= 0:
                raise ValueError("plan: give kv_indptr, or the paged table and page_size")
            a, b, c = host_ints(paged_kv_indptr), host_ints(paged_kv_indices), host_ints(paged_kv_last_page_len)
            if num_pages is None:
                num_pages = max_plus_one(b, "paged_kv_indices")
            want.update(max_total_pages=last_int(a, "paged_kv_indptr"), max_total_kv=0, page_size=page_size)
        else:
            a = b = c = None
            num_pages = 1
            want.update(max_total_pages=0, max_total_kv=last_int(kv, "kv_indptr"), page_size=0)
        self._need(want)
        self._hnd = hnd
        self._ws.plan_prefill(qo, kv, a, b, c, int(num_pages), num_qo_heads, num_kv_heads, head_dim,
                              page_size if paged else 0, causal=bool(causal), sm_scale=_scale(sm_scale),
                              window_left=int(window_left), soft_cap=float(logits_soft_cap), hnd=self._hnd,
                              no_split=bool(no_split), graph=self._graph, fixed_chunk=int(fixed_chunk_size),
                              stream=stream, variant=variant, variant_data=variant_data)
        self._shape = (total_qo, num_qo_heads, head_dim)

    def _plan_cache(self, cache, seq_ids, qo_indptr, num_qo_heads, causal=True, sm_scale=None,
                    window_left=-1, logits_soft_cap=0.0, variant=None, variant_data=None):
        self._forget()
        c = cache._cfg
        total_qo = last_int(qo_indptr, "qo_indptr")
        self._need({"max_batch": len(seq_ids), "max_total_qo": total_qo, "max_total_kv": 0,
                    "max_total_pages": cache._table_pages(seq_ids), "num_qo_heads": num_qo_heads,
                    "num_kv_heads": c["num_kv_heads"], "head_dim": c["head_dim"], "page_size": c["page_size"]})
        self._ws.plan_prefill(qo_indptr, None, None, None, None, c["num_pages"], num_qo_heads,
                              c["num_kv_heads"], c["head_dim"], c["page_size"], causal=bool(causal),
                              sm_scale=_scale(sm_scale), window_left=int(window_left),
                              soft_cap=float(logits_soft_cap), graph=self._graph, cache=cache._c,
                              seq_ids=seq_ids, variant=variant, variant_data=variant_data)
        self._shape = (total_qo, num_qo_heads, c["head_dim"])

    def run(self, q, k, v=None, out=None, lse=None, return_lse=False, stream=None, variant_data=None):
        """Ragged plan: run(q [T, Hq, D], k [S, Hk, D], v [S, Hk, D]). Paged plan: run(q, paged_kv)
        with paged_kv as in BatchDecodeWrapper.run. Returns out [T, Hq, D] (and lse [T, Hq]).
        variant_data: caller data of the plan's variant for this run only."""
        if self._shape is None:
            raise RuntimeError("run() before a successful plan()")
        out, fin, lse, fin_l = self._outputs(q, out, lse, return_lse, *self._shape)
        self._ws.prefill_run(q, _pool_pages(k), v, out, lse, stream, variant_data)
        return (fin(out), fin_l(lse)) if (return_lse or lse is not None) else fin(out)


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------

def merge_states(v, lse, return_lse=True, out=None, lse_out=None, stream=None):
    """Merges partial attention results over disjoint key sets into the result over their union.

    v: [R, N, D] (N partial states per row), lse: float32 [R, N] (natural log).
    Returns v_out [R, D] (and lse_out float32 [R]):  lse_out = log(sum_n exp(lse[:, n])),
    v_out = sum_n exp(lse[:, n] - lse_out) * v[:, n]. States with lse = -inf contribute nothing.
    """
    R, N, D = _dims(v, "v", 3)
    fin = fin_l = _same
    if out is None:
        out, fin = empty_like(v, (R, D))
    if return_lse and lse_out is None:
        lse_out, fin_l = empty_like(v, (R,), "float32")
    _ext.merge_states(v, lse, out, lse_out, stream)
    return (fin(out), fin_l(lse_out)) if return_lse else fin(out)


def block_table_to_csr(block_table, context_lens, page_size):
    """Dense block table (vLLM style) -> CSR page table.

    block_table: [B, max_blocks] host ints (entries past a request's ceil(len/page_size) blocks
    are ignored); context_lens: [B]. Returns (indptr [B+1], indices, last_page_len [B]) as lists
    of int, or numpy/torch int32 arrays when block_table is one.
    """
    indptr, indices, last = _ext.block_table_to_csr(host_ints(block_table), host_ints(context_lens),
                                                    int(page_size))
    fw = framework(block_table)
    if fw == "torch":
        import torch
        return tuple(torch.tensor(x, dtype=torch.int32) for x in (indptr, indices, last))
    if fw == "numpy":
        import numpy
        return tuple(numpy.asarray(x, dtype=numpy.int32) for x in (indptr, indices, last))
    return indptr, indices, last


# ---------------------------------------------------------------------------------------------
# The cache manager
# ---------------------------------------------------------------------------------------------

class PagedKVCache:
    """A paged KV cache: a pool of pages per layer, sequences owning lists of pages, reference
    counts, fork with copy-on-write, all-or-nothing reservation.

        cache = kvattn.PagedKVCache(num_layers=2, num_kv_heads=8, head_dim=128, page_size=16,
                                    num_pages=1024, dtype="float16", device="cuda")
        s = cache.add_sequence()
        cache.reserve([s], [n])                          # n new token slots (NoSpaceError if full)
        for l in range(2): cache.append(l, [s], [n], k_l, v_l)   # k_l, v_l [n, Hk, D]
        indptr, indices, last = cache.page_table([s])
        o = decode_wrapper.run(q, cache.layer(l))

    Every failing call raises KvattnError (NoSpaceError for a full cache) with .status and
    .message, and changes nothing. Not thread-safe: one thread per cache.
    """

    def __init__(self, num_layers, num_kv_heads, head_dim, page_size, num_pages, dtype="float32",
                 device="cpu", layout="NHD", max_sequences=256, max_append_tokens=8192):
        dev = parse_device(device)
        self.dtype = dtype_name(dtype)
        self.layout = _layout(layout, "layout")
        self._cfg = dict(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim,
                         page_size=page_size, num_pages=num_pages, max_sequences=max_sequences,
                         max_append_tokens=max_append_tokens)
        self._c = _ext.Cache(dev[0], dev[1], num_layers, num_kv_heads, head_dim, page_size, num_pages,
                             _DTYPE_CODE[self.dtype], 1 if self.layout == "HND" else 0, max_sequences,
                             max_append_tokens)
        self.device = "cpu" if dev[0] == 0 else "cuda:%d" % dev[1]
        self._layers = [None] * num_layers
        self._decode = self._prefill = None
        self._step_key = None
        self._version = 0  # bumped by every change of sequences or lengths (plan reuse key)

    num_layers = property(lambda self: self._cfg["num_layers"])
    num_kv_heads = property(lambda self: self._cfg["num_kv_heads"])
    head_dim = property(lambda self: self._cfg["head_dim"])
    page_size = property(lambda self: self._cfg["page_size"])
    num_pages = property(lambda self: self._cfg["num_pages"])

    def add_sequence(self):
        """A new empty sequence; returns its id. NoSpaceError when max_sequences are live."""
        self._version += 1
        return self._c.add_sequence()

    def free(self, seq_id):
        """Frees a sequence; pages it shares with others stay theirs."""
        self._version += 1
        self._c.free_sequence(int(seq_id))

    def fork(self, parent):
        """A new sequence with parent's tokens, sharing its pages (copy-on-write); returns its id."""
        self._version += 1
        return self._c.fork(int(parent))

    def reserve(self, seq_ids, num_new):
        """Extends each sequence by num_new[i] token slots. All or nothing: NoSpaceError leaves
        every sequence as it was."""
        self._version += 1
        self._c.reserve(list(seq_ids), list(num_new))

    def append(self, layer, seq_ids, num_new, k, v, stream=None):
        """Writes layer's K/V for the last num_new[i] slots of each sequence (normally the slots
        just reserved). k, v: [sum(num_new), Hk, D] of the cache's dtype and device, rows in
        sequence order."""
        self._c.append(int(layer), list(seq_ids), list(num_new), k, v, stream)

    def seq_len(self, seq_id):
        return self._c.seq_len(int(seq_id))

    def page_table(self, seq_ids):
        """(indptr [n+1], indices, last_page_len [n]) of these sequences, as lists of int."""
        return self._c.page_table(list(seq_ids))

    def stats(self):
        """dict: num_pages, free_pages, used_pages, shared_pages, peak_used_pages, num_sequences,
        num_tokens, cow_copies."""
        return self._c.stats()

    def prefault(self):
        """Commits the whole pool now (CPU: every page touched, stored K/V unchanged; CUDA: nothing
        to do), so no append waits for a first-touch page fault -- for a server that will use the
        pool anyway; a pool sized for the worst case then occupies all of its memory
        (kva_cache_prefault)."""
        self._c.prefault()

    def _table_pages(self, seq_ids):
        ps = self.page_size
        return sum((self._c.seq_len(s) + ps - 1) // ps for s in seq_ids)

    def page_refcount(self, page):
        return self._c.page_refcount(int(page))

    def layer(self, layer):
        """The page pool of one layer as a KVPages object for the wrappers' run()."""
        layer = int(layer)
        if not 0 <= layer < len(self._layers):  # no Python negative indexing: the library refuses it
            return self._c.layer_pages(layer)
        p = self._layers[layer]
        if p is None:
            p = self._layers[layer] = self._c.layer_pages(layer)
        return p

    def pool(self, layer):
        """(k_pool, v_pool) of one layer as zero-copy DLPack views, [num_pages, page_size, Hk, D]
        (NHD) or [num_pages, Hk, page_size, D] (HND), strided: torch.from_dlpack(k_pool),
        numpy.from_dlpack(k_pool), ... Page ids are those of page_table(). The views keep the
        cache alive; on CUDA, order your reads after the appends (same stream)."""
        return self._c.pool_views(int(layer))

    def __repr__(self):
        s = self.stats()
        return "PagedKVCache(%s, %s, %d layers, %d/%d pages used, %d sequences)" % (
            self.device, self.dtype, self.num_layers, s["used_pages"], s["num_pages"], s["num_sequences"])


def _check_cache_step(q, k_new, v_new, cache, layer, T):
    """The shape, dtype and layer mistakes of attention_with_kv_cache, raised before it reserves."""
    Hk, D = cache.num_kv_heads, cache.head_dim
    Tq, Hq, Dq = _dims(q, "q", 3)
    if Tq != T or Dq != D or Hq < 1 or Hq % Hk:
        raise ValueError("q: expected [%d, Hq, %d] (sum(num_new) tokens, Hq a multiple of the cache's %d "
                         "KV heads), got %s" % (T, D, Hk, (Tq, Hq, Dq)))
    for name, x in (("k_new", k_new), ("v_new", v_new)):
        if _dims(x, name, 3) != (T, Hk, D):
            raise ValueError("%s: expected shape %s, got %s" % (name, (T, Hk, D), tuple(x.shape)))
    for name, x in (("q", q), ("k_new", k_new), ("v_new", v_new)):
        if dtype_name(x) != cache.dtype:
            raise TypeError("%s: dtype %s, the cache holds %s" % (name, dtype_name(x), cache.dtype))
    if not 0 <= int(layer) < cache.num_layers:
        raise ValueError("layer %d outside 0..%d" % (int(layer), cache.num_layers - 1))


def attention_with_kv_cache(q, k_new, v_new, cache, seq_ids, layer=0, num_new=None, reserve=None,
                            causal=True, sm_scale=None, window_left=-1, soft_cap=0.0, return_lse=False,
                            variant=None, variant_data=None):
    """Appends new tokens' K/V to the cache, then attends the new queries to everything cached.

    q: [T, Hq, D] rows grouped by sequence in seq_ids order, or [B, n, Hq, D] (n new tokens per
    sequence); k_new, v_new: [T, Hk, D] or [B, n, Hk, D]. num_new: new tokens per sequence
    (default: from a 4-D q, else 1 each, i.e. decode). reserve: extend the sequences by num_new
    before appending (default: only when layer == 0; later layers of the same step reuse the
    slots). Decode steps (all num_new == 1) use the decode kernels, others chunked prefill;
    the plan is made once per step and reused by every layer. Returns out shaped like q.
    variant, variant_data: a kvattn.Variant of the cache's CUDA device and its caller data for
    this call (positions are those of each sequence: 0 .. seq_len-1), as in attention().
    """
    shape4 = None
    Hk, D = cache.num_kv_heads, cache.head_dim
    if len(_shape(q, "q")) == 4:
        B, n, Hq, _ = q.shape
        shape4 = tuple(q.shape)
        for name, x in (("k_new", k_new), ("v_new", v_new)):
            if _dims(x, name, 4) != (B, n, Hk, D):  # not reshaped from another layout
                raise ValueError("%s: expected shape %s (q's B and n, the cache's Hk and D), got %s"
                                 % (name, (B, n, Hk, D), tuple(x.shape)))
        q = q.reshape(B * n, Hq, q.shape[3])
        k_new = k_new.reshape(B * n, Hk, D)
        v_new = v_new.reshape(B * n, Hk, D)
        if num_new is None:
            num_new = [n] * B
    seq_ids = [int(s) for s in seq_ids]
    if num_new is None:
        num_new = [1] * len(seq_ids)
    num_new = [int(x) for x in num_new]
    Hq = q.shape[1]
    # checked before anything changes: the reserve below cannot be undone, so a call that fails
    # after it would leave the sequences longer by slots that hold no K/V
    _variant_args(variant, variant_data, parse_device(cache.device), Hq)
    _check_cache_step(q, k_new, v_new, cache, layer, sum(num_new))
    _check_soft_cap(soft_cap, _scale(sm_scale), D)
    if reserve is None:
        reserve = layer == 0
    if reserve:
        cache.reserve(seq_ids, num_new)
    cache.append(layer, seq_ids, num_new, k_new, v_new)
    key = (cache._version, tuple(seq_ids), tuple(num_new), Hq, causal, sm_scale, window_left, soft_cap, variant)
    ext_variant = None if variant is None else variant._v
    decode = all(x == 1 for x in num_new)
    if cache._step_key != key:
        if decode:
            if cache._decode is None:
                cache._decode = BatchDecodeWrapper(cache.device, kv_layout=cache.layout)
            cache._decode._plan_cache(cache, seq_ids, Hq, sm_scale, window_left, soft_cap, ext_variant)
        else:
            if cache._prefill is None:
                cache._prefill = BatchPrefillWrapper(cache.device, kv_layout=cache.layout)
            qo = [0]
            for x in num_new:
                qo.append(qo[-1] + x)
            cache._prefill._plan_cache(cache, seq_ids, qo, Hq, causal, sm_scale, window_left, soft_cap,
                                       ext_variant)
        cache._step_key = key
    if decode:
        res = cache._decode.run(q, cache.layer(layer), return_lse=return_lse, variant_data=variant_data)
    else:
        res = cache._prefill.run(q, cache.layer(layer), return_lse=return_lse, variant_data=variant_data)
    if shape4 is not None:
        if return_lse:
            return res[0].reshape(shape4), res[1].reshape(shape4[:3])
        return res.reshape(shape4)
    return res
