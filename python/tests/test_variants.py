"""kvattn.Variant: GPU score modifiers compiled at run time with NVRTC (kva_variant in kvattn.h).

CPU part (runs everywhere): ALiBi slopes, a variant on the CPU refused with a clear error (by the
package and by the C library), bad arguments caught before anything runs, variant= on CPU calls,
and a build without CUDA (or without a GPU) raising KvattnError.

CUDA part (skipped unless kvattn.cuda_available() and torch sees a GPU): ALiBi, soft cap written
as a snippet and a document mask against the float64 reference (the same modifier in numpy),
in decode (both algorithms) and prefill (ragged, paged, kva_attention, planned attention,
attention_with_kv_cache), f16 and bf16, with the caller data given every way the API allows
(the Variant's own copy, a referenced CUDA tensor, variant_data= per call, an int address,
run(variant_data=)); a compile error surfacing NVRTC's log; kernels the variant lacks; device
mismatches. Run it on a GPU machine with:  make test  (or PYTHONPATH=build/python
python3 -m pytest -q python/tests/test_variants.py) in a CUDA build.
"""
import os

import numpy as np
import pytest

import kvattn
from kvattn import _ext
from reference import attention_ref, paged_pool

SOFTCAP_SRC = """
float softcap(float score, int32_t q_pos, int32_t kv_pos, int32_t qo_head, const void *user) {
    const float cap = *(const float *)user;   /* one float of caller data */
    (void)q_pos;
    (void)kv_pos;
    (void)qo_head;
    return cap * kva_tanhf(score / cap);
}
"""

DOC_MASK_SRC = """
/* a query sees only keys of its own document; caller data: int32 doc id of every position */
float doc_mask(float score, int32_t q_pos, int32_t kv_pos, int32_t qo_head, const void *user) {
    const int32_t *doc = (const int32_t *)user;
    (void)qo_head;
    return doc[kv_pos] == doc[q_pos] ? score : -INFINITY;
}
"""

BAD_SRC = "float m(float s, int32_t q, int32_t k, int32_t h, const void *u) {\n    return s * not_declared;\n}\n"


# ---------------------------------------------------------------------------------------------
# CPU part
# ---------------------------------------------------------------------------------------------

def test_alibi_slopes():
    np.testing.assert_allclose(kvattn.alibi_slopes(8), [2.0 ** -(h + 1) for h in range(8)], rtol=1e-7)
    # 12 heads: the 8 slopes of 8, then every other slope of 16
    want = [2.0 ** (-8.0 * (h + 1) / 8) for h in range(8)] + [2.0 ** (-8.0 * (2 * i + 1) / 16) for i in range(4)]
    np.testing.assert_allclose(kvattn.alibi_slopes(12), want, rtol=1e-6)
    with pytest.raises(ValueError):
        kvattn.alibi_slopes(0)


def test_variant_on_the_cpu_is_refused():
    with pytest.raises(ValueError, match="CUDA"):
        kvattn.Variant(SOFTCAP_SRC, "softcap", device="cpu")
    with pytest.raises(ValueError, match="CUDA"):
        kvattn.Variant.alibi(8, device="cpu")
    # the C library's own answer on a CPU context (what the package's check stands in front of)
    with pytest.raises(kvattn.KvattnError) as e:
        _ext.Variant(_ext.DEVICE_CPU, 0, SOFTCAP_SRC, "softcap")
    assert e.value.status_name == "KVA_ERR_UNSUPPORTED" and "CUDA" in e.value.message
    with pytest.raises(kvattn.KvattnError) as e:
        _ext.Variant(_ext.DEVICE_CPU, 0, None)  # ALiBi
    assert e.value.status_name == "KVA_ERR_UNSUPPORTED"


def test_bad_arguments_before_the_library():
    """Argument mistakes raise TypeError / ValueError before any device is touched (device='cuda'
    here, so these pass on machines without CUDA too)."""
    with pytest.raises(TypeError):
        kvattn.Variant(b"float f();", "f", device="cuda")
    with pytest.raises(TypeError):
        kvattn.Variant(SOFTCAP_SRC, None, device="cuda")
    with pytest.raises(TypeError):
        kvattn.Variant(SOFTCAP_SRC, "softcap", device="cuda", options="decode")
    for bad in [{"kind": "decode"}, {"kinds": "encode"}, {"head_dim": -1}, {"head_dim": 1.5}]:
        with pytest.raises(ValueError, match="options"):
            kvattn.Variant(SOFTCAP_SRC, "softcap", device="cuda", options=bad)
    with pytest.raises(TypeError, match="int8"):
        kvattn.Variant(SOFTCAP_SRC, "softcap", device="cuda", options={"dtypes": ["int8"]})
    with pytest.raises(ValueError):
        kvattn.Variant.alibi([], device="cuda")
    with pytest.raises(ValueError):
        kvattn.Variant(SOFTCAP_SRC, "softcap", device="tpu")
    with pytest.raises(ValueError, match="NUL"):
        _ext.Variant(_ext.DEVICE_CPU, 0, "float f\0", "f")


def test_bad_options_reach_the_library_checks():
    """The C library checks the function name and options before the device: its messages come
    back as KvattnError (KVA_ERR_INVALID_ARG) even on a CPU context."""
    for args, what in [((SOFTCAP_SRC, "not an identifier"), "identifier"),
                       ((SOFTCAP_SRC, "softcap", 4), "kinds"),
                       ((SOFTCAP_SRC, "softcap", 0, 8), "dtypes"),
                       ((SOFTCAP_SRC, "softcap", 0, 0, -64), "head_dim")]:
        with pytest.raises(kvattn.KvattnError) as e:
            _ext.Variant(_ext.DEVICE_CPU, 0, *args)
        assert e.value.status_name == "KVA_ERR_INVALID_ARG" and what in e.value.message, e.value.message


def _cpu_problem():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((5, 4, 64)).astype(np.float32)
    k = rng.standard_normal((9, 2, 64)).astype(np.float32)
    kp, vp, indptr, indices, last, _, _ = paged_pool(rng, [9, 3], 4, 2, 64)
    return q, k, (kp, vp), indptr, indices, last


def test_variant_keywords_without_a_variant():
    q, k, pages, indptr, indices, last = _cpu_problem()
    calls = [
        lambda **kw: kvattn.attention(q, k, k, **kw),
        lambda **kw: kvattn.attention(q, k, k, planned=False, **kw),
        lambda **kw: kvattn.attention_varlen(q, k, k, [0, 5], [0, 9], **kw),
        lambda **kw: kvattn.BatchDecodeWrapper().plan(indptr, indices, last, 4, 2, 64, 4, **kw),
        lambda **kw: kvattn.BatchPrefillWrapper().plan([0, 5], [0, 9], 4, 2, 64, **kw),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="variant_data= given without variant="):
            call(variant_data=0)
        with pytest.raises(TypeError, match="kvattn.Variant"):
            call(variant="alibi")
    cache = kvattn.PagedKVCache(1, 2, 64, 4, 8)
    s = cache.add_sequence()
    with pytest.raises(ValueError):
        kvattn.attention_with_kv_cache(q, k[:5], k[:5], cache, [s], num_new=[5], variant_data=0)
    assert cache.seq_len(s) == 0  # refused before the cache changed
    # run(variant_data=) needs a plan with a variant
    w = kvattn.BatchDecodeWrapper()
    w.plan(indptr, indices, last, 4, 2, 64, 4)
    with pytest.raises(ValueError, match="no variant"):
        w.run(q[:2], pages, variant_data=0)
    with pytest.raises(ValueError, match="no variant"):
        w.run(q[:2], pages, out=np.empty_like(q[:2]), variant_data=0)


def _stub_cuda_variant():
    """A Variant object as one made on cuda:0 looks to the Python checks (it has no compiled
    code: only for calls that must refuse it before reaching the extension)."""
    v = object.__new__(kvattn.Variant)
    v._dev, v._heads, v._v, v.name, v.device = (1, 0), None, None, "stub", "cuda:0"
    return v


def test_cuda_variant_on_cpu_calls_is_a_value_error():
    q, k, pages, indptr, indices, last = _cpu_problem()
    v = _stub_cuda_variant()
    with pytest.raises(ValueError, match="runs on cuda:0 but this call runs on the CPU"):
        kvattn.attention(q, k, k, variant=v)
    with pytest.raises(ValueError, match="CPU"):
        kvattn.attention(q, k, k, planned=False, variant=v)
    with pytest.raises(ValueError, match="CPU"):
        kvattn.BatchDecodeWrapper("cpu").plan(indptr, indices, last, 4, 2, 64, 4, variant=v)
    with pytest.raises(ValueError, match="CPU"):
        kvattn.BatchPrefillWrapper("cpu").plan([0, 5], [0, 9], 4, 2, 64, variant=v)
    cache = kvattn.PagedKVCache(1, 2, 64, 4, 8)
    s = cache.add_sequence()
    with pytest.raises(ValueError, match="CPU"):
        kvattn.attention_with_kv_cache(q, k[:5], k[:5], cache, [s], num_new=[5], variant=v)
    assert cache.seq_len(s) == 0


@pytest.mark.skipif(kvattn.cuda_available(), reason="a CUDA device is present")
def test_without_cuda_creation_raises_kvattn_error():
    for make in [lambda: kvattn.Variant(SOFTCAP_SRC, "softcap", device="cuda"),
                 lambda: kvattn.Variant.alibi(8, device="cuda:0")]:
        with pytest.raises(kvattn.KvattnError) as e:
            make()
        if not _ext.built_with_cuda:
            assert e.value.status_name == "KVA_ERR_NOT_BUILT", e.value
        else:  # a CUDA build on a machine without a (usable) GPU
            assert e.value.status_name in ("KVA_ERR_DEVICE", "KVA_ERR_NOT_BUILT", "KVA_ERR_UNSUPPORTED"), e.value


# ---------------------------------------------------------------------------------------------
# CUDA part
# ---------------------------------------------------------------------------------------------

try:
    import torch
    CUDA = bool(torch.cuda.is_available()) and kvattn.cuda_available()
except ImportError:  # torch is how these tests put data on the GPU
    torch = None
    CUDA = False
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs kvattn.cuda_available() and torch with CUDA")

HQ, HK, D = 8, 2, 128
# only the kernels these tests run: decode and prefill, f16 and bf16, head dim 128
OPTIONS = {"kinds": ["decode", "prefill"], "dtypes": ["float16", "bfloat16"], "head_dim": D}
TOL = {"float16": (5e-3, 1e-2), "bfloat16": (2e-2, 2e-2)}  # (atol, rtol) of the outputs
LSE_TOL = (5e-3, 1e-3)
MAX_POS = 2048


def npf(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """The three example variants on cuda:0 with their caller data and numpy twins (the
    reference's score_mod). The disk cache lives in a temporary XDG_CACHE_HOME."""
    if not CUDA:
        pytest.skip("needs kvattn.cuda_available() and torch with CUDA")
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("kvattn-cache"))
    try:
        rng = np.random.default_rng(7)
        # ALiBi: the slopes of 8 heads, scaled so that the bias stays comparable with the scores
        # over a thousand positions (as tests/test_cuda_variant.c does); the Variant owns a copy
        slopes = np.float32(np.array(kvattn.alibi_slopes(HQ)) * 0.05)
        alibi = kvattn.Variant.alibi(slopes.tolist(), device="cuda", options=OPTIONS)
        # soft cap as a snippet: the cap is a CUDA tensor the Variant references
        cap = np.float32(rng.uniform(0.5, 3.0))
        cap_t = torch.tensor([cap], dtype=torch.float32, device="cuda")
        softcap = kvattn.Variant(SOFTCAP_SRC, "softcap", device="cuda", options=OPTIONS, data=cap_t)
        # document mask: no data of its own, the doc ids come with each call
        doc = np.zeros(MAX_POS, dtype=np.int32)
        p, i = 0, 0
        while p < MAX_POS:
            n = int(rng.integers(1, 300))
            doc[p:p + n] = i
            p, i = p + n, i + 1
        doc_t = torch.from_numpy(doc).to("cuda")
        mask = kvattn.Variant(DOC_MASK_SRC, "doc_mask", device="cuda", options=OPTIONS)
        yield {
            "alibi": (alibi, None, lambda s, qp, kp, h: s + float(slopes[h]) * (kp - qp)),
            "softcap": (softcap, None, lambda s, qp, kp, h: float(cap) * np.tanh(s / float(cap))),
            "doc_mask": (mask, doc_t, lambda s, qp, kp, h: np.where(doc[kp] == doc[qp], s, -np.inf)),
        }
    finally:
        if old is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = old


def _check(got_o, got_lse, ref_o, ref_lse, dtype, what):
    atol, rtol = TOL[dtype]
    np.testing.assert_allclose(npf(got_o), ref_o, atol=atol, rtol=rtol, err_msg=what)
    if got_lse is not None:
        np.testing.assert_allclose(npf(got_lse), ref_lse, atol=LSE_TOL[0], rtol=LSE_TOL[1], err_msg=what + " lse")


def _cuda(a, dtype):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to("cuda", getattr(torch, dtype))


@needs_cuda
@pytest.mark.parametrize("name", ["alibi", "softcap", "doc_mask"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("algorithm", ["partial_rowmax", "global_rowmax"])
def test_decode(variants, name, dtype, algorithm):
    variant, data, mod = variants[name]
    rng = np.random.default_rng(11)
    lens = [1, 37, 300, 1500]  # the long one is split across work items
    kp, vp, indptr, indices, last, ks, vs = paged_pool(rng, lens, 16, HK, D)
    kp, vp = _cuda(kp, dtype), _cuda(vp, dtype)
    q = _cuda(rng.standard_normal((len(lens), HQ, D)), dtype)
    w = kvattn.BatchDecodeWrapper("cuda")
    w.plan(indptr, indices, last, HQ, HK, D, 16, algorithm=algorithm, variant=variant, variant_data=data)
    o, lse = w.run(q, (kp, vp), return_lse=True)
    torch.cuda.synchronize()
    kq, vq = npf(kp), npf(vp)
    for b, n in enumerate(lens):  # the reference reads the pages of request b, rounded to dtype
        ids = indices[indptr[b]:indptr[b + 1]]
        kb, vb = kq[ids].reshape(-1, HK, D)[:n], vq[ids].reshape(-1, HK, D)[:n]
        ro, rl = attention_ref(npf(q[b:b + 1]), kb, vb, score_mod=mod)
        _check(o[b:b + 1], lse[b:b + 1], ro, rl, dtype, "decode %s %s %s b%d" % (name, dtype, algorithm, b))


def prefill_cases(test):
    """The cases of every prefill test: each example variant, f16 and bf16, causal or not (marks
    applied as stacked decorators would be, so the test ids stay [causal-dtype-name])."""
    for mark in (pytest.mark.parametrize("causal", [False, True]),
                 pytest.mark.parametrize("dtype", ["float16", "bfloat16"]),
                 pytest.mark.parametrize("name", ["alibi", "softcap", "doc_mask"]),
                 needs_cuda):
        test = mark(test)
    return test


def _prefill_problem(rng, dtype):
    qo, kv = [1, 77, 257], [64, 130, 257]  # queries <= keys, as chunked prefill
    q = _cuda(rng.standard_normal((sum(qo), HQ, D)), dtype)
    k = _cuda(rng.standard_normal((sum(kv), HK, D)), dtype)
    v = _cuda(rng.standard_normal((sum(kv), HK, D)), dtype)
    qi, ki = np.concatenate([[0], np.cumsum(qo)]).tolist(), np.concatenate([[0], np.cumsum(kv)]).tolist()
    return qo, kv, qi, ki, q, k, v


def _prefill_ref(q, k, v, qi, ki, causal, mod):
    o, l = [], []
    for b in range(len(qi) - 1):
        ro, rl = attention_ref(npf(q[qi[b]:qi[b + 1]]), npf(k[ki[b]:ki[b + 1]]), npf(v[ki[b]:ki[b + 1]]),
                               causal=causal, score_mod=mod)
        o.append(ro)
        l.append(rl)
    return np.concatenate(o), np.concatenate(l)


@prefill_cases
def test_prefill_ragged_and_dense(variants, name, dtype, causal):
    variant, data, mod = variants[name]
    rng = np.random.default_rng(12)
    qo, kv, qi, ki, q, k, v = _prefill_problem(rng, dtype)
    ro, rl = _prefill_ref(q, k, v, qi, ki, causal, mod)
    what = "%s %s causal=%s" % (name, dtype, causal)
    # BatchPrefillWrapper, ragged K/V
    w = kvattn.BatchPrefillWrapper("cuda")
    w.plan(qi, ki, HQ, HK, D, causal=causal, variant=variant, variant_data=data)
    o, lse = w.run(q, k, v, return_lse=True)
    torch.cuda.synchronize()
    _check(o, lse, ro, rl, dtype, "ragged " + what)
    # attention_varlen (a temporary plan)
    o, lse = kvattn.attention_varlen(q, k, v, qi, ki, causal=causal, return_lse=True, variant=variant,
                                     variant_data=data)
    torch.cuda.synchronize()
    _check(o, lse, ro, rl, dtype, "varlen " + what)
    # kva_attention (planned=False) and the planned attention of one sequence: request 1
    b = 1
    sl_q, sl_k = slice(qi[b], qi[b + 1]), slice(ki[b], ki[b + 1])
    for planned in (False, True):
        o, lse = kvattn.attention(q[sl_q], k[sl_k], v[sl_k], causal=causal, return_lse=True, planned=planned,
                                  variant=variant, variant_data=data)
        torch.cuda.synchronize()
        _check(o, lse, ro[sl_q], rl[sl_q], dtype, "attention planned=%s %s" % (planned, what))


@prefill_cases
def test_prefill_paged(variants, name, dtype, causal):
    variant, data, mod = variants[name]
    rng = np.random.default_rng(13)
    qo, kv = [1, 77, 257], [64, 130, 257]
    kp, vp, indptr, indices, last, ks, vs = paged_pool(rng, kv, 16, HK, D)
    kp, vp = _cuda(kp, dtype), _cuda(vp, dtype)
    q = _cuda(rng.standard_normal((sum(qo), HQ, D)), dtype)
    qi = np.concatenate([[0], np.cumsum(qo)]).tolist()
    w = kvattn.BatchPrefillWrapper("cuda")
    w.plan(qi, None, HQ, HK, D, page_size=16, paged_kv_indptr=indptr, paged_kv_indices=indices,
           paged_kv_last_page_len=last, causal=causal, variant=variant, variant_data=data)
    o, lse = w.run(q, (kp, vp), return_lse=True)
    torch.cuda.synchronize()
    kq, vq = npf(kp), npf(vp)
    for b, n in enumerate(kv):
        ids = indices[indptr[b]:indptr[b + 1]]
        kb, vb = kq[ids].reshape(-1, HK, D)[:n], vq[ids].reshape(-1, HK, D)[:n]
        ro, rl = attention_ref(npf(q[qi[b]:qi[b + 1]]), kb, vb, causal=causal, score_mod=mod)
        _check(o[qi[b]:qi[b + 1]], lse[qi[b]:qi[b + 1]], ro, rl, dtype,
               "paged %s %s causal=%s b%d" % (name, dtype, causal, b))


@needs_cuda
def test_caller_data_per_call(variants):
    """variant_data as an int address, per run() over the plan's, and through
    attention_with_kv_cache; the wrapper keeps a temporary Variant alive."""
    dtype = "bfloat16"
    rng = np.random.default_rng(14)
    qo, kv, qi, ki, q, k, v = _prefill_problem(rng, dtype)
    mask, doc_t, mod = variants["doc_mask"]
    ro, rl = _prefill_ref(q, k, v, qi, ki, True, mod)
    o = kvattn.attention_varlen(q, k, v, qi, ki, causal=True, variant=mask, variant_data=doc_t.data_ptr())
    torch.cuda.synchronize()
    _check(o, None, ro, rl, dtype, "doc mask, int address")
    # the soft-cap snippet with the plan's cap, then another cap for one run
    softcap = variants["softcap"][0]
    w = kvattn.BatchPrefillWrapper("cuda")
    w.plan(qi, ki, HQ, HK, D, causal=True, variant=softcap)
    for cap in (None, 0.7):
        vd = None if cap is None else torch.tensor([cap], dtype=torch.float32, device="cuda")
        o = w.run(q, k, v, variant_data=vd)
        torch.cuda.synchronize()
        m = variants["softcap"][2] if cap is None else (lambda s, qp, kp, h: 0.7 * np.tanh(s / 0.7))
        r, _ = _prefill_ref(q, k, v, qi, ki, True, m)
        _check(o, None, r, None, dtype, "softcap run(variant_data=%s)" % cap)
    # built-in soft cap and the snippet agree
    cap = float(npf(softcap.data)[0])
    builtin = kvattn.attention_varlen(q, k, v, qi, ki, causal=True, soft_cap=cap)
    snippet = kvattn.attention_varlen(q, k, v, qi, ki, causal=True, variant=softcap)
    torch.cuda.synchronize()
    torch.testing.assert_close(snippet.float(), builtin.float(), atol=2e-2, rtol=2e-2)
    # a Variant the caller dropped after plan(): the wrapper holds it (and its slopes)
    slopes = (np.array(kvattn.alibi_slopes(HQ)) * 0.05).astype(np.float32)
    w.plan(qi, ki, HQ, HK, D, causal=True, variant=kvattn.Variant.alibi(slopes.tolist(), options=OPTIONS))
    import gc
    gc.collect()
    o = w.run(q, k, v)
    torch.cuda.synchronize()
    r, _ = _prefill_ref(q, k, v, qi, ki, True, lambda s, qp, kp, h: s + float(slopes[h]) * (kp - qp))
    _check(o, None, r, None, dtype, "alibi held by the wrapper")
    # the cache: prefill 2 sequences, then one decode step, with ALiBi from a CUDA tensor of slopes
    alibi_t = kvattn.Variant.alibi(torch.from_numpy(slopes).cuda(), options=OPTIONS)
    cache = kvattn.PagedKVCache(1, HK, D, 16, 64, dtype=torch.bfloat16, device="cuda")
    seqs = [cache.add_sequence(), cache.add_sequence()]
    kk = _cuda(rng.standard_normal((150, HK, D)), dtype)
    vv = _cuda(rng.standard_normal((150, HK, D)), dtype)
    qq = _cuda(rng.standard_normal((150, HQ, D)), dtype)
    alibi_mod = lambda s, qp, kp, h: s + float(slopes[h]) * (kp - qp)  # noqa: E731
    o = kvattn.attention_with_kv_cache(qq[:148], kk[:148], vv[:148], cache, seqs, num_new=[100, 48],
                                       variant=alibi_t)
    o2 = kvattn.attention_with_kv_cache(qq[148:], kk[148:], vv[148:], cache, seqs, variant=alibi_t)
    torch.cuda.synchronize()
    for rows, keys, got in [((0, 100), [(0, 100)], o[:100]), ((100, 148), [(100, 148)], o[100:148]),
                            ((148, 149), [(0, 100), (148, 149)], o2[:1]),
                            ((149, 150), [(100, 148), (149, 150)], o2[1:])]:
        ksel = np.concatenate([npf(kk[a:b]) for a, b in keys])
        vsel = np.concatenate([npf(vv[a:b]) for a, b in keys])
        r, _ = attention_ref(npf(qq[rows[0]:rows[1]]), ksel, vsel, causal=True, score_mod=alibi_mod)
        _check(got, None, r, None, dtype, "attention_with_kv_cache rows %s" % (rows,))


@needs_cuda
def test_compile_error_shows_nvrtc_log():
    with pytest.raises(kvattn.KvattnError) as e:
        kvattn.Variant(BAD_SRC, "m", device="cuda", options=OPTIONS)
    assert e.value.status_name == "KVA_ERR_INVALID_ARG"
    assert "not_declared" in e.value.message and "variant.cu(2)" in e.value.message, e.value.message
    with pytest.raises(kvattn.KvattnError) as e:
        kvattn.Variant(SOFTCAP_SRC, "not_there", device="cuda", options=OPTIONS)
    assert e.value.status_name == "KVA_ERR_INVALID_ARG"


@needs_cuda
def test_stats_errors_and_devices(variants):
    alibi = variants["alibi"][0]
    st = alibi.stats()
    assert set(st) == {"modules", "compiled", "disk_hits", "context_hits", "compile_ms", "total_ms"}
    assert st["modules"] >= 4 and st["compiled"] + st["disk_hits"] + st["context_hits"] == st["modules"]
    again = kvattn.Variant.alibi(kvattn.alibi_slopes(4), options=OPTIONS)  # the context's modules
    assert again.stats()["context_hits"] == again.stats()["modules"] and again.stats()["compiled"] == 0
    rng = np.random.default_rng(15)
    q = _cuda(rng.standard_normal((20, HQ, D)), "bfloat16")
    # 4 slopes for 8 query heads
    with pytest.raises(ValueError, match="4 slopes"):
        kvattn.attention(q, q[:, :HK], q[:, :HK], variant=again)
    # kernels the variant was not compiled for: float32, head dim 64
    q32 = q.float()
    with pytest.raises(kvattn.KvattnError) as e:
        kvattn.attention(q32, q32[:, :HK], q32[:, :HK], planned=False, variant=alibi)
    assert e.value.status_name == "KVA_ERR_UNSUPPORTED" and "not compiled for" in e.value.message, e.value.message
    q64 = q[:, :, :64].contiguous()
    with pytest.raises(kvattn.KvattnError) as e:
        kvattn.attention(q64, q64[:, :HK].contiguous(), q64[:, :HK].contiguous(), variant=alibi)
    assert e.value.status_name == "KVA_ERR_UNSUPPORTED" and "not compiled for" in e.value.message, e.value.message
    # a CUDA variant with host arrays: refused by the package and by the extension
    qh = npf(q).astype(np.float32)
    with pytest.raises(ValueError, match="CPU"):
        kvattn.attention(qh, qh[:, :HK], qh[:, :HK], variant=alibi)
    with pytest.raises(ValueError, match="CPU"):
        _ext.attention(qh, qh[:, :HK], qh[:, :HK], np.empty_like(qh), variant=alibi._v)
    # caller data in host memory
    with pytest.raises(ValueError, match="host memory"):
        kvattn.attention(q, q[:, :HK], q[:, :HK], variant=variants["doc_mask"][0],
                         variant_data=np.zeros(MAX_POS, np.int32))
    if torch.cuda.device_count() > 1:
        q1 = q.to("cuda:1")
        with pytest.raises(ValueError, match="cuda:1"):
            kvattn.attention(q1, q1[:, :HK], q1[:, :HK], variant=alibi)
