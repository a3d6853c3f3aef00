"""Benchmark helpers on top of the package (used by bench/bench_torch.py and `python -m kvattn.bench`).

    python -m kvattn.bench [--device cpu|cuda] [--json FILE]     host overhead of one decode run

What is measured: the host time of BatchDecodeWrapper.run() on a tiny problem (batch 1, 16
keys), minus the time of the bare C call kva_decode_run() with the same arguments timed inside
the extension: the difference is what the Python binding adds (argument parsing, DLPack or the
torch fast path, stream lookup). Target: <= 3 us per run. Three ways of passing arguments are
timed: out= given and a KVPages pool (the hot path of an engine), a (k, v) tuple pool (read
every call), and no out= (an output allocated every call).

For the GPU benchmark (bench/bench_torch.py) the package offers PagedDecode (pools, page table,
plan and run of one decode shape, CUDA-graph variant included), time_calls (CUDA-event medians)
and read_ceiling (the read-bandwidth kernel of bench/read_ceiling.cu).
"""
import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time

import kvattn


# ---- host overhead (CPU or CUDA; numpy or torch arrays) --------------------------------------

def _arrays(device, hq=32, hk=8, d=128, page=16, ctx=16, batch=1):
    pages = batch * ((ctx + page - 1) // page)
    if device == "cpu":
        try:
            import numpy as np
        except ImportError:  # pragma: no cover
            np = None
        if np is not None and "torch" not in sys.modules:
            rng = np.random.default_rng(0)
            mk = lambda *s: rng.standard_normal(s).astype(np.float32)
            return mk(batch, hq, d), mk(pages, page, hk, d), mk(pages, page, hk, d), np.empty((batch, hq, d), np.float32), pages
    import torch
    dt = torch.float32 if device == "cpu" else torch.bfloat16
    mk = lambda *s: torch.randn(*s, device=device, dtype=dt)
    return mk(batch, hq, d), mk(pages, page, hk, d), mk(pages, page, hk, d), \
        torch.empty(batch, hq, d, device=device, dtype=dt), pages


def host_overhead(device="cpu", iters=3000, ctx=16, batch=1):
    """Median host microseconds per decode run() from Python, of the bare C call, and their
    difference, for three calling styles. Returns a dict."""
    q, kp, vp, out, pages = _arrays(device, ctx=ctx, batch=batch)
    if device == "cpu":  # one thread: the kernel runs on the calling thread, so worker wake-up
        kvattn.set_num_threads(1)  # noise does not hide (or inflate) the binding's own cost
    try:
        return _host_overhead(device, iters, ctx, batch, q, kp, vp, out, pages)
    finally:
        if device == "cpu":
            kvattn.set_num_threads(0)


def _host_overhead(device, iters, ctx, batch, q, kp, vp, out, pages):
    ppr = pages // batch
    indptr = [i * ppr for i in range(batch + 1)]
    indices = list(range(pages))
    last = [ctx - (ppr - 1) * 16] * batch
    w = kvattn.BatchDecodeWrapper(device)
    w.plan(indptr, indices, last, 32, 8, 128, 16)
    pool = kvattn.KVPages(kp, vp)
    sync = _sync(device)

    def per_call(fn):
        """(python us, C us): medians over rounds that alternate 100 Python calls with 100 bare
        C calls, so both see the same machine state (this machine is shared)."""
        for _ in range(50):
            fn()
        sync()
        py, cc = [], []
        for _ in range(max(iters // 100, 5)):
            t0 = time.perf_counter_ns()
            for _ in range(100):
                fn()
            py.append((time.perf_counter_ns() - t0) / 100)
            sync()
            cc.append(w.time_c_call(q, pool, out, 100))
            sync()
        return statistics.median(py) / 1e3, statistics.median(cc) / 1e3

    res = {"device": device, "arrays": type(q).__module__.split(".")[0], "batch": batch, "ctx": ctx}
    styles = {
        "run(q, KVPages, out=out)": lambda: w.run(q, pool, out=out),
        "run(q, (k, v), out=out)": lambda: w.run(q, (kp, vp), out=out),
        "run(q, KVPages)": lambda: w.run(q, pool),
    }
    res["styles"] = {}
    for name, fn in styles.items():
        us, c_us = per_call(fn)
        res["styles"][name] = {"python_us": us, "c_call_us": c_us, "overhead_us": us - c_us}
    res["c_call_us"] = res["styles"]["run(q, KVPages, out=out)"]["c_call_us"]
    res["overhead_us"] = res["styles"]["run(q, KVPages, out=out)"]["overhead_us"]
    return res


def _sync(device):
    if device == "cpu":
        return lambda: None
    import torch
    return torch.cuda.synchronize


def print_overhead(r):
    print("decode run host overhead (%s, %s arrays, batch %d, ctx %d): bare C call %.2f us" % (
        r["device"], r["arrays"], r["batch"], r["ctx"], r["c_call_us"]))
    for name, s in r["styles"].items():
        print("  %-28s %7.2f us per call, bare C %6.2f us: %+6.2f us" % (
            name, s["python_us"], s["c_call_us"], s["overhead_us"]))
    print("overhead of the hot path: %.2f us (target <= 3 us): %s" % (
        r["overhead_us"], "met" if r["overhead_us"] <= 3.0 else "MISSED"))


# ---- GPU helpers for bench/bench_torch.py ----------------------------------------------------

def time_calls(fn, nsets, iters, warmup=5):
    """Median milliseconds of fn(set) over iters calls, each bracketed by CUDA events; the GPU
    is first given a sleep so host enqueue time does not leak into the event times."""
    import torch
    for i in range(warmup):
        fn(i % nsets)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    torch.cuda._sleep(20_000_000)
    for i in range(iters):
        starts[i].record()
        fn(i % nsets)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def read_ceiling(build, gib=4):
    """(read GB/s, empty-kernel launch us) from libkvattn_read_ceiling.so in `build`, on torch's
    current stream. The library exports two plain C functions; no structs cross."""
    import ctypes
    import torch
    lib = ctypes.CDLL(os.path.join(build, "libkvattn_read_ceiling.so"))
    nbytes = gib << 30
    buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    buf.random_(0, 255)
    sink = torch.zeros(65536, dtype=torch.int32, device="cuda")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def fn(_):
        err = lib.kva_bench_read(ctypes.c_void_p(buf.data_ptr()), ctypes.c_size_t(nbytes),
                                 ctypes.c_void_p(sink.data_ptr()), stream)
        if err != 0:
            raise RuntimeError("read ceiling kernel: cuda error %d" % err)

    ms = time_calls(fn, 1, 15, warmup=3)
    del buf
    floor_ms = time_calls(lambda _: lib.kva_bench_empty(stream), 1, 50)
    return nbytes / (ms * 1e-3) / 1e9, floor_ms * 1e3


class PagedDecode:
    """One decode shape on the GPU: nsets input sets (pools, queries) rotated so no timed call
    reads from a warm L2, the shuffled CSR page table, a BatchDecodeWrapper planned once.

    Replaces bench_torch.py's ctypes OurDecode: same attributes (k, v, q, o, perm, plan fields
    through .plan_info) and methods run(s), contiguous_kv(s)."""

    def __init__(self, batch, ctx_len, nsets, hq=32, hk=8, d=128, page=16, graph=False, no_split=False,
                 fixed_chunk=0, hnd=False, dtype=None, device="cuda", lens=None, algorithm="partial_rowmax"):
        """lens: per-request context lengths (a ragged batch; batch and ctx_len are then ignored
        and ctx_len becomes the longest)."""
        import torch
        dtype = dtype or torch.bfloat16
        self.device = device
        lens = [int(x) for x in lens] if lens is not None else [ctx_len] * batch
        batch, ctx_len = len(lens), max(lens)
        self.lens = lens
        self.B, self.L, self.hk, self.d, self.page, self.hnd = batch, ctx_len, hk, d, page, hnd
        ppr = [max(1, (n + page - 1) // page) for n in lens]
        self.num_pages = sum(ppr)
        gen = torch.Generator(device="cpu").manual_seed(1234 + batch * 7 + ctx_len)
        self.perm = torch.randperm(self.num_pages, generator=gen).to(torch.int32)
        self.indptr = torch.tensor([0] + list(itertools.accumulate(ppr)), dtype=torch.int32)
        self.last = torch.tensor([n - (p - 1) * page for n, p in zip(lens, ppr)], dtype=torch.int32)
        shape = (self.num_pages, hk, page, d) if hnd else (self.num_pages, page, hk, d)
        self.k = [torch.randn(*shape, device=device, dtype=dtype) for _ in range(nsets)]
        self.v = [torch.randn(*shape, device=device, dtype=dtype) for _ in range(nsets)]
        self.q = [torch.randn(batch, hq, d, device=device, dtype=dtype) for _ in range(nsets)]
        self.o = torch.empty(batch, hq, d, device=device, dtype=dtype)
        self.pages = [kvattn.KVPages(k, v, hnd=hnd) for k, v in zip(self.k, self.v)]
        limits = dict(max_batch=batch, max_total_pages=self.num_pages) if graph else {}
        self.wrapper = kvattn.BatchDecodeWrapper(device, use_cuda_graph=graph,
                                                 kv_layout="HND" if hnd else "NHD", **limits)
        self.wrapper.plan(self.indptr, self.perm, self.last, hq, hk, d, page, num_pages=self.num_pages,
                          no_split=no_split, fixed_chunk_size=fixed_chunk, algorithm=algorithm)
        self.plan_info = self.wrapper.plan_info

    def run(self, s):
        self.wrapper.run(self.q[s], self.pages[s], out=self.o)

    def contiguous_kv(self, s, request=None):
        """Set s's K and V as torch wants them (NHD pools only): [B, Hk, L, D] in logical order,
        or, with request=b, that request's [1, Hk, len_b, D]."""
        assert not self.hnd
        idx = self.perm.long().to(self.device)
        ks, vs = [], []
        for b in range(self.B) if request is None else [request]:
            pages = idx[int(self.indptr[b]):int(self.indptr[b + 1])]
            n = self.lens[b]
            ks.append(self.k[s][pages].reshape(-1, self.hk, self.d)[:n].permute(1, 0, 2))
            vs.append(self.v[s][pages].reshape(-1, self.hk, self.d)[:n].permute(1, 0, 2))
        if request is not None or len(set(self.lens)) == 1:
            import torch
            return torch.stack(ks).contiguous(), torch.stack(vs).contiguous()
        raise ValueError("contiguous_kv: a ragged batch has no [B, Hk, L, D] form; pass request=b")

    def free(self):
        self.wrapper = None


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kvattn.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (cuda needs torch)")
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--json", default=None, help="write the result as JSON")
    args = ap.parse_args(argv)
    r = host_overhead(args.device, args.iters)
    print_overhead(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"host_overhead": r}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
