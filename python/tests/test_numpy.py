"""The kvattn package on the CPU with numpy arrays, against the float64 reference."""
import numpy as np
import pytest

import kvattn
from reference import attention_ref, paged_pool, tol


def rnd(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq,lk", [(1, 1), (7, 7), (37, 50), (64, 64), (5, 129)])
def test_attention(dtype, causal, lq, lk):
    rng = np.random.default_rng(lq * 131 + lk)
    q, k, v = rnd(rng, (lq, 8, 64), dtype), rnd(rng, (lk, 2, 64), dtype), rnd(rng, (lk, 2, 64), dtype)
    o, lse = kvattn.attention(q, k, v, causal=causal, return_lse=True)
    ro, rl = attention_ref(q, k, v, causal=causal)
    assert o.shape == q.shape and o.dtype == q.dtype and lse.dtype == np.float32
    np.testing.assert_allclose(o.astype(np.float64), ro, atol=tol(dtype), rtol=tol(dtype))
    np.testing.assert_allclose(lse, rl, atol=tol(dtype), rtol=tol(dtype))


def test_attention_variants():
    rng = np.random.default_rng(1)
    q, k, v = rnd(rng, (33, 4, 128)), rnd(rng, (80, 4, 128)), rnd(rng, (80, 4, 128))
    for kw in [dict(sm_scale=0.05), dict(soft_cap=3.0), dict(causal=True, window_left=16),
               dict(causal=True, window_left=0, soft_cap=1.5, sm_scale=0.2)]:
        o = kvattn.attention(q, k, v, **kw)
        ro, _ = attention_ref(q, k, v, **kw)
        np.testing.assert_allclose(o, ro, atol=2e-4, rtol=2e-4, err_msg=str(kw))



def test_sm_scale_must_be_positive():
    """The library reads sm_scale <= 0 as 1/sqrt(D); an explicit 0 or negative scale is refused
    rather than silently replaced by the default (and a cache step fails before it reserves)."""
    rng = np.random.default_rng(19)
    q, k = rnd(rng, (3, 4, 64)), rnd(rng, (5, 2, 64))
    w = kvattn.BatchDecodeWrapper()
    c = kvattn.PagedKVCache(1, 2, 64, page_size=4, num_pages=8)
    s = c.add_sequence()
    for bad in (0.0, -0.125, float("nan"), float("inf")):
        for planned in (True, False):
            with pytest.raises(ValueError, match="sm_scale"):
                kvattn.attention(q, k, k, sm_scale=bad, planned=planned)
        with pytest.raises(ValueError, match="sm_scale"):
            w.plan([0, 1], [0], [1], 4, 2, 64, 4, sm_scale=bad)
        with pytest.raises(ValueError, match="sm_scale"):
            kvattn.attention_with_kv_cache(q, k[:3], k[:3], c, [s], num_new=[3], sm_scale=bad)
    with pytest.raises(ValueError, match="soft_cap"):
        kvattn.attention_with_kv_cache(q, k[:3], k[:3], c, [s], num_new=[3], soft_cap=float("nan"))
    # caps the library refuses (kernel constants outside the normal floats): refused before the
    # cache changes, as the C call would refuse them after the reserve
    for cap, scale in ((1e-39, None), (1.2e-38, 1e4), (3e38, None), (1e38, None)):
        with pytest.raises(ValueError, match="soft_cap"):
            kvattn.attention_with_kv_cache(q, k[:3], k[:3], c, [s], num_new=[3], soft_cap=cap, sm_scale=scale)
        with pytest.raises(kvattn.KvattnError, match="logits_soft_cap"):
            kvattn.attention(q, k, k, soft_cap=cap, sm_scale=scale)
    assert c.seq_len(s) == 0
    o = kvattn.attention(q, k, k, sm_scale=0.3)
    np.testing.assert_allclose(o, attention_ref(q, k, k, sm_scale=0.3)[0], atol=2e-4, rtol=2e-4)

def test_attention_batched_4d_and_strided_input():
    rng = np.random.default_rng(2)
    q, k, v = rnd(rng, (3, 9, 8, 64)), rnd(rng, (3, 20, 4, 64)), rnd(rng, (3, 20, 4, 64))
    o = kvattn.attention(q, k, v, causal=True)
    assert o.shape == q.shape
    for b in range(3):
        ro, _ = attention_ref(q[b], k[b], v[b], causal=True)
        np.testing.assert_allclose(o[b], ro, atol=2e-4, rtol=2e-4)
    # a non-contiguous token stride (a slice of a wider buffer) is read through its strides
    big = rnd(rng, (20, 8, 64))
    ks = big[:, ::2]
    o = kvattn.attention(q[0], ks, ks)
    ro, _ = attention_ref(q[0], ks, ks)
    np.testing.assert_allclose(o, ro, atol=2e-4, rtol=2e-4)



@pytest.mark.parametrize("planned", [True, False])
def test_attention_4d_k_v_shapes_must_match(planned):
    """A 4-D v in another layout ([B, Hk, Lk, D], as SDPA takes) or another batch is refused,
    not reshaped into k's [B * Lk, Hk, D]."""
    rng = np.random.default_rng(15)
    q, k, v = rnd(rng, (2, 10, 8, 64)), rnd(rng, (2, 20, 2, 64)), rnd(rng, (2, 20, 2, 64))
    for kk, vv in [(k, np.ascontiguousarray(v.transpose(0, 2, 1, 3))), (k, v.reshape(4, 10, 2, 64)),
                   (k.reshape(1, 40, 2, 64), v.reshape(1, 40, 2, 64)),
                   (np.concatenate([k, k]), np.concatenate([v, v]))]:
        with pytest.raises(ValueError, match="k, v: expected equal shapes"):
            kvattn.attention(q, kk, vv, planned=planned)


@pytest.mark.parametrize("planned", [True, False])
def test_attention_4d_out_is_written(planned):
    """out= of a 4-D call receives the result (and is returned) also when its B and Lq
    dimensions cannot be merged into one token dimension without a copy."""
    rng = np.random.default_rng(16)
    q, k, v = rnd(rng, (2, 10, 8, 64)), rnd(rng, (2, 20, 2, 64)), rnd(rng, (2, 20, 2, 64))
    ref = np.stack([attention_ref(q[b], k[b], v[b], causal=True)[0] for b in range(2)])
    for out in [np.zeros_like(q), np.zeros((10, 2, 8, 64), np.float32).transpose(1, 0, 2, 3)]:
        r, lse = kvattn.attention(q, k, v, causal=True, out=out, return_lse=True, planned=planned)
        assert r is out and lse.shape == (2, 10, 8)
        np.testing.assert_allclose(out, ref, atol=2e-4, rtol=2e-4)
    with pytest.raises((ValueError, TypeError), match="out"):
        kvattn.attention(q, k, v, out=np.zeros((10, 2, 8, 64), np.float32), planned=planned)
    with pytest.raises(TypeError, match="out"):
        kvattn.attention(q, k, v, out=np.zeros_like(q, dtype=np.float16), planned=planned)

@pytest.mark.parametrize("causal", [False, True])
def test_attention_unplanned_dense(causal):
    """planned=False: kva_attention (no plan, no workspace), 3-D, 4-D, LSE, variants, out=."""
    rng = np.random.default_rng(11)
    q, k, v = rnd(rng, (37, 8, 64)), rnd(rng, (50, 2, 64)), rnd(rng, (50, 2, 64))
    o, lse = kvattn.attention(q, k, v, causal=causal, return_lse=True, planned=False)
    ro, rl = attention_ref(q, k, v, causal=causal)
    np.testing.assert_allclose(o, ro, atol=2e-4, rtol=2e-4)
    np.testing.assert_allclose(lse, rl, atol=2e-4, rtol=2e-4)
    for kw in [dict(sm_scale=0.05, soft_cap=3.0), dict(window_left=16)]:
        out = np.full_like(q, np.nan)
        r = kvattn.attention(q, k, v, causal=causal, out=out, planned=False, **kw)
        assert r is out
        np.testing.assert_allclose(out, attention_ref(q, k, v, causal=causal, **kw)[0], atol=2e-4, rtol=2e-4)
    qb, kb, vb = rnd(rng, (3, 9, 8, 64)), rnd(rng, (3, 20, 4, 64)), rnd(rng, (3, 20, 4, 64))
    o, lse = kvattn.attention(qb, kb, vb, causal=causal, return_lse=True, planned=False)
    assert o.shape == qb.shape and lse.shape == (3, 9, 8)
    for b in range(3):
        ro, rl = attention_ref(qb[b], kb[b], vb[b], causal=causal)
        np.testing.assert_allclose(o[b], ro, atol=2e-4, rtol=2e-4)
        np.testing.assert_allclose(lse[b], rl, atol=2e-4, rtol=2e-4)
    # the same numbers as the planned path
    np.testing.assert_allclose(o, kvattn.attention(qb, kb, vb, causal=causal), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        kvattn.attention(q, rnd(rng, (50, 3, 64)), rnd(rng, (50, 3, 64)), planned=False)
    with pytest.raises(ValueError):
        kvattn.attention(q, k[:, :, :32], v, planned=False)



def test_empty_arrays_are_accepted():
    """Arrays without elements (numpy exports their strides as 0): empty batches, no keys."""
    z = lambda *s: np.zeros(s, np.float32)
    q, k = np.ones((3, 4, 64), np.float32), np.ones((5, 2, 64), np.float32)
    for planned in (True, False):
        o, lse = kvattn.attention(z(0, 4, 64), k, k, return_lse=True, planned=planned)
        assert o.shape == (0, 4, 64) and lse.shape == (0, 4)
        o, lse = kvattn.attention(q, z(0, 2, 64), z(0, 2, 64), return_lse=True, planned=planned)
        assert np.all(o == 0) and np.all(np.isneginf(lse))
        assert kvattn.attention(z(0, 3, 4, 64), z(0, 5, 2, 64), z(0, 5, 2, 64), planned=planned).shape == (0, 3, 4, 64)
    w = kvattn.BatchDecodeWrapper()
    w.plan([0], [], [], 4, 2, 64, 4)
    o, lse = w.run(z(0, 4, 64), (z(3, 4, 2, 64), z(3, 4, 2, 64)), return_lse=True)
    assert o.shape == (0, 4, 64) and lse.shape == (0, 4)
    p = kvattn.BatchPrefillWrapper()
    p.plan([0], [0], 4, 2, 64)
    assert p.run(z(0, 4, 64), z(0, 2, 64), z(0, 2, 64)).shape == (0, 4, 64)
    vo, lo = kvattn.merge_states(z(0, 3, 64), z(0, 3))
    assert vo.shape == (0, 64) and lo.shape == (0,)
    c = kvattn.PagedKVCache(1, 2, 64, page_size=4, num_pages=8)
    s = c.add_sequence()
    assert kvattn.attention_with_kv_cache(z(0, 4, 64), z(0, 2, 64), z(0, 2, 64), c, [s], num_new=[0]).shape == (0, 4, 64)

def test_attention_varlen():
    rng = np.random.default_rng(3)
    qlens, klens = [5, 1, 17, 0, 9], [5, 30, 17, 4, 40]
    cu_q, cu_k = np.concatenate([[0], np.cumsum(qlens)]), np.concatenate([[0], np.cumsum(klens)])
    q, k, v = rnd(rng, (cu_q[-1], 8, 64)), rnd(rng, (cu_k[-1], 2, 64)), rnd(rng, (cu_k[-1], 2, 64))
    o, lse = kvattn.attention_varlen(q, k, v, cu_q.astype(np.int32), list(cu_k), causal=True, return_lse=True)
    for b in range(len(qlens)):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        ro, rl = attention_ref(q[sq], k[sk], v[sk], causal=True)
        np.testing.assert_allclose(o[sq], ro, atol=2e-4, rtol=2e-4)
        np.testing.assert_allclose(lse[sq], rl, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 7, 16])
def test_decode_wrapper(layout, page_size):
    rng = np.random.default_rng(page_size)
    lens = [1, 33, 200, 16, 5, 0, 64]
    hnd = layout == "HND"
    kp, vp, indptr, indices, last, ks, vs = paged_pool(rng, lens, page_size, 2, 64, hnd=hnd)
    q = rnd(rng, (len(lens), 8, 64))
    w = kvattn.BatchDecodeWrapper("cpu", kv_layout=layout)
    w.plan(indptr, indices, last, 8, 2, 64, page_size, num_pages=kp.shape[0])
    o, lse = w.run(q, (kp, vp), return_lse=True)
    for b, n in enumerate(lens):
        if n == 0:
            assert np.all(o[b] == 0) and np.all(np.isneginf(lse[b]))
            continue
        ro, rl = attention_ref(q[b:b + 1], ks[b], vs[b])
        np.testing.assert_allclose(o[b:b + 1], ro, atol=2e-4, rtol=2e-4)
        np.testing.assert_allclose(lse[b:b + 1], rl, atol=2e-4, rtol=2e-4)
    # the same through a KVPages object, an out= buffer and the global-rowmax algorithm
    pages = kvattn.KVPages(kp, vp, hnd=hnd)
    out = np.empty_like(q)
    w.plan(indptr, indices, last, 8, 2, 64, page_size, algorithm="global_rowmax", fixed_chunk_size=128)
    assert w.run(q, pages, out=out) is out
    np.testing.assert_allclose(out, o, atol=2e-5, rtol=2e-5)


def test_decode_interleaved_pool_and_soft_cap():
    rng = np.random.default_rng(5)
    P, ps, hk, d = 12, 4, 2, 64
    pool = rnd(rng, (P, 2, ps, hk, d))
    indptr, indices, last = [0, 3, 5], [4, 0, 9, 11, 2], [2, 4]
    q = rnd(rng, (2, 4, d))
    w = kvattn.BatchDecodeWrapper()
    w.plan(indptr, indices, last, 4, hk, d, ps, num_pages=P, logits_soft_cap=2.0, sm_scale=0.3)
    o = w.run(q, pool)
    for b in range(2):
        ids = indices[indptr[b]:indptr[b + 1]]
        n = (len(ids) - 1) * ps + last[b]
        kk = pool[ids, 0].reshape(-1, hk, d)[:n]
        vv = pool[ids, 1].reshape(-1, hk, d)[:n]
        ro, _ = attention_ref(q[b:b + 1], kk, vv, soft_cap=2.0, sm_scale=0.3)
        np.testing.assert_allclose(o[b:b + 1], ro, atol=2e-4, rtol=2e-4)


def test_decode_wrapper_limits_and_growth():
    rng = np.random.default_rng(6)
    w = kvattn.BatchDecodeWrapper("cpu", max_batch=2, max_total_pages=8)
    kp, vp, indptr, indices, last, _, _ = paged_pool(rng, [10, 20, 30], 4, 1, 64)
    with pytest.raises(ValueError, match="fixed limits"):
        w.plan(indptr, indices, last, 1, 1, 64, 4)
    grow = kvattn.BatchDecodeWrapper("cpu")
    for lens in ([3], [10, 20, 30], [1] * 40, [500, 3]):
        kp, vp, indptr, indices, last, ks, vs = paged_pool(rng, lens, 4, 1, 64)
        q = rnd(rng, (len(lens), 1, 64))
        grow.plan(indptr, indices, last, 1, 1, 64, 4)
        o = grow.run(q, (kp, vp))
        ro, _ = attention_ref(q[-1:], ks[-1], vs[-1])
        np.testing.assert_allclose(o[-1:], ro, atol=2e-4, rtol=2e-4)
    assert grow.plan_info["planned"] == 1 and grow.plan_info["max_batch"] >= 40



def test_wrapper_usable_after_a_failed_plan():
    """A plan whose workspace cannot be made (head_dim 200 on the CPU) leaves the wrapper
    unplanned, not holding limits without a workspace; run(out=) before a plan says so."""
    rng = np.random.default_rng(18)
    kp, vp, indptr, indices, last, ks, vs = paged_pool(rng, [5, 9], 4, 2, 64)
    q = rnd(rng, (2, 4, 64))
    w = kvattn.BatchDecodeWrapper()
    with pytest.raises(RuntimeError, match="before a successful plan"):
        w.run(q, (kp, vp), out=np.empty_like(q))
    w.plan(indptr, indices, last, 4, 2, 64, 4)
    with pytest.raises(kvattn.KvattnError):
        w.plan(indptr, indices, last, 4, 2, 200, 4)
    for call in (lambda: w.run(q, (kp, vp)), lambda: w.run(q, (kp, vp), out=np.empty_like(q))):
        with pytest.raises(RuntimeError, match="before a successful plan"):
            call()
    w.plan(indptr, indices, last, 4, 2, 64, 4)
    o = w.run(q, (kp, vp))
    np.testing.assert_allclose(o[1:], attention_ref(q[1:], ks[1], vs[1])[0], atol=2e-4, rtol=2e-4)


def test_wrapper_layout_and_algorithm_typos_are_refused():
    """A misspelt kv_layout or algorithm raises instead of meaning NHD / partial_rowmax."""
    with pytest.raises(ValueError, match="kv_layout"):
        kvattn.BatchDecodeWrapper("cpu", kv_layout="HDN")
    with pytest.raises(ValueError, match="kv_layout"):
        kvattn.BatchPrefillWrapper("cpu", kv_layout="bogus")
    w = kvattn.BatchDecodeWrapper("cpu", kv_layout="hnd")
    with pytest.raises(ValueError, match="kv_layout"):
        w.plan([0, 1], [0], [1], 4, 2, 64, 4, kv_layout="NDH")
    with pytest.raises(ValueError, match="algorithm"):
        w.plan([0, 1], [0], [1], 4, 2, 64, 4, algorithm="global-rowmax")
    p = kvattn.BatchPrefillWrapper("cpu")
    with pytest.raises(ValueError, match="kv_layout"):
        p.plan([0, 1], None, 4, 2, 64, page_size=4, paged_kv_indptr=[0, 1], paged_kv_indices=[0],
               paged_kv_last_page_len=[1], kv_layout="HDN")

def test_errors_carry_status_and_message():
    w = kvattn.BatchDecodeWrapper()
    with pytest.raises(kvattn.KvattnError) as e:
        w.plan([0, 2], [0, 9000], [3], 4, 2, 64, 16, num_pages=256)
    assert e.value.status_name == "KVA_ERR_OUT_OF_RANGE" and e.value.status == 4
    assert "9000" in e.value.message
    with pytest.raises(RuntimeError, match="before a successful plan"):
        w.run(np.zeros((1, 4, 64), np.float32), (np.zeros((1, 16, 2, 64), np.float32),) * 2)
    w.plan([0, 1], [0], [3], 4, 2, 64, 16)
    pool = np.zeros((1, 16, 2, 64), np.float32)
    with pytest.raises(TypeError, match="dtype"):
        w.run(np.zeros((1, 4, 64), np.int32), (pool, pool))
    with pytest.raises(ValueError, match="shape"):
        w.run(np.zeros((2, 4, 64), np.float32), (pool, pool))
    with pytest.raises(TypeError):
        kvattn.attention([1, 2], [1], [1])



def test_refused_lse_array_is_released():
    """An lse array refused for its shape is not kept alive (its DLPack export is released)."""
    import sys
    q, k = np.ones((3, 4, 64), np.float32), np.ones((5, 2, 64), np.float32)
    w = kvattn.BatchDecodeWrapper()
    w.plan([0, 1, 2, 3], [0, 1, 2], [4, 4, 4], 4, 2, 64, 4)
    pool = np.zeros((3, 4, 2, 64), np.float32)
    bad = np.zeros((3, 5), np.float32)  # expected (3, 4) everywhere below
    calls = [lambda: w.run(q, (pool, pool), out=np.empty_like(q), lse=bad),
             lambda: kvattn._ext.attention(q, k, k, np.empty_like(q), bad),
             lambda: kvattn.merge_states(np.ones((3, 4, 64), np.float32), bad)]
    for call in calls:
        before = sys.getrefcount(bad)
        for _ in range(20):
            with pytest.raises(ValueError, match="lse"):
                call()
        assert sys.getrefcount(bad) == before


def test_read_only_outputs_are_refused():
    """out=, lse=, merge_states' out= / lse_out= must be writable (numpy exports the flag)."""
    def ro(a):
        a.setflags(write=False)
        return a
    q, k = np.ones((3, 4, 64), np.float32), np.ones((5, 2, 64), np.float32)
    w = kvattn.BatchDecodeWrapper()
    w.plan([0, 1, 2, 3], [0, 1, 2], [4, 4, 4], 4, 2, 64, 4)
    pool = np.ones((3, 4, 2, 64), np.float32)
    lse = ro(np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match="lse: read-only"):
        w.run(q, (pool, pool), out=np.empty_like(q), lse=lse)
    with pytest.raises(ValueError, match="lse: read-only"):
        kvattn._ext.attention(q, k, k, np.empty_like(q), lse)
    with pytest.raises(ValueError, match="out: read-only"):
        w.run(q, (pool, pool), out=ro(np.zeros_like(q)))
    v, l = np.ones((3, 2, 64), np.float32), np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="v_out: read-only"):
        kvattn.merge_states(v, l, out=ro(np.zeros((3, 64), np.float32)))
    with pytest.raises(ValueError, match="lse_out: read-only"):
        kvattn.merge_states(v, l, lse_out=ro(np.zeros(3, np.float32)))
    assert not lse.any()
    vo, lo = kvattn.merge_states(v, ro(l.copy()))  # inputs may be read-only
    np.testing.assert_allclose(vo, 1, rtol=1e-6)

def test_prefill_wrapper_ragged_and_paged():
    rng = np.random.default_rng(7)
    qlens, klens = [3, 16, 1], [20, 16, 45]
    # paged: chunked prefill of the last qlens[b] tokens over a cached prefix
    kp, vp, indptr, indices, last, ks, vs = paged_pool(rng, klens, 8, 2, 64)
    qo = [0] + list(np.cumsum(qlens))
    q = rnd(rng, (qo[-1], 8, 64))
    w = kvattn.BatchPrefillWrapper("cpu")
    w.plan(qo, None, 8, 2, 64, page_size=8, paged_kv_indptr=indptr, paged_kv_indices=indices,
           paged_kv_last_page_len=last, causal=True)
    o = w.run(q, (kp, vp))
    for b in range(3):
        ro, _ = attention_ref(q[qo[b]:qo[b + 1]], ks[b], vs[b], causal=True)
        np.testing.assert_allclose(o[qo[b]:qo[b + 1]], ro, atol=2e-4, rtol=2e-4)
    # ragged: the same keys, contiguous
    kv = [0] + list(np.cumsum(klens))
    k, v = np.concatenate(ks), np.concatenate(vs)
    w.plan(qo, kv, 8, 2, 64, causal=True)
    o2, lse = w.run(q, k, v, return_lse=True)
    np.testing.assert_allclose(o2, o, atol=2e-5, rtol=2e-5)
    assert lse.shape == (qo[-1], 8)


def test_failed_plan_leaves_no_plan():
    """A plan() that fails -- in Python, in the binding's checks or in the library -- leaves the
    wrapper unplanned (the library's rule): the next run() raises instead of running the plan
    made before it."""
    q = np.ones((3, 4, 64), np.float32)
    pool = np.zeros((3, 4, 2, 64), np.float32)
    good = ([0, 1, 2, 3], [0, 1, 2], [4, 4, 4], 4, 2, 64, 4)
    failures = [
        (ValueError, lambda w: w.plan(*good, algorithm="bogus")),                 # Python
        (ValueError, lambda w: w.plan([0, 1, 2, 3], [0, 1, 2], [4, 4], 4, 2, 64, 4)),  # binding
        (kvattn.KvattnError, lambda w: w.plan([0, 1, 2, 3], [0, 1, 2], [4, 9, 4], 4, 2, 64, 4)),  # library
    ]
    for exc, fail in failures:
        w = kvattn.BatchDecodeWrapper()
        w.plan(*good)
        w.run(q, (pool, pool), out=np.empty_like(q))
        with pytest.raises(exc):
            fail(w)
        with pytest.raises(RuntimeError, match="plan"):
            w.run(q, (pool, pool), out=np.empty_like(q))
        with pytest.raises(RuntimeError, match="plan"):
            w.run(q, (pool, pool))
        w.plan(*good)  # and a good plan afterwards works again
        w.run(q, (pool, pool), out=np.empty_like(q))
    p = kvattn.BatchPrefillWrapper()
    k = np.ones((5, 2, 64), np.float32)
    p.plan([0, 3], [0, 5], 4, 2, 64)
    p.run(q, k, k)
    with pytest.raises(ValueError):
        p.plan([0, 3], [0, 5, 7], 4, 2, 64)  # kv_indptr longer than qo_indptr
    with pytest.raises(RuntimeError, match="plan"):
        p.run(q, k, k)


def test_merge_states_without_lse_is_refused():
    """lse=None is a clear error (it used to reach the error path with an unset array view, which
    released stack garbage)."""
    v = np.ones((3, 4, 64), np.float32)
    for _ in range(3):
        with pytest.raises(ValueError, match="lse"):
            kvattn.merge_states(v, None)
        with pytest.raises(ValueError, match="lse"):
            kvattn._ext.merge_states(v, None, np.empty((3, 64), np.float32))


def test_merge_states():
    rng = np.random.default_rng(8)
    q, k, v = rnd(rng, (6, 4, 64)), rnd(rng, (50, 4, 64)), rnd(rng, (50, 4, 64))
    parts = [(0, 13), (13, 14), (14, 50)]
    vs, ls = [], []
    for a, b in parts:
        o, l = kvattn.attention(q, k[a:b], v[a:b], return_lse=True)
        vs.append(o)
        ls.append(l)
    V = np.stack(vs, axis=2).reshape(6 * 4, 3, 64)  # [rows, states, d]
    L = np.stack(ls, axis=2).reshape(6 * 4, 3)
    vo, lo = kvattn.merge_states(np.ascontiguousarray(V), np.ascontiguousarray(L))
    ro, rl = attention_ref(q, k, v)
    np.testing.assert_allclose(vo.reshape(6, 4, 64), ro, atol=2e-4, rtol=2e-4)
    np.testing.assert_allclose(lo.reshape(6, 4), rl, atol=2e-4, rtol=2e-4)


def test_block_table_to_csr():
    bt = np.array([[5, 6, 7, -1], [1, -1, -1, -1], [9, 8, 3, 2]], dtype=np.int32)
    indptr, indices, last = kvattn.block_table_to_csr(bt, np.array([40, 3, 64]), 16)
    assert list(indptr) == [0, 3, 4, 8] and list(indices) == [5, 6, 7, 1, 9, 8, 3, 2]
    assert list(last) == [8, 3, 16] and indptr.dtype == np.int32
    assert kvattn.block_table_to_csr([[4, 2]], [17], 16) == ([0, 2], [4, 2], [1])
    with pytest.raises(kvattn.KvattnError) as e:
        kvattn.block_table_to_csr([[4]], [17], 16)
    assert e.value.status_name == "KVA_ERR_OUT_OF_RANGE"
    # a ragged list: a row shorter than its context needs is refused, not padded with page 0
    assert kvattn.block_table_to_csr([[7], [2, 3]], [16, 17], 16) == ([0, 1, 3], [7, 2, 3], [16, 1])
    with pytest.raises(kvattn.KvattnError) as e:
        kvattn.block_table_to_csr([[7], [2, 3]], [17, 17], 16)
    assert e.value.status_name == "KVA_ERR_OUT_OF_RANGE"
    with pytest.raises(OverflowError, match="int32"):  # not truncated to page 1
        kvattn.block_table_to_csr(np.array([[2**32 + 1, 2]], dtype=np.int64), [17], 16)


def test_paged_kv_cache_lifecycle():
    c = kvattn.PagedKVCache(num_layers=2, num_kv_heads=2, head_dim=64, page_size=4, num_pages=6,
                            max_sequences=4, max_append_tokens=64)
    a = c.add_sequence()
    c.reserve([a], [10])
    assert c.seq_len(a) == 10 and c.stats()["used_pages"] == 3
    b = c.fork(a)
    st = c.stats()
    assert st["shared_pages"] == 3 and st["num_sequences"] == 2 and st["num_tokens"] == 20
    before = c.stats()
    with pytest.raises(kvattn.NoSpaceError) as e:
        c.reserve([a, b], [8, 8])  # needs more than the 3 free pages
    assert e.value.status_name == "KVA_ERR_NO_SPACE" and isinstance(e.value, kvattn.KvattnError)
    assert c.stats() == before and c.seq_len(a) == 10
    c.reserve([b], [1])  # copy-on-write of the shared partial last page
    assert c.stats()["cow_copies"] == 1
    indptr, indices, last = c.page_table([a, b])
    assert indptr == [0, 3, 6] and last == [2, 3] and indices[:2] == indices[3:5]
    assert c.page_refcount(indices[0]) == 2
    c.free(a)
    assert c.page_refcount(indices[0]) == 1
    with pytest.raises(kvattn.KvattnError) as e:
        c.seq_len(a)
    assert e.value.status_name == "KVA_ERR_BAD_STATE"
    with pytest.raises(ValueError, match="shape"):
        c.append(0, [b], [1], np.zeros((2, 2, 64), np.float32), np.zeros((2, 2, 64), np.float32))
    with pytest.raises(kvattn.KvattnError) as e:  # seq a is gone
        c.append(0, [a], [1], np.zeros((1, 2, 64), np.float32), np.zeros((1, 2, 64), np.float32))
    assert e.value.status_name == "KVA_ERR_BAD_STATE"
    assert "PagedKVCache(cpu" in repr(c)



def test_cache_ids_beyond_int32_are_refused():
    """2**32 + id must not wrap around to id (freeing, forking or reading another sequence)."""
    c = kvattn.PagedKVCache(num_layers=1, num_kv_heads=1, head_dim=64, page_size=4, num_pages=4)
    a = c.add_sequence()
    c.reserve([a], [5])
    for call in (c.free, c.fork, c.seq_len, c.page_refcount, c.pool):
        with pytest.raises(OverflowError, match="int32"):
            call(2**32 + a)
    with pytest.raises(OverflowError, match="int32"):
        c.layer(2**32)
    with pytest.raises(OverflowError, match="int32"):
        kvattn.set_num_threads(2**32 + 1)
    assert c.seq_len(a) == 5 and c.stats()["num_sequences"] == 1


def test_cache_layer_out_of_range():
    """cache.layer(l) refuses l outside 0..num_layers-1 the same way whatever was asked before
    (-1 is not the last layer, as a Python list index would make it once that was cached)."""
    c = kvattn.PagedKVCache(num_layers=2, num_kv_heads=1, head_dim=64, page_size=4, num_pages=4)
    for l in (-1, 2):
        with pytest.raises(kvattn.KvattnError) as e:
            c.layer(l)
        assert e.value.status_name == "KVA_ERR_OUT_OF_RANGE"
    assert c.layer(1) is c.layer(1)
    for l in (-1, -2, 2):
        with pytest.raises(kvattn.KvattnError):
            c.layer(l)

@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_attention_with_kv_cache_prefill_then_decode(layout):
    """Chunked prefill then 20 decode steps over two layers == full causal attention."""
    rng = np.random.default_rng(9)
    Hq, Hk, D, L = 8, 2, 64, 2
    c = kvattn.PagedKVCache(L, Hk, D, page_size=16, num_pages=64, layout=layout, max_sequences=8)
    prompts = [23, 5, 40]
    seqs = [c.add_sequence() for _ in prompts]
    total = [n + 20 for n in prompts]
    K = [[rnd(rng, (n, Hk, D)) for n in total] for _ in range(L)]
    V = [[rnd(rng, (n, Hk, D)) for n in total] for _ in range(L)]
    Q = [[rnd(rng, (n, Hq, D)) for n in total] for _ in range(L)]

    def step(pos, counts):
        outs = []
        for l in range(L):
            cat = lambda X: np.concatenate([X[l][i][pos[i]:pos[i] + counts[i]] for i in range(3)])
            o = kvattn.attention_with_kv_cache(cat(Q), cat(K), cat(V), c, seqs, layer=l, num_new=counts)
            outs.append(o)
        return outs

    outs = step([0, 0, 0], prompts)
    for l in range(L):
        at = 0
        for i, n in enumerate(prompts):
            ro, _ = attention_ref(Q[l][i][:n], K[l][i][:n], V[l][i][:n], causal=True)
            np.testing.assert_allclose(outs[l][at:at + n], ro, atol=2e-4, rtol=2e-4)
            at += n
    for t in range(20):
        pos = [n + t for n in prompts]
        outs = step(pos, [1, 1, 1])
        for l in range(L):
            for i in range(3):
                ro, _ = attention_ref(Q[l][i][pos[i]:pos[i] + 1], K[l][i][:pos[i] + 1], V[l][i][:pos[i] + 1])
                np.testing.assert_allclose(outs[l][i:i + 1], ro, atol=2e-4, rtol=2e-4)
    assert [c.seq_len(s) for s in seqs] == total



def test_attention_with_kv_cache_mistakes_change_nothing():
    """Shape, dtype and layer mistakes are refused before the step reserves its slots: a failed
    call leaves no K/V-less slots behind that later steps would attend to."""
    rng = np.random.default_rng(17)
    c = kvattn.PagedKVCache(2, 2, 64, page_size=4, num_pages=16, max_sequences=4)
    a = c.add_sequence()
    K, V, Q = rnd(rng, (6, 2, 64)), rnd(rng, (6, 2, 64)), rnd(rng, (6, 4, 64))
    kvattn.attention_with_kv_cache(Q[:5], K[:5], V[:5], c, [a], num_new=[5])
    before = c.stats()
    q, k, v = Q[5:], K[5:], V[5:]
    bad = [dict(k_new=rnd(rng, (1, 3, 64))), dict(v_new=v.astype(np.float16)), dict(q=rnd(rng, (1, 4, 32))),
           dict(q=rnd(rng, (1, 3, 64))), dict(q=rnd(rng, (2, 4, 64))), dict(layer=2, reserve=True),
           dict(q=q[None], k_new=np.ascontiguousarray(k[None].transpose(0, 2, 1, 3)), v_new=v[None])]
    for kw in bad:
        args = dict(q=q, k_new=k, v_new=v, layer=0)
        args.update(kw)
        with pytest.raises((ValueError, TypeError)):
            kvattn.attention_with_kv_cache(cache=c, seq_ids=[a], **args)
        assert c.stats() == before and c.seq_len(a) == 5, kw
    o = kvattn.attention_with_kv_cache(q, k, v, c, [a])
    np.testing.assert_allclose(o, attention_ref(q, K, V)[0], atol=2e-4, rtol=2e-4)

def test_cache_4d_form_and_f16():
    rng = np.random.default_rng(10)
    c = kvattn.PagedKVCache(1, 2, 64, page_size=8, num_pages=16, dtype="float16")
    s = [c.add_sequence(), c.add_sequence()]
    q, k, v = rnd(rng, (2, 6, 4, 64), np.float16), rnd(rng, (2, 6, 2, 64), np.float16), rnd(rng, (2, 6, 2, 64), np.float16)
    o = kvattn.attention_with_kv_cache(q, k, v, c, s)
    assert o.shape == q.shape and o.dtype == np.float16
    for b in range(2):
        ro, _ = attention_ref(q[b], k[b], v[b], causal=True)
        np.testing.assert_allclose(o[b].astype(np.float64), ro, atol=2e-2, rtol=2e-2)


def test_device_helpers():
    assert isinstance(kvattn.cuda_available(), bool)
    info = kvattn.device_info("cpu")
    assert info["threads"] >= 1 and info["name"]
    kvattn.set_num_threads(1)
    o = kvattn.attention(np.ones((2, 1, 64), np.float32), np.ones((3, 1, 64), np.float32),
                         np.ones((3, 1, 64), np.float32))
    assert np.allclose(o, 1)
    kvattn.set_num_threads(0)


def test_attention_with_kv_cache_replans_when_sequences_change():
    """Same ids and lengths as an earlier step but other pages: the step's plan is remade."""
    rng = np.random.default_rng(11)
    c = kvattn.PagedKVCache(1, 1, 64, page_size=4, num_pages=16)
    q = rnd(rng, (5, 2, 64))
    a = c.add_sequence()
    c.reserve([a], [5])
    k1 = rnd(rng, (5, 1, 64))
    kvattn.attention_with_kv_cache(q, k1, k1, c, [a], num_new=[5], reserve=False)
    c.free(a)
    x = c.add_sequence()
    c.reserve([x], [8])  # takes the freed pages
    b = c.add_sequence()
    c.reserve([b], [5])
    k2 = rnd(rng, (5, 1, 64))
    o = kvattn.attention_with_kv_cache(q, k2, k2, c, [b], num_new=[5], reserve=False)
    ro, _ = attention_ref(q, k2, k2, causal=True)
    np.testing.assert_allclose(o, ro, atol=2e-4, rtol=2e-4)


def test_threads_share_the_cpu_context_safely():
    """CPU calls release the GIL and hold the context's lock: threads may call concurrently."""
    import threading
    rng = np.random.default_rng(12)
    jobs = [(rnd(rng, (40, 8, 64)), rnd(rng, (60, 2, 64)), rnd(rng, (60, 2, 64))) for _ in range(4)]
    results = [None] * len(jobs)

    def work(i):
        q, k, v = jobs[i]
        for _ in range(5):
            results[i] = kvattn.attention(q, k, v, causal=True)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (q, k, v), o in zip(jobs, results):
        ro, _ = attention_ref(q, k, v, causal=True)
        np.testing.assert_allclose(o, ro, atol=2e-4, rtol=2e-4)


def test_prefill_wrapper_fixed_limits():
    rng = np.random.default_rng(13)
    w = kvattn.BatchPrefillWrapper("cpu", max_batch=4, max_total_qo=64)  # max_total_kv from the first plan
    q, k = rnd(rng, (20, 4, 64)), rnd(rng, (50, 2, 64))
    w.plan([0, 10, 20], [0, 25, 50], 4, 2, 64, causal=True)
    o = w.run(q, k, k)
    ro, _ = attention_ref(q[10:], k[25:], k[25:], causal=True)
    np.testing.assert_allclose(o[10:], ro, atol=2e-4, rtol=2e-4)
    with pytest.raises(ValueError, match="fixed limits"):
        w.plan([0, 70], [0, 70], 4, 2, 64)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cache_pool_views_through_dlpack(layout):
    """PagedKVCache.pool(layer): the pages as zero-copy arrays; appended rows are where the page
    table says, and a view outlives the cache object it came from."""
    rng = np.random.default_rng(14)
    c = kvattn.PagedKVCache(2, 2, 64, page_size=4, num_pages=8, layout=layout)
    s = c.add_sequence()
    c.reserve([s], [6])
    k = rnd(rng, (6, 2, 64))
    c.append(1, [s], [6], k, 2 * k)
    kp, vp = c.pool(1)
    K, V = np.from_dlpack(kp), np.from_dlpack(vp)
    if layout == "HND":
        K, V = K.transpose(0, 2, 1, 3), V.transpose(0, 2, 1, 3)
    assert K.shape == (8, 4, 2, 64)
    _, idx, _ = c.page_table([s])
    np.testing.assert_array_equal(K[idx].reshape(-1, 2, 64)[:6], k)
    np.testing.assert_array_equal(V[idx].reshape(-1, 2, 64)[:6], 2 * k)
    del c, kp, vp
    assert np.array_equal(K[idx].reshape(-1, 2, 64)[:6], k)


def test_cache_prefault_keeps_what_is_stored():
    """PagedKVCache.prefault(): the pool committed at once (kva_cache_prefault), rows appended
    before it read back unchanged, and appends after it work as before."""
    rng = np.random.default_rng(15)
    c = kvattn.PagedKVCache(2, 2, 64, page_size=4, num_pages=600)
    s = c.add_sequence()
    c.reserve([s], [6])
    k = rnd(rng, (6, 2, 64))
    c.append(1, [s], [6], k, 2 * k)
    c.prefault()
    c.reserve([s], [3])
    k2 = rnd(rng, (3, 2, 64))
    c.append(1, [s], [3], k2, 2 * k2)
    K, V = (np.from_dlpack(x) for x in c.pool(1))
    _, idx, _ = c.page_table([s])
    np.testing.assert_array_equal(K[idx].reshape(-1, 2, 64)[:9], np.concatenate([k, k2]))
    np.testing.assert_array_equal(V[idx].reshape(-1, 2, 64)[:9], 2 * np.concatenate([k, k2]))


class _LegacyProducer:
    """An array from a DLPack producer that predates versioned capsules: __dlpack__(stream)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)


class _OtherDevice(_LegacyProducer):
    def __dlpack_device__(self):
        return (4, 0)  # kDLOpenCL


class _NotACapsule(_LegacyProducer):
    def __dlpack__(self, stream=None, max_version=None):
        return 42


def test_binding_array_paths_and_refusals():
    """What a coverage run of the binding found untested: legacy DLPack producers (in and out),
    the pool view's export, and each refusal of a bad array, table or pool, with the exception
    and the argument it names."""
    import sys
    rng = np.random.default_rng(3)
    q, k, v = rnd(rng, (8, 4, 16)), rnd(rng, (8, 2, 16)), rnd(rng, (8, 2, 16))
    want = kvattn.attention(q, k, v, planned=False)
    got = kvattn.attention(_LegacyProducer(q), _LegacyProducer(k), _LegacyProducer(v), planned=False)
    np.testing.assert_array_equal(got, want)
    out = np.empty_like(q)
    kvattn._ext.attention(_LegacyProducer(q), k, v, _LegacyProducer(out))
    np.testing.assert_array_equal(out, want)

    P, page, Hk, D = 4, 4, 2, 16
    kp, vp = rnd(rng, (P, page, Hk, D)), rnd(rng, (P, page, Hk, D))
    w = kvattn.BatchDecodeWrapper()
    w.plan([0, 2], [0, 1], [3], 4, Hk, D, page)
    qd = rnd(rng, (1, 4, D))
    cases = [
        (ValueError, "device type 4", lambda: kvattn._ext.attention(_OtherDevice(q), k, v, np.empty_like(q))),
        (TypeError, "no DLPack capsule", lambda: kvattn._ext.attention(_NotACapsule(q), k, v, np.empty_like(q))),
        (ValueError, "more than 8 dimensions", lambda: kvattn._ext.array_info(np.zeros((1,) * 9, np.float32))),
        (TypeError, "q: dtype float64", lambda: kvattn._ext.attention(q.astype(np.float64), k, v,
                                                                      np.empty(q.shape))),
        (TypeError, "q: dtype float64", lambda: w.run(qd.astype(np.float64), (kp, vp), out=np.empty((1, 4, D)))),
        (ValueError, "q: the last dimension must be contiguous",
         lambda: kvattn.attention(rnd(rng, (8, 4, 32))[:, :, ::2], k, v, planned=False)),
        (ValueError, r"expected \(k_pages, v_pages\)", lambda: w.run(qd, (kp,))),
        (ValueError, "k_pages: expected", lambda: w.run(qd, (kp[0], vp[0]))),
        (ValueError, "v_pages: must match k_pages", lambda: w.run(qd, (kp, vp.astype(np.float16)))),
        (ValueError, "v_pages: must match k_pages", lambda: w.run(qd, (kp, np.asfortranarray(vp)))),
        (kvattn.KvattnError, "pages.page_size 8", lambda: w.run(qd, (rnd(rng, (P, 8, Hk, D)),) * 2)),
        (kvattn.KvattnError, "pages.num_pages is 1", lambda: w.run(qd, (kp[:1], vp[:1]))),
        (ValueError, "indptr: expected a 1-D", lambda: kvattn.BatchDecodeWrapper().plan(
            np.array([[0, 2]]), [0, 1], [3], 4, Hk, D, page)),
        (ValueError, "indptr: expected a 1-D int32/int64", lambda: kvattn.BatchDecodeWrapper().plan(
            np.array([0.0, 2.0]), [0, 1], [3], 4, Hk, D, page)),
        (OverflowError, r"indices\[1\] does not fit int32", lambda: kvattn.BatchDecodeWrapper().plan(
            [0, 2], np.array([0, 2 ** 33]), [3], 4, Hk, D, page, num_pages=4)),
        (ValueError, "v_out", lambda: kvattn.merge_states(rnd(rng, (4, 2, 16)), rnd(rng, (4, 2)),
                                                          out=np.empty((4, 8), np.float32))),
    ]
    for exc, msg, call in cases:
        with pytest.raises(exc, match=msg):
            call()
    pw = kvattn.BatchPrefillWrapper()
    pw.plan([0, 1], None, 4, Hk, D, page_size=page, paged_kv_indptr=[0, 2], paged_kv_indices=[0, 1],
            paged_kv_last_page_len=[3])
    with pytest.raises(ValueError, match="pass the paged K/V as k and v=None"):
        pw.run(q[:1], kp, vp)
    assert pw.run(q[:1], (kp, vp)).shape == (1, 4, D)

    # the cache's pool views: exported without copies, legacy capsules too, unused ones released
    cache = kvattn.PagedKVCache(1, Hk, D, page, 4, max_sequences=4)
    s = cache.add_sequence()
    cache.reserve([s], [5])
    with pytest.raises(kvattn.KvattnError, match="sequence id 99"):
        cache.page_table([99])
    kv = cache.pool(0)[0]
    assert kv.__dlpack_device__() == (1, 0) and tuple(kv.shape) == (4, page, Hk, D)
    assert np.from_dlpack(_LegacyProducer(kv)).shape == (4, page, Hk, D)
    with pytest.raises(BufferError):
        kv.__dlpack__(copy=True)
    before = sys.getrefcount(kv)
    for _ in range(20):
        kv.__dlpack__()
        kv.__dlpack__(max_version=(1, 0))
    assert sys.getrefcount(kv) == before


def test_cache_page_table_of_many_forks_and_bad_ids():
    """Page tables longer than the pool (forks share pages, so the table of many forks repeats
    them: the binding's scratch grows past its first size), more ids than max_sequences, an
    unknown id, a cache the library refuses to create."""
    cache = kvattn.PagedKVCache(1, 2, 16, 4, 4, max_sequences=8)
    root = cache.add_sequence()
    cache.reserve([root], [13])  # 4 pages: the whole pool
    kids = [cache.fork(root) for _ in range(6)]
    indptr, indices, last = cache.page_table([root] + kids)
    assert indptr == [4 * i for i in range(8)] and last == [1] * 7
    assert indices == indices[:4] * 7 and sorted(indices[:4]) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="max_sequences"):
        cache.page_table([root] * 9)
    with pytest.raises(kvattn.KvattnError, match="sequence id 99"):
        cache.page_table([99])
    with pytest.raises(kvattn.KvattnError, match="head_dim 17"):
        kvattn.PagedKVCache(1, 2, 17, 4, 8)


def test_package_argument_errors():
    """The package's own checks (before the binding) that no test reached: wrong ranks, a graph
    wrapper without limits, the cache passed where a layer's pool goes, a prefill plan without
    keys, run() before plan()."""
    q3, k3 = np.ones((4, 4, 16), np.float32), np.ones((4, 2, 16), np.float32)
    for planned in (True, False):
        with pytest.raises(ValueError, match=r"q: expected \[Lq, Hq, D\] or \[B, Lq, Hq, D\]"):
            kvattn.attention(np.ones((4, 16), np.float32), k3, k3, planned=planned)
    with pytest.raises(ValueError, match="v: expected 3 dimensions"):
        kvattn.merge_states(np.ones((4, 16), np.float32), np.ones((4, 1), np.float32))
    with pytest.raises(ValueError, match="use_cuda_graph=True needs fixed limits"):
        kvattn.BatchDecodeWrapper(use_cuda_graph=True)
    cache = kvattn.PagedKVCache(1, 2, 16, 4, 8)
    s = cache.add_sequence()
    cache.reserve([s], [3])
    w = kvattn.BatchDecodeWrapper()
    w.plan(*cache.page_table([s]), 4, 2, 16, 4, num_pages=8)
    with pytest.raises(TypeError, match=r"pass cache.layer\(l\)"):
        w.run(np.ones((1, 4, 16), np.float32), cache)
    p = kvattn.BatchPrefillWrapper()
    with pytest.raises(RuntimeError, match="before a successful plan"):
        p.run(q3, k3, k3)
    with pytest.raises(ValueError, match="give kv_indptr, or the paged table"):
        p.plan([0, 4], None, 4, 2, 16)


def test_empty_array_with_null_data_is_released():
    """A producer may export an array without elements with a NULL data pointer (CuPy does): the
    binding still holds its DLPack capsule and must release it (merge_states' lse was never
    released before 2026-11-29: the view was tracked by its data pointer)."""
    import ctypes

    class Device(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

    class DType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

    class Tensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device", Device), ("ndim", ctypes.c_int32), ("dtype", DType),
                    ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                    ("byte_offset", ctypes.c_uint64)]

    class Managed(ctypes.Structure):
        pass

    Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(Managed))
    Managed._fields_ = [("dl_tensor", Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", Deleter)]
    released = []
    on_release = Deleter(lambda m: released.append(1))
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    alive = []

    class EmptyNullData:  # float32 [0, 2] on the CPU, data NULL, legacy (unversioned) capsule
        shape = (0, 2)

        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, stream=None):
            shape = (ctypes.c_int64 * 2)(0, 2)
            m = Managed(Tensor(None, Device(1, 0), 2, DType(2, 32, 1), shape, None, 0), None, on_release)
            alive.append((m, shape))
            return new_capsule(ctypes.addressof(m), b"dltensor", None)

    kvattn._ext.merge_states(np.ones((0, 2, 16), np.float32), EmptyNullData(), np.empty((0, 16), np.float32))
    assert released == [1]
