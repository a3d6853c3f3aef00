"""python_decode.py -- kvattn from Python with numpy on the CPU: a paged cache, a prefill of two
prompts, then decode steps through a plan/run wrapper; checked against plain numpy attention.
Run: python examples/python_decode.py  (after `pip install .`; works the same with torch
tensors, on CUDA with device="cuda")."""
import numpy as np

import kvattn

Hq, Hk, D, PAGE = 32, 8, 128, 16
rng = np.random.default_rng(0)
cache = kvattn.PagedKVCache(num_layers=1, num_kv_heads=Hk, head_dim=D, page_size=PAGE, num_pages=64,
                            dtype="float32", device="cpu")
seqs = [cache.add_sequence(), cache.add_sequence()]

# Prefill: 37 and 5 prompt tokens; K/V appended to the cache, causal attention over them.
lens = [37, 5]
k = rng.standard_normal((sum(lens), Hk, D), dtype=np.float32)
v = rng.standard_normal((sum(lens), Hk, D), dtype=np.float32)
q = rng.standard_normal((sum(lens), Hq, D), dtype=np.float32)
o = kvattn.attention_with_kv_cache(q, k, v, cache, seqs, num_new=lens)
print("prefill out", o.shape, "cache", cache)

# Decode: one token per sequence per step. Plan once per step, run once per layer.
keys1, vals1 = [k[lens[0]:]], [v[lens[0]:]]  # sequence 1's K/V, kept to check the result
wrapper = kvattn.BatchDecodeWrapper("cpu")
for step in range(3):
    cache.reserve(seqs, [1, 1])
    k1 = rng.standard_normal((2, Hk, D), dtype=np.float32)
    cache.append(0, seqs, [1, 1], k1, k1)
    keys1.append(k1[1:2])
    vals1.append(k1[1:2])
    indptr, indices, last_page_len = cache.page_table(seqs)
    wrapper.plan(indptr, indices, last_page_len, Hq, Hk, D, PAGE, num_pages=cache.num_pages)
    q1 = rng.standard_normal((2, Hq, D), dtype=np.float32)
    o1, lse = wrapper.run(q1, cache.layer(0), return_lse=True)   # [2, Hq, D], [2, Hq]
    print("step", step, "lengths", [cache.seq_len(s) for s in seqs], "plan", wrapper.plan_info["num_work"],
          "work items")

# Check sequence 1's last step against numpy: softmax(q K^T / sqrt(D)) V, query head h on KV head h // 4.
K, V = np.concatenate(keys1), np.concatenate(vals1)         # [8, Hk, D]
s_ = np.einsum("hd,thd->ht", q1[1], K[:, np.arange(Hq) // (Hq // Hk)]) / np.sqrt(D)
p = np.exp(s_ - s_.max(axis=1, keepdims=True))
ref = np.einsum("ht,thd->hd", p / p.sum(axis=1, keepdims=True), V[:, np.arange(Hq) // (Hq // Hk)])
print("max |kvattn - numpy| =", float(np.abs(o1[1] - ref).max()))
assert np.allclose(o1[1], ref, atol=1e-4)
