"""torch tensors (CPU here; CUDA, streams and CUDA-graph capture where a GPU is present)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kvattn  # noqa: E402
from reference import attention_ref, paged_pool  # noqa: E402

CUDA = torch.cuda.is_available() and kvattn.cuda_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device and a CUDA build of kvattn")


def npf(t):
    return t.detach().float().cpu().numpy()


def skip_unsupported(fn):
    try:
        return fn()
    except kvattn.KvattnError as e:
        if e.status_name == "KVA_ERR_UNSUPPORTED":
            pytest.skip(e.message)
        raise


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-4), (torch.float16, 2e-2), (torch.bfloat16, 4e-2)])
def test_attention_cpu(dtype, tol):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 19, 8, 64, generator=g).to(dtype)
    k = torch.randn(2, 30, 2, 64, generator=g).to(dtype)
    v = torch.randn(2, 30, 2, 64, generator=g).to(dtype)
    o, lse = kvattn.attention(q, k, v, causal=True, return_lse=True)
    assert isinstance(o, torch.Tensor) and o.dtype == dtype and lse.dtype == torch.float32
    for b in range(2):
        ro, rl = attention_ref(npf(q[b]), npf(k[b]), npf(v[b]), causal=True)
        np.testing.assert_allclose(npf(o[b]), ro, atol=tol, rtol=tol)
        np.testing.assert_allclose(npf(lse[b]), rl, atol=tol, rtol=tol)


def test_decode_and_cache_cpu_with_torch_index_tensors():
    rng = np.random.default_rng(1)
    kp, vp, indptr, indices, last, ks, vs = paged_pool(rng, [5, 40, 17], 16, 2, 64)
    q = torch.randn(3, 8, 64)
    w = kvattn.BatchDecodeWrapper()
    w.plan(torch.tensor(indptr, dtype=torch.int32), torch.tensor(indices, dtype=torch.int64),
           torch.tensor(last, dtype=torch.int32), 8, 2, 64, 16)
    o = w.run(q, (torch.from_numpy(kp), torch.from_numpy(vp)))
    for b in range(3):
        ro, _ = attention_ref(npf(q[b:b + 1]), ks[b], vs[b])
        np.testing.assert_allclose(npf(o[b:b + 1]), ro, atol=2e-4, rtol=2e-4)
    c = kvattn.PagedKVCache(1, 2, 64, 16, 8, dtype=torch.bfloat16)
    s = c.add_sequence()
    k = torch.randn(20, 2, 64).bfloat16()
    o = kvattn.attention_with_kv_cache(torch.randn(20, 8, 64).bfloat16(), k, k, c, [s], num_new=[20])
    assert o.dtype == torch.bfloat16 and o.shape == (20, 8, 64)
    indptr, indices, last = kvattn.block_table_to_csr(torch.tensor([[3, 1]]), torch.tensor([20]), 16)
    assert indptr.tolist() == [0, 2] and indices.tolist() == [3, 1] and last.tolist() == [4]


def _pool_cuda(lens, ps=16, hk=8, d=128, dtype=torch.bfloat16, seed=0):
    rng = np.random.default_rng(seed)
    kp, vp, indptr, indices, last, ks, vs = paged_pool(rng, lens, ps, hk, d)
    to = lambda a: torch.from_numpy(a).to("cuda", dtype)
    return to(kp), to(vp), indptr, indices, last, [to(x) for x in ks], [to(x) for x in vs]


def _sdpa_decode(q, ks, vs):
    out = []
    for b in range(q.shape[0]):
        qq = q[b:b + 1].float().permute(1, 0, 2).unsqueeze(0)  # [1, Hq, 1, D]
        kk = ks[b].float().permute(1, 0, 2).unsqueeze(0)
        vv = vs[b].float().permute(1, 0, 2).unsqueeze(0)
        out.append(torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True)[0, :, 0])
    return torch.stack(out)


@needs_cuda
def test_decode_cuda_on_the_current_stream():
    lens = [1, 700, 4096, 33]
    kp, vp, indptr, indices, last, ks, vs = _pool_cuda(lens)
    q = torch.randn(len(lens), 32, 128, device="cuda", dtype=torch.bfloat16)
    w = kvattn.BatchDecodeWrapper("cuda")
    w.plan(indptr, indices, last, 32, 8, 128, 16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # kvattn must enqueue on `side`, torch's current stream here
        o = w.run(q, (kp, vp))
        ref = _sdpa_decode(q, ks, vs)
    torch.cuda.synchronize()
    torch.testing.assert_close(o.float(), ref, atol=2e-2, rtol=2e-2)
    pages = kvattn.KVPages(kp, vp)
    out = torch.empty_like(q)
    assert w.run(q, pages, out=out) is out
    torch.cuda.synchronize()
    torch.testing.assert_close(out, o)


@needs_cuda
def test_decode_cuda_graph_replay_after_replan():
    kp, vp, indptr, indices, last, ks, vs = _pool_cuda([300, 5000, 17], seed=1)
    B = 3
    q = torch.randn(B, 32, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    w = kvattn.BatchDecodeWrapper("cuda", max_batch=8, max_total_pages=kp.shape[0], use_cuda_graph=True)
    w.plan(indptr, indices, last, 32, 8, 128, 16, num_pages=kp.shape[0])
    pages = kvattn.KVPages(kp, vp)
    w.run(q, pages, out=out)  # warm up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        w.run(q, pages, out=out)
    # re-plan for other lengths (same batch rows, shorter contexts), then replay the graph
    lens2 = [17, 300, 4000]
    idx2, ind2, last2, ks2, vs2 = [0], [], [], [], []
    for b, n in enumerate(lens2):
        pages_b = (n + 15) // 16
        ids = indices[indptr[1]:indptr[1] + pages_b]  # reuse request 1's pages
        ind2 += ids
        idx2.append(len(ind2))
        last2.append(n - (pages_b - 1) * 16)
        ks2.append(kp[ids].reshape(-1, 8, 128)[:n])
        vs2.append(vp[ids].reshape(-1, 8, 128)[:n])
    w.plan(idx2, ind2, last2, 32, 8, 128, 16, num_pages=kp.shape[0])
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), _sdpa_decode(q, ks2, vs2), atol=2e-2, rtol=2e-2)


@needs_cuda
def test_merge_states_and_cache_cuda():
    v = torch.randn(64, 3, 128, device="cuda", dtype=torch.bfloat16)
    lse = torch.randn(64, 3, device="cuda")
    vo, lo = kvattn.merge_states(v, lse)
    w = torch.softmax(lse, dim=1)
    torch.testing.assert_close(vo.float(), (w.unsqueeze(-1) * v.float()).sum(1), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lo, torch.logsumexp(lse, dim=1), atol=1e-4, rtol=1e-4)
    c = kvattn.PagedKVCache(1, 8, 128, 16, 64, dtype=torch.bfloat16, device="cuda")
    s = [c.add_sequence(), c.add_sequence()]
    c.reserve(s, [1, 1])
    k = torch.randn(2, 8, 128, device="cuda", dtype=torch.bfloat16)
    c.append(0, s, [1, 1], k, k)
    q = torch.randn(2, 32, 128, device="cuda", dtype=torch.bfloat16)
    o = kvattn.attention_with_kv_cache(q, k, k, c, s, layer=0, reserve=False)
    # appended again at layer 0 without reserving: the cache overwrote the same slot
    torch.cuda.synchronize()
    torch.testing.assert_close(o, k.repeat_interleave(4, dim=1), atol=1e-2, rtol=1e-2)


@needs_cuda
@pytest.mark.parametrize("d", [128, 96, 80])  # (96 and 80 on the d128 kernel, zero-filled)
def test_prefill_cuda(d):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 100, 32, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 100, 8, d, device="cuda", dtype=torch.bfloat16, generator=g)
    o = skip_unsupported(lambda: kvattn.attention(q, k, k, causal=True))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).float(), k.transpose(1, 2).float(), k.transpose(1, 2).float(), is_causal=True,
        enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(o.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_attention_unplanned_into_out(device):
    """attention(planned=False, out=): kva_attention into a preallocated output (bench_torch.py's
    dense column), bf16, GQA 32/8, d 128; the same result as the planned path."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(200, 32, 128, generator=g).bfloat16().to(device)
    k = torch.randn(200, 8, 128, generator=g).bfloat16().to(device)
    v = torch.randn(200, 8, 128, generator=g).bfloat16().to(device)
    o = torch.full_like(q, float("nan"))
    r = skip_unsupported(lambda: kvattn.attention(q, k, v, causal=True, out=o, planned=False))
    assert r is o and bool(torch.isfinite(o).all())
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1).float(), k.transpose(0, 1).float(), v.transpose(0, 1).float(), is_causal=True,
        enable_gqa=True).transpose(0, 1)
    torch.testing.assert_close(o.float(), ref, atol=2e-2, rtol=2e-2)
    planned = skip_unsupported(lambda: kvattn.attention(q, k, v, causal=True))
    torch.testing.assert_close(o.float(), planned.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("graph", [False, True])
def test_bench_paged_decode_helper_cpu(graph):
    """kvattn.bench.PagedDecode (bench_torch.py's decode shape) on the CPU, against torch SDPA."""
    import kvattn.bench as kb
    d = kb.PagedDecode(3, 100, 2, hq=8, hk=2, d=64, dtype=torch.float32, device="cpu", graph=graph)
    assert d.plan_info["planned"] == 1 and d.plan_info["num_work"] >= 3
    for s in range(2):
        d.run(s)
        k, v = d.contiguous_kv(s)  # [B, Hk, L, D]
        ref = torch.nn.functional.scaled_dot_product_attention(d.q[s].unsqueeze(2), k, v,
                                                               enable_gqa=True).squeeze(2)
        torch.testing.assert_close(d.o, ref, atol=2e-4, rtol=2e-4)
    d.free()
