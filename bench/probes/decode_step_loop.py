"""decode_step_loop.py -- decode steps as a server runs them, for what a lone timed call cannot
show: per layer, the step's K/V appended to the paged cache (kva_cache_append) and then the
decode run, LAYERS layers back to back on one stream, the whole layer loop of each step timed
(after the step's plan, which is host work and one upload). Per-layer medians of (append +
decode) -- each append with its pageable copy of the slot list, as a server's -- and of decode
alone (the same loop without the appends; in a KVA__DECODE_PDL build, the default since
2026-11-29, those decodes are dependents of each other as well).

Made for the KVA__DECODE_PDL experiment, kept (src/cuda/cuda_common.cuh; bench/NOTES.md, "the
decode kernel as a programmatic dependent of the step's append"): in such a build the decode launch
overlaps the append before it, which a call bracketed by events (bench_torch.py) never sees.
Compare two builds in one device call, alternating, e.g.

    for b in build-gpu-ab-base build-gpu-ab-off build-gpu-ab-base build-gpu-ab-off; do
        python3 bench/probes/decode_step_loop.py --build $b; done

(scripts/gpu-check.sh's A/B mode builds such sides: GPU_CHECK_AB_SIDES="off=-DKVA__DECODE_PDL=0").
--device cpu runs the same loop on the CPU with numpy (a smoke test of the loop itself; CPU
timings say nothing about the experiment).
"""
import argparse
import os
import statistics
import sys
import time

HQ, HK, D, PS = 32, 8, 128, 16
SHAPES = [(1, 8192), (8, 4096), (64, 4096)]


def load(build):
    sys.path.insert(0, os.path.join(build, "python"))
    import kvattn
    return kvattn


class Timer:
    """CUDA events on torch's current stream (a GPU sleep first, so that the host has queued the
    whole loop before it runs), or the host clock on the CPU."""

    def __init__(self, cuda):
        self.cuda = cuda
        if cuda:
            import torch
            self.torch = torch

    def start(self):
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda._sleep(10_000_000)  # ~5 ms: the host queues the whole loop first
            self.e0 = self.torch.cuda.Event(enable_timing=True)
            self.e1 = self.torch.cuda.Event(enable_timing=True)
            self.e0.record()
        else:
            self.t0 = time.perf_counter()

    def stop_ms(self):
        if self.cuda:
            self.e1.record()
            self.torch.cuda.synchronize()
            return self.e0.elapsed_time(self.e1)
        return (time.perf_counter() - self.t0) * 1e3


def step_loop(kvattn, B, L, layers, steps, warmup, device):
    cuda = device != "cpu"
    if cuda:
        import torch

        def rand(*shape):
            return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

        def empty_like(x):
            return torch.empty_like(x)
        dtype = "bfloat16"
    else:
        import numpy as np
        rng = np.random.default_rng(0)

        def rand(*shape):
            return rng.standard_normal(shape).astype(np.float32)

        def empty_like(x):
            return np.empty_like(x)
        dtype = "float32"
    total = warmup + steps
    pages = B * ((L + total + PS - 1) // PS + 1)
    cache = kvattn.PagedKVCache(num_layers=layers, num_kv_heads=HK, head_dim=D, page_size=PS, num_pages=pages,
                                dtype=dtype, device=device, max_sequences=B, max_append_tokens=max(L, B))
    seqs = [cache.add_sequence() for _ in range(B)]
    cache.reserve(seqs, [L] * B)
    k_ctx, v_ctx = rand(L, HK, D), rand(L, HK, D)  # (the same context rows for every request and layer)
    for layer in range(layers):
        for s in seqs:
            cache.append(layer, [s], [L], k_ctx, v_ctx)
    wrapper = kvattn.BatchDecodeWrapper(device)
    q = rand(B, HQ, D)
    o = empty_like(q)
    k_new, v_new = rand(B, HK, D), rand(B, HK, D)
    timer = Timer(cuda)
    with_append, decode_only = [], []
    for step in range(total):
        cache.reserve(seqs, [1] * B)
        indptr, indices, last = cache.page_table(seqs)
        wrapper.plan(indptr, indices, last, HQ, HK, D, PS)
        timer.start()
        for layer in range(layers):
            cache.append(layer, seqs, [1] * B, k_new, v_new)
            wrapper.run(q, cache.layer(layer), out=o)
        t = timer.stop_ms()
        timer.start()
        for layer in range(layers):
            wrapper.run(q, cache.layer(layer), out=o)
        t_dec = timer.stop_ms()
        if step >= warmup:
            with_append.append(t * 1e3 / layers)
            decode_only.append(t_dec * 1e3 / layers)
    info = wrapper.plan_info
    return {"batch": B, "ctx": L, "layers": layers, "steps": steps,
            "append_decode_us": statistics.median(with_append), "decode_us": statistics.median(decode_only),
            "chunk": info.get("kv_chunk_size"), "work": info.get("num_work")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("KVA_BUILD", "build"))
    ap.add_argument("--device", default="cuda", help="cuda (torch) or cpu (numpy smoke test)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--shapes", default=None, help="e.g. 1x8192,64x4096")
    args = ap.parse_args()
    kvattn = load(args.build)
    shapes = SHAPES if not args.shapes else [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    print("decode step loop (%s, build %s): %d/%d heads, d %d, page %d, %d layers per step, %d steps" %
          (args.device, args.build, HQ, HK, D, PS, args.layers, args.steps), flush=True)
    print("| batch x ctx | per layer: append + decode us | decode alone us | chunk/work |")
    print("|---|---|---|---|")
    for B, L in shapes:
        r = step_loop(kvattn, B, L, args.layers, args.steps, 3, args.device)
        print("| %d x %d | %.1f | %.1f | %s/%s |" % (B, L, r["append_decode_us"], r["decode_us"], r["chunk"], r["work"]),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
