#!/usr/bin/env python3
"""bench_torch.py -- kvattn on the GPU against PyTorch SDPA, in one process, on one stream.

Drives kvattn through its Python package (`import kvattn`: the C extension takes the torch
tensors themselves and runs on torch's current stream; found installed, on PYTHONPATH, or in
<build>/python of a CMake build) and times ours and PyTorch side by side with CUDA events (warm-up
first, then the median of N calls; the GPU is given a sleep before the timed calls so that the
host enqueues ahead of it). Inputs are random (never zeros) and every timed call uses the next
of several input sets whose total is >= 4x the L2 (at least 2 sets), so no call starts from a
warm cache. Two tables, each printed at the end under a heading starting with "## kvattn" (what
scripts/gpu-check.sh shows), everything also written to --json, with the host overhead of one
decode run() from Python (kvattn.bench.host_overhead("cuda"), key "host_overhead").

Decode table: paged decode, bf16, 32 query / 8 KV heads, head dim 128, page 16, physical pages
shuffled, one query token per request; PyTorch SDPA (flash and cuDNN, enable_gqa=True) on a
contiguous cache. Reported: median time, GB/s of K+V read, fraction of the read ceiling
(a streaming 16-byte-load reduction over 4 GiB, libkvattn_read_ceiling.so, same run),
CUDA-graph replay for the small shapes, the time of seed 002's global-rowmax algorithm
(KVA_DECODE_GLOBAL_ROWMAX) on the same sets, best-torch-time / our-time (> 1: we are faster);
for the small shapes also the time per call of 32 calls back to back (ours and both torch
backends, one pair of events around the series: a decode step's layers in a row, where each
call's launch overlaps the one before), a second small table.

Model-shape decode tables (issue 8; skipped with --no-models or --shapes): the same method on the
head configurations of real models (32/8 d128, 28/4 d128, 8/1 d128, 32/32 d128, 16/8 d256,
32/4 d64, 32/32 d96, 71/1 d64, 48/1 d128) at batch x context 1x8192, 1x32768, 8x4096, 64x4096, against the
best of SDPA flash / cuDNN on contiguous K/V; then three ragged batches (32/8 d128; lengths from
seed 8): (a) 95 log-normal lengths (median 1.5k, sigma 1, clipped to 32k) and one of 32k, (b) one
of 64k and 63 of 100, (c) 256 uniform in 1..8k. Ragged rows compare with the best of PyTorch on
the batch padded to its longest request (no mask: the pad keys are computed, which only helps
torch's time; skipped over 24 GiB) and a loop of one SDPA call per request. Each row's output is
checked (max abs error vs SDPA math in f32 on a few requests) before it is timed.

Prefill table: 32 query / 8 KV heads, 16384 tokens per batch as batch x seq = 32x512, 8x2048,
2x8192, 1x16384, causal and full; bf16 and f16 at head dim 128, bf16 at head dims 64 and 256.
  - ours: kvattn.BatchPrefillWrapper.plan (kva_prefill_plan) with qo_indptr = kv_indptr = the
    batch's cu_seqlens (equal lengths), planned once outside the timed loop; its run(q, k, v,
    out=o) (kva_prefill_run_ragged) is timed. q/o are [tokens, 32, d], k/v [tokens, 8, d].
    Batch-1 rows also time the dense kva_attention (kvattn.attention(..., planned=False), no
    plan; column "dense").
  - PyTorch: F.scaled_dot_product_attention on contiguous [batch, heads, seq, d] copies of the
    same data, under torch.nn.attention.sdpa_kernel([SDPBackend.FLASH_ATTENTION]) (FA2) and
    ([SDPBackend.CUDNN_ATTENTION]), enable_gqa=True; a backend that refuses GQA is retried with
    K/V heads repeated (repeat_interleave, done outside the timed loop) and the row says
    "gqa=repeat" in the JSON (variant name ends in "+rep").
  - FLOPs: two matrix products (S = Q K^T, O = P V) of 2 FLOPs per multiply-add over the visible
    (query, key) pairs: FLOPs = 4 * heads_q * d * pairs. Full: pairs = sum_b q_b * kv_b, i.e.
    4 * seq^2 * 32 * d * batch for the equal rows. Causal counts half the score matrix:
    pairs = sum_b (q_b * kv_b - q_b^2 / 2), i.e. 4 * seq^2 * 32 * d * batch / 2 (the diagonal's
    half is not added). TFLOP/s = FLOPs / median time. Rows also give two fractions: of the
    bf16 matrix-product rate measured in the same run (torch.matmul of random 8192 x 8192 x 8192
    bf16, cuBLAS, median, 2 * 8192^3 FLOPs; f16's rate is printed too) -- a peer, which d256
    attention exceeds -- and of the tensor-core ceiling of the row's dtype measured in the same
    run (bench/mma_ceiling.cu, libkvattn_mma_ceiling.so: wgmma m64n256k16 back to back, three
    warpgroups per SM, random operands; sm_90a builds only), which no row may exceed (a warning
    is printed if one does).
  - SM MHz: the median SM clock (NVML, sampled every 5 ms on a thread) over ours' and cuDNN's
    timed calls (the window of iters x the median call before the series ends; a shorter window
    takes the sample nearest its end), and the GEMM's: a long row at the board's power cap runs
    below the clock the GEMM ceiling was measured at ("-" without nvidia-ml-py).
  - ragged row (bf16, d 128, causal): prompt lengths drawn log-normal (seed 6, median 800,
    sigma 1.0, clipped to 16..8192) until they hold 16384 tokens, the last one cut to fit. Ours:
    one ragged plan over the batch. PyTorch: the best of (a) the padded batch [B, heads,
    max_len, d] with is_causal (right padding: no valid query sees a pad key), (b) a loop of one
    SDPA call per request, (c) for flash, the varlen kernel torch ships
    (torch.ops.aten._flash_attention_forward with cu_seqlens); FLOPs count real tokens only.
  - chunked-prefill row (bf16, d 128): 512 new tokens of one request over a 16384-token cached
    prefix, the 512 new keys already appended (kv_len 16896), causal bottom-right aligned (query i
    sits at position 16384 + i). Ours: paged, page 16, physical pages shuffled,
    kva_prefill_run_paged (the wrapper planned with the page table, run on kvattn.KVPages).
    PyTorch on contiguous K/V: SDPA's is_causal is top-left aligned, so
    flash gets torch.nn.attention.bias.causal_lower_right(512, 16896) as attn_mask (torch runs
    FA2's bottom-right causal kernel for it) and cuDNN an explicit bottom-right boolean mask
    (built once, outside the timed loop); the flash varlen op (bottom-right natively) is tried
    too; the best flash time is reported.
  - correctness, before any timing, on input set 0 of every row: our output is poisoned (NaN)
    before the run, then must be finite everywhere, within rel. error 2e-2 of the first working
    torch variant over the whole tensor (||ours - torch|| / ||torch||; its max abs diff is
    printed), and within rel. error 1e-2 of a float32 reference (on upcast inputs, TF32 off) on
    ~128 sampled query rows of the first, the last and (ragged) the longest request. Every torch
    variant must pass the same reference check to count. A row that fails posts no number (its
    ours columns say WRONG) and the script exits 1. If ours returns KVA_ERR_UNSUPPORTED (before
    the CUDA prefill kernel exists), the row says "unsupported", torch is still timed, and that
    is not an error (kvattn raises KvattnError with .status_name == "KVA_ERR_UNSUPPORTED"); any
    other non-OK status is printed in the row and fails the script.

Usage: bench_torch.py [--build DIR] [--json FILE] [--quick] [--decode-only | --prefill-only]
                      [--shapes 1x1024,8x4096,...] [--variants] [--no-models]  (decode)
                      [--seqs 512,2048,8192,16384] [--prefill-sets bf16:128,f16:128,bf16:64,bf16:256,bf16:96]
                      [--no-extra-rows]                                    (prefill)
                      [--burst-ms 20] [--sustained 1.5]                     (prefill)
--quick: 30 decode / 10 prefill timed calls per measurement instead of 100 / 30.
--burst-ms: a prefill or GEMM series times only the calls that fit in this many ms (at least 3)
    after one warm-up call, so that every row is timed before the board reaches its power limit
    (~50 ms of full load after an idle pause on an H200; a 30-call series of a 3-7 ms row
    straddled that step and its median fell on either side of it). 0: the old fixed count.
--sustained S: after the table, the headline rows (bf16 d128 16k causal and full, 2 x 8192 full,
    d256 16k full) and the GEMM, ours and cuDNN, each run back to back for S seconds: the
    power-limited rates a server at full load gets (median call of the second half, with the
    SM clock and board power). Default 1.5 s; off with --quick.
"""
import argparse
import datetime
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

# ---- the kvattn package -------------------------------------------------------------------

kvattn = kb = None  # the package and kvattn.bench, set by load_kvattn()


def load_kvattn(build):
    """Imports kvattn (installed or on PYTHONPATH), else the package a CMake build assembled in
    <build>/python (the extension is <build>/python/kvattn/_ext.abi3.so)."""
    global kvattn, kb
    try:
        import kvattn as pkg
    except ImportError:
        path = os.path.abspath(os.path.join(build, "python"))
        sys.path.insert(0, path)
        try:
            import kvattn as pkg
        except ImportError as e:
            sys.exit("bench_torch.py: cannot import kvattn (%s): pip install . , or build with "
                     "cmake -DPython_EXECUTABLE=$(command -v python3) so that %s/kvattn/_ext.abi3.so "
                     "exists (--build DIR)" % (e, path))
    import kvattn.bench as bench
    kvattn, kb = pkg, bench
    return pkg


KVA_OK, KVA_ERR_UNSUPPORTED = 0, 3  # kva_status values (KvattnError.status)


def status_text(e):
    """A KvattnError as 'KVA_ERR_... (message)'."""
    return "%s (%s)" % (e.status_name, e.message)


def kva_status_of(fn):
    """Calls fn(): (KVA_OK, None), or a KvattnError's (status, 'KVA_ERR_... (message)')."""
    try:
        fn()
    except kvattn.KvattnError as e:
        return e.status, status_text(e)
    return KVA_OK, None


HQ, HK, D, PS = 32, 8, 128, 16
SHAPES = [(1, 1024), (1, 8192), (1, 32768), (8, 4096), (16, 8192), (32, 4096), (64, 2048),
          (64, 4096), (128, 1024), (128, 4096), (256, 512)]
GRAPH_SHAPES = {(1, 1024), (1, 8192), (1, 32768), (8, 4096)}
# FlashInfer on an H200 (GPU.md, 2026-11-22), GB/s: (cuda-core, tensor-core)
FLASHINFER_H200 = {(1, 1024): (308, 336), (1, 8192): (1465, 1476), (1, 32768): (2243, 2890),
                   (8, 4096): (2325, 2906), (16, 8192): (2672, 4026), (32, 4096): (2673, 4157),
                   (64, 2048): (2646, 4011), (64, 4096): (2769, 4312), (128, 1024): (2751, 3847),
                   (128, 4096): (2848, 4385), (256, 512): (2832, 3711)}


def our_decode(batch, ctx_len, nsets, graph=False, flags=0, fixed_chunk=0, hnd=False):
    """One decode shape (pools per input set, shuffled page table, plan): kvattn.bench.PagedDecode.
    flags bit 0 = KVA_PLAN_NO_SPLIT."""
    return kb.PagedDecode(batch, ctx_len, nsets, hq=HQ, hk=HK, d=D, page=PS, graph=graph,
                          no_split=bool(flags & 1), fixed_chunk=fixed_chunk, hnd=hnd)


SETTLE_S = 0.5  # --settle


class SmClock:
    """The SM clock and board power (NVML, nvidia-ml-py) sampled every 5 ms on a thread while a
    timed series runs, each sample with its time: stop() keeps those of the timed calls' window
    (the series' end back by iters x the median call, i.e. not the warm-up or the GPU sleep
    before it) and gives their median clock -- the clock a row ran at; between() gives the median
    clock and power of any window. NVML's clock lags a power-limit step by a few ms and its
    power reading (where NVML_FI_DEV_POWER_INSTANT is missing) is a 1 s average, so these say
    which state a long window ran in, not when a step came (per-call times say that). A window
    shorter than the interval gets the sample nearest its end. Off (None) without NVML. The
    thread only sleeps and makes NVML calls (ctypes releases the GIL), so the launching thread is
    not held up."""

    def __init__(self):
        self.nvml = self.handle = None
        self.samples = []
        try:
            import pynvml
            pynvml.nvmlInit()
            # the same GPU as torch's: by PCI address (NVML's indices follow the bus, CUDA's
            # default order and CUDA_VISIBLE_DEVICES need not)
            p = torch.cuda.get_device_properties(torch.cuda.current_device())
            bus = "%08x:%02x:%02x.0" % (p.pci_domain_id, p.pci_bus_id, p.pci_device_id)
            self.handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
            self.nvml = pynvml
        except Exception:  # no nvidia-ml-py, no PCI address from torch, or NVML refuses
            self.nvml = None

    def _watts(self):
        """Board power now (W): the instantaneous field where this NVML has it, else the
        averaged reading; None if neither answers."""
        fi = getattr(self.nvml, "NVML_FI_DEV_POWER_INSTANT", None)
        if fi is not None:
            try:
                v = self.nvml.nvmlDeviceGetFieldValues(self.handle, [fi])[0]
                if v.nvmlReturn == 0:
                    return v.value.uiVal / 1000.0
            except Exception:
                pass
        try:
            return self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
        except Exception:
            return None

    def start(self, power=False):
        import threading
        self.samples, self.stop_flag = [], threading.Event()
        if self.nvml is None:
            return
        def run():
            import time
            while not self.stop_flag.is_set():
                try:
                    mhz = self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM)
                except Exception:
                    return
                self.samples.append((time.monotonic(), mhz, self._watts() if power else None))
                self.stop_flag.wait(0.005)
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def stop(self, window_s=None):
        """Median SM clock (MHz) of the samples in the last window_s seconds (all without), or
        None."""
        import time
        end = time.monotonic()
        if self.nvml is None:
            return None
        self.stop_flag.set()
        self.thread.join()
        mhz, _ = self.between(end - window_s if window_s is not None else None, end)
        return mhz

    def between(self, t0, t1):
        """(median MHz, median W) of the samples taken in [t0, t1] (host monotonic seconds; t0
        None: from the first), or of the one nearest t1 if none is; None where unknown."""
        import statistics
        if not self.samples:
            return None, None
        inside = [x for x in self.samples if (t0 is None or x[0] >= t0) and x[0] <= t1]
        if not inside:
            inside = [min(self.samples, key=lambda x: abs(x[0] - t1))]
        mhz = sorted(x[1] for x in inside)[len(inside) // 2]
        w = [x[2] for x in inside if x[2] is not None]
        return mhz, (statistics.median(w) if w else None)


SM_CLOCK = None  # the SmClock, made on first use
LAST_MHZ = None  # the median SM clock of the last timed series (time_calls), or None


BURST_MS = 20.0  # --burst-ms: a prefill / GEMM series times the calls that fit in this many ms


def time_calls(fn, nsets, iters, warmup=5, burst_ms=None):
    """Median milliseconds of fn(set) over iters calls bracketed by CUDA events (kvattn.bench),
    after SETTLE_S seconds of an idle GPU: every series starts from the same power state. (Without
    it, the row after a long one -- e.g. 32 x 512 after 16k at the next head dim -- was timed at
    the clocks the power limit had left: ours, timed first in each row, read 10-15% low there
    while torch, timed after it, had recovered; bench/NOTES.md.)
    burst_ms (prefill and GEMM series): the warm-up calls run before the idle pause, each timed,
    and the fastest sets how many calls are timed after it: those that fit in burst_ms (at least
    3, at most iters). An H200 at full load reaches its power limit 30-50 ms after an idle pause
    and its clock then steps down ~18% within a few calls, so a series of 30 calls of 3-7 ms
    straddled the step and its median landed on either side (the same row read 612 and 685
    TFLOP/s, cuDNN too; bench/NOTES.md, "Prefill series across the power limit"): a short series
    times every row in one state, the state the GEMM ceiling is measured in. The power-limited
    state has its own table (run_prefill_sustained)."""
    import time
    if burst_ms:
        n_warm = max(1, warmup)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(n_warm + 1)]
        ev[0].record()
        for i in range(n_warm):
            fn((nsets - 1 - i) % nsets)  # (the sets the timed calls reach last)
            ev[i + 1].record()
        torch.cuda.synchronize()
        one = min(ev[i].elapsed_time(ev[i + 1]) for i in range(n_warm))
        iters = min(iters, max(3, int(burst_ms / max(one, 1e-3))))
        warmup = 0
    if SETTLE_S > 0:
        torch.cuda.synchronize()
        time.sleep(SETTLE_S)
    global SM_CLOCK, LAST_MHZ, LAST_ITERS
    if SM_CLOCK is None:
        SM_CLOCK = SmClock()
    SM_CLOCK.start()
    ms = None
    LAST_ITERS = iters
    try:
        ms = kb.time_calls(fn, nsets, iters, warmup=warmup)
        return ms
    finally:
        # (the timed calls run back to back just before the series returns)
        LAST_MHZ = SM_CLOCK.stop(iters * ms * 1e-3 if ms else None)


LAST_ITERS = None  # the number of calls the last series timed


def per_call_ms(fn, nsets, n):
    """n calls of fn back to back, each bracketed by its own pair of events, after a GPU sleep
    (so the host has queued them all): (list of ms, host monotonic time just after they ended).
    Call i then ended about sum(ms[i + 1:]) ms before that time."""
    import time
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    torch.cuda._sleep(20_000_000)
    for i in range(n):
        ev[i].record()
        fn(i % nsets)
    ev[n].record()
    torch.cuda.synchronize()
    end = time.monotonic()
    return [ev[i].elapsed_time(ev[i + 1]) for i in range(n)], end


def time_sustained(fn, nsets, seconds):
    """The power-limited state: one call to measure it, SETTLE_S of idle GPU, then fn back to
    back for about `seconds`; returns the median ms of the calls of the second half and the
    median SM clock (MHz) and board power (W) over that half (None without NVML)."""
    import statistics
    import time
    one = kb.time_calls(lambda s: fn(nsets - 1), 1, 2, warmup=1)
    n = max(20, int(seconds * 1e3 / max(one, 1e-3)))
    torch.cuda.synchronize()
    if SETTLE_S > 0:
        time.sleep(SETTLE_S)
    clock = SmClock()
    clock.start(power=True)
    try:
        ms, end = per_call_ms(fn, nsets, n)
    finally:
        if clock.nvml is not None:
            clock.stop_flag.set()
            clock.thread.join()
    half = ms[n // 2:]
    mhz, watts = clock.between(end - sum(half) * 1e-3, end)
    return statistics.median(half), mhz, watts


def time_back_to_back(fn, nsets, n=32, reps=5):
    """Milliseconds per call of n calls of fn back to back (rotated sets, no event between them:
    the way a decode step's layers follow each other in a stream or a captured graph, where a
    call's launch and ramp overlap the one before), the median of reps such series, each after
    SETTLE_S of idle GPU and a GPU sleep under which the host queues all n."""
    import statistics
    import time
    for i in range(3):
        fn(i % nsets)
    per = []
    for _ in range(reps):
        torch.cuda.synchronize()
        if SETTLE_S > 0:
            time.sleep(SETTLE_S)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(20_000_000)
        a.record()
        for i in range(n):
            fn(i % nsets)
        b.record()
        torch.cuda.synchronize()
        per.append(a.elapsed_time(b) / n)
    return statistics.median(per)


B2B_CALLS, B2B_REPS = 32, 5  # calls per back-to-back series (a model's layers), series


def sdpa_backends():
    from torch.nn.attention import SDPBackend
    return [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]


def run_decode(args, info):
    """The decode table's measurements (unchanged method); returns its results as a dict."""
    from torch.nn.attention import sdpa_kernel

    dev_name = info["name"]
    l2 = info["l2_bytes"]
    ceiling, launch_floor_us = kb.read_ceiling(args.build)
    print("device: %s, %d SMs, L2 %.0f MB; read ceiling %.0f GB/s; empty-kernel launch %.1f us" %
          (dev_name, info["num_sms"], l2 / 1e6, ceiling, launch_floor_us), flush=True)
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    iters = 30 if args.quick else 100
    rot_bytes = 4 * max(l2, 50 << 20)  # rotate over sets totalling well beyond L2
    rows = []
    for (B, L) in shapes:
        kv_bytes = B * L * HK * D * 2 * 2
        nsets = max(1, math.ceil(rot_bytes / kv_bytes))
        ours = our_decode(B, L, nsets)
        row = {"batch": B, "ctx": L, "kv_bytes": kv_bytes, "sets": nsets,
               "chunk": ours.plan_info["kv_chunk_size"], "work": ours.plan_info["num_work"],
               "split": ours.plan_info["split_kv"]}
        # correctness against SDPA (math on the same data, f32) on set 0
        ours.run(0)
        k0, v0 = ours.contiguous_kv(0)
        ref = F.scaled_dot_product_attention(ours.q[0].float().unsqueeze(2), k0.float(), v0.float(),
                                             enable_gqa=True).squeeze(2)
        torch.cuda.synchronize()
        row["max_abs_err"] = float((ours.o.float() - ref).abs().max())
        del k0, v0, ref
        ms = time_calls(ours.run, nsets, iters)
        row["ours_us"] = ms * 1e3
        row["ours_gbs"] = kv_bytes / (ms * 1e-3) / 1e9
        row["ours_frac"] = row["ours_gbs"] / ceiling
        # seed 002's other algorithm (global rowmax) on the same shape and sets
        gr = kb.PagedDecode(B, L, nsets, hq=HQ, hk=HK, d=D, page=PS, algorithm="global_rowmax")
        gr.run(0)
        torch.cuda.synchronize()
        row["global_us"] = time_calls(gr.run, nsets, iters) * 1e3
        gr.free()
        del gr
        if (B, L) in GRAPH_SHAPES:
            g_ours = our_decode(B, L, nsets, graph=True)
            graphs = []
            side = torch.cuda.Stream()
            for s in range(nsets):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=side):  # kvattn runs on the capture stream (current)
                    g_ours.run(s)
                graphs.append(g)
            gms = time_calls(lambda s: graphs[s].replay(), nsets, iters)
            row["graph_us"] = gms * 1e3
            del graphs
            g_ours.free()
            row["b2b_us"] = time_back_to_back(ours.run, nsets, B2B_CALLS, B2B_REPS) * 1e3
        if args.variants:
            h = our_decode(B, L, nsets, hnd=True)
            row["hnd_us"] = time_calls(h.run, nsets, iters) * 1e3
            h.free()
            del h
            print("    HND pages: %.1f us (%.0f GB/s)" % (row["hnd_us"], kv_bytes / row["hnd_us"] / 1e3), flush=True)
        if args.variants and (B, L) in GRAPH_SHAPES:
            # other splits of the same shape: how time depends on the chunk size
            row["variants"] = {}
            for label, flags, fixed in [("nosplit", 1, 0), ("c128", 0, 128), ("c256", 0, 256),
                                        ("c512", 0, 512), ("c1024", 0, 1024), ("c2048", 0, 2048)]:
                try:
                    v = our_decode(B, L, nsets, flags=flags, fixed_chunk=fixed)
                except RuntimeError:  # kvattn.KvattnError: a split the plan refuses
                    continue
                row["variants"][label] = (v.plan_info["num_work"], time_calls(v.run, nsets, iters) * 1e3)
                v.free()
                del v
            print("    variants (work items, us):", row["variants"], flush=True)
        # PyTorch on contiguous KV (its own sets of the same size)
        tq = [ours.q[s].unsqueeze(2) for s in range(nsets)]
        tk = [torch.randn(B, HK, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(nsets)]
        tv = [torch.randn(B, HK, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(nsets)]
        for name, backend in sdpa_backends():
            try:
                with sdpa_kernel([backend]):
                    fn = lambda s: F.scaled_dot_product_attention(tq[s], tk[s], tv[s], enable_gqa=True)
                    fn(0)
                    torch.cuda.synchronize()
                    tms = time_calls(fn, nsets, iters)
                    row[name + "_us"] = tms * 1e3
                    row[name + "_gbs"] = kv_bytes / (tms * 1e-3) / 1e9
                    if (B, L) in GRAPH_SHAPES:
                        row[name + "_b2b_us"] = time_back_to_back(fn, nsets, B2B_CALLS, B2B_REPS) * 1e3
            except Exception as e:  # a backend that refuses the shape (its timed median, if any, kept)
                row.setdefault(name + "_us", None)
                row[name + "_err"] = str(e).splitlines()[0][:120]
        best = min([row[n + "_us"] for n, _ in sdpa_backends() if row.get(n + "_us")] or [float("nan")])
        row["ratio_vs_best_torch"] = best / row["ours_us"]
        fi = FLASHINFER_H200.get((B, L))
        if fi:
            row["flashinfer_h200_gbs"] = max(fi)
        rows.append(row)
        del tq, tk, tv
        ours.free()
        del ours
        torch.cuda.empty_cache()
        print("  %4dx%-6d ours %8.1f us %6.0f GB/s (%.1f%%)%s  flash %s  cudnn %s  ratio %.2f  err %.1e" % (
            B, L, row["ours_us"], row["ours_gbs"], 100 * row["ours_frac"],
            ("  graph %.1f us" % row["graph_us"]) if "graph_us" in row else "",
            ("%.1f us" % row["flash_us"]) if row.get("flash_us") else "n/a",
            ("%.1f us" % row["cudnn_us"]) if row.get("cudnn_us") else "n/a",
            row["ratio_vs_best_torch"], row["max_abs_err"]), flush=True)

    bad = [r for r in rows if not (r["max_abs_err"] < 2e-2)]
    return {"ceiling_gbs": ceiling, "launch_floor_us": launch_floor_us, "rows": rows,
            "failed": [(r["batch"], r["ctx"]) for r in bad]}


def print_decode_table(dev_name, date, res):
    rows, ceiling, launch_floor_us = res["rows"], res["ceiling_gbs"], res["launch_floor_us"]
    print()
    print("## kvattn paged decode vs PyTorch SDPA -- %s, %s, read ceiling %.0f GB/s, empty launch %.1f us" %
          (dev_name, date, ceiling, launch_floor_us))
    print("bf16, %d q / %d kv heads, d=%d, page %d (shuffled); GB/s of K+V read; ratio = best torch time / ours" % (HQ, HK, D, PS))
    print("| batch x ctx | ours us | ours GB/s | % ceil | graph us | global rowmax us | flash GB/s | cuDNN GB/s | ratio | chunk/work |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %d x %d | %.1f | %.0f | %.1f%% | %s | %s | %s | %s | %.2f | %d/%d |" % (
            r["batch"], r["ctx"], r["ours_us"], r["ours_gbs"], 100 * r["ours_frac"],
            ("%.1f" % r["graph_us"]) if "graph_us" in r else "-",
            ("%.1f" % r["global_us"]) if "global_us" in r else "-",
            ("%.0f" % r["flash_gbs"]) if r.get("flash_us") else "n/a",
            ("%.0f" % r["cudnn_gbs"]) if r.get("cudnn_us") else "n/a",
            r["ratio_vs_best_torch"], r["chunk"], r["work"]))
    b2b = [r for r in rows if "b2b_us" in r]
    if b2b:
        print()
        print("Back to back: us per call over %d calls in a row (rotated sets, one pair of events around "
              "the series; median of %d series); ratio = best torch / ours" % (B2B_CALLS, B2B_REPS))
        print("| batch x ctx | ours us/call | flash us/call | cuDNN us/call | ratio |")
        print("|---|---|---|---|---|")
        for r in b2b:
            tb = [r[n + "_b2b_us"] for n, _ in sdpa_backends() if r.get(n + "_b2b_us")]
            print("| %d x %d | %.1f | %s | %s | %s |" % (
                r["batch"], r["ctx"], r["b2b_us"],
                ("%.1f" % r["flash_b2b_us"]) if r.get("flash_b2b_us") else "n/a",
                ("%.1f" % r["cudnn_b2b_us"]) if r.get("cudnn_b2b_us") else "n/a",
                ("%.2f" % (min(tb) / r["b2b_us"])) if tb else "-"))


# ---- decode on model shapes and ragged batches (issue 8) ----------------------------------

# (label, query heads, KV heads, head dim): head configurations of real models
MODEL_SHAPES = [("Llama-3-8B", 32, 8, 128), ("Qwen2-7B", 28, 4, 128), ("Llama-3-70B/TP8", 8, 1, 128),
                ("Llama-2-7B", 32, 32, 128), ("Gemma-2-9B", 16, 8, 256), ("32q/4kv d64", 32, 4, 64),
                ("Phi-3-mini", 32, 32, 96), ("Falcon-7B", 71, 1, 64), ("StarCoder-15B", 48, 1, 128)]
MODEL_BATCHES = [(1, 8192), (1, 32768), (8, 4096), (64, 4096)]
RAGGED_DECODE_SEED = 8


def ragged_decode_batches():
    """The issue's three ragged batches (32 q / 8 kv, d 128): (name, lengths)."""
    import random
    rng = random.Random(RAGGED_DECODE_SEED)
    a = [max(1, min(32768, int(round(rng.lognormvariate(math.log(1500), 1.0))))) for _ in range(95)]
    a.insert(rng.randrange(96), 32768)
    b = [100] * 63
    b.insert(rng.randrange(64), 65536)
    c = [rng.randint(1, 8192) for _ in range(256)]
    return [("(a) 96 log-normal (median 1.5k, sigma 1) + one 32k", a),
            ("(b) one 64k + 63 x 100", b),
            ("(c) 256 uniform 1..8k", c)]


def decode_sets(kv_bytes, l2):
    return max(1, math.ceil(4 * max(l2, 50 << 20) / kv_bytes))


def check_decode_rows(ours, requests, hq, hk):
    """Max |ours - SDPA math (f32)| over the given requests of input set 0."""
    ours.run(0)
    torch.cuda.synchronize()
    err = 0.0
    for b in requests:
        k0, v0 = ours.contiguous_kv(0, request=b)
        q = ours.q[0][b:b + 1].float().unsqueeze(2)
        ref = F.scaled_dot_product_attention(q, k0.float(), v0.float(), enable_gqa=hq != hk).squeeze(2)
        err = max(err, float((ours.o[b:b + 1].float() - ref).abs().max()))
    return err


def time_sdpa(q, ks, vs, nsets, iters, gqa):
    """{backend: us or None, backend_err: text} for SDPA on contiguous K/V sets."""
    from torch.nn.attention import sdpa_kernel
    res = {}
    for name, backend in sdpa_backends():
        try:
            with sdpa_kernel([backend]):
                fn = lambda s: F.scaled_dot_product_attention(q[s], ks[s], vs[s], enable_gqa=gqa)
                fn(0)
                torch.cuda.synchronize()
                res[name] = time_calls(fn, nsets, iters) * 1e3
        except Exception as e:  # a backend that refuses the shape
            res[name] = None
            res[name + "_err"] = str(e).splitlines()[0][:120]
    return res


def run_decode_models(args, info, ceiling):
    """Every model shape at every batch x context, then the ragged batches: ours (paged, page
    16, shuffled) against the best SDPA backend on contiguous K/V."""
    l2 = info["l2_bytes"]
    iters = 30 if args.quick else 100
    rows, ragged = [], []
    only = set(args.models.split(",")) if args.models else None
    for (label, hq, hk, d) in MODEL_SHAPES:
        if only is not None and label not in only:
            continue
        for (B, L) in MODEL_BATCHES:
            kv_bytes = B * L * hk * d * 2 * 2
            nsets = decode_sets(kv_bytes, l2)
            row = {"model": label, "hq": hq, "hk": hk, "d": d, "batch": B, "ctx": L,
                   "kv_bytes": kv_bytes, "sets": nsets}
            try:
                ours = kb.PagedDecode(B, L, nsets, hq=hq, hk=hk, d=d, page=PS)
            except kvattn.KvattnError as e:
                row["ours_error"] = status_text(e)
                rows.append(row)
                print("  %-16s %2d/%-2d d%-3d %3dx%-6d ours: %s" % (label, hq, hk, d, B, L, row["ours_error"]), flush=True)
                continue
            row.update(chunk=ours.plan_info["kv_chunk_size"], work=ours.plan_info["num_work"],
                       split=ours.plan_info["split_kv"])
            row["max_abs_err"] = check_decode_rows(ours, sorted({0, B - 1}), hq, hk)
            ms = time_calls(ours.run, nsets, iters)
            row["ours_us"] = ms * 1e3
            row["ours_frac"] = kv_bytes / (ms * 1e-3) / 1e9 / ceiling
            tq = [ours.q[s].unsqueeze(2) for s in range(nsets)]
            ours.free()
            del ours
            if args.variants:
                # the same pages head-major (KVA_LAYOUT_HND): a head's rows of a page contiguous
                # instead of d * 2 bytes every hk * d * 2 (d96's 192-byte rows, bench/NOTES.md)
                h = kb.PagedDecode(B, L, nsets, hq=hq, hk=hk, d=d, page=PS, hnd=True)
                row["hnd_us"] = time_calls(h.run, nsets, iters) * 1e3
                h.free()
                del h
                print("    HND pages: %.1f us (%.1f%%)" % (row["hnd_us"], 100 * kv_bytes / (row["hnd_us"] * 1e-6) / 1e9 / ceiling),
                      flush=True)
            if args.variants:
                # is the plan's chunk the best one the kernel can run? (issue 8's rows below torch:
                # batch 1 with few KV heads, the large groups, d64 / d96)
                row["variants"] = {}
                for vlabel, no_split, fixed in [("nosplit", True, 0), ("c128", False, 128), ("c256", False, 256),
                                                ("c512", False, 512), ("c1024", False, 1024), ("c2048", False, 2048)]:
                    if fixed and fixed >= L:
                        continue
                    try:
                        v = kb.PagedDecode(B, L, nsets, hq=hq, hk=hk, d=d, page=PS, no_split=no_split,
                                           fixed_chunk=fixed)
                    except kvattn.KvattnError:  # a split the plan refuses
                        continue
                    row["variants"][vlabel] = (v.plan_info["num_work"], round(time_calls(v.run, nsets, iters) * 1e3, 1))
                    v.free()
                    del v
                print("    other splits (work items, us):", row["variants"], flush=True)
            tk = [torch.randn(B, hk, L, d, device="cuda", dtype=torch.bfloat16) for _ in range(nsets)]
            tv = [torch.randn(B, hk, L, d, device="cuda", dtype=torch.bfloat16) for _ in range(nsets)]
            t = time_sdpa(tq, tk, tv, nsets, iters, hq != hk)
            row.update({k + ("" if k.endswith("_err") else "_us"): v for k, v in t.items()})
            best = min([v for n, _ in sdpa_backends() for v in [t.get(n)] if v] or [float("nan")])
            row["best_torch_us"] = best
            row["ratio_vs_best_torch"] = best / row["ours_us"]
            del tq, tk, tv
            torch.cuda.empty_cache()
            rows.append(row)
            print("  %-16s %2d/%-2d d%-3d %3dx%-6d ours %8.1f us (%.1f%%)  flash %s  cudnn %s  ratio %.2f  err %.1e" % (
                label, hq, hk, d, B, L, row["ours_us"], 100 * row["ours_frac"],
                ("%.1f" % t["flash"]) if t.get("flash") else "n/a",
                ("%.1f" % t["cudnn"]) if t.get("cudnn") else "n/a",
                row["ratio_vs_best_torch"], row["max_abs_err"]), flush=True)
    hq, hk, d = HQ, HK, D
    for (name, lens) in ragged_decode_batches():
        B, tokens = len(lens), sum(lens)
        kv_bytes = tokens * hk * d * 2 * 2
        nsets = decode_sets(kv_bytes, l2)
        row = {"name": name, "batch": B, "tokens": tokens, "longest": max(lens), "kv_bytes": kv_bytes,
               "sets": nsets}
        ours = kb.PagedDecode(0, 0, nsets, hq=hq, hk=hk, d=d, page=PS, lens=lens)
        row.update(chunk=ours.plan_info["kv_chunk_size"], work=ours.plan_info["num_work"],
                   split=ours.plan_info["split_kv"])
        longest = max(range(B), key=lambda b: lens[b])
        row["max_abs_err"] = check_decode_rows(ours, sorted({0, B - 1, longest, B // 2}), hq, hk)
        ms = time_calls(ours.run, nsets, iters)
        row["ours_us"] = ms * 1e3
        row["ours_frac"] = kv_bytes / (ms * 1e-3) / 1e9 / ceiling
        q0 = ours.q[0]
        ours.free()
        del ours
        torch.cuda.empty_cache()
        if args.variants:
            # the same batch at other splits: whether the plan's chunk is the best one the kernel
            # can run (issue 8's (b) reads 79% with the plan's 2048-key chunks)
            row["variants"] = {}
            for label, no_split, fixed in [("nosplit", True, 0), ("c512", False, 512), ("c1024", False, 1024),
                                           ("c2048", False, 2048), ("c4096", False, 4096), ("c8192", False, 8192)]:
                try:
                    v = kb.PagedDecode(0, 0, nsets, hq=hq, hk=hk, d=d, page=PS, lens=lens, no_split=no_split,
                                       fixed_chunk=fixed)
                except kvattn.KvattnError:  # a split the plan refuses
                    continue
                vus = time_calls(v.run, nsets, iters) * 1e3
                row["variants"][label] = (v.plan_info["kv_chunk_size"], v.plan_info["num_work"], vus,
                                          kv_bytes / (vus * 1e-6) / 1e9 / ceiling)
                v.free()
                del v
                torch.cuda.empty_cache()
            print("    %s at other splits (chunk, work items, us, fraction of the ceiling):" % name,
                  {k: (c, w, round(t, 1), round(f, 3)) for k, (c, w, t, f) in row["variants"].items()}, flush=True)
        # PyTorch (a): the batch padded to its longest request (no mask: the pad keys are
        # computed, which only flatters torch's time), one set (it is far beyond L2)
        pad_bytes = B * max(lens) * hk * d * 2 * 2
        if pad_bytes <= (24 << 30):
            tk = [torch.randn(B, hk, max(lens), d, device="cuda", dtype=torch.bfloat16)]
            tv = [torch.randn(B, hk, max(lens), d, device="cuda", dtype=torch.bfloat16)]
            t = time_sdpa([q0.unsqueeze(2)], tk, tv, 1, max(10, iters // 5), True)
            row.update({"padded_" + k: v for k, v in t.items()})
            del tk, tv
            torch.cuda.empty_cache()
        # PyTorch (b): one SDPA call per request, contiguous K/V per request
        ks = [torch.randn(1, hk, n, d, device="cuda", dtype=torch.bfloat16) for n in lens]
        vs = [torch.randn(1, hk, n, d, device="cuda", dtype=torch.bfloat16) for n in lens]
        qs = [q0[b:b + 1].unsqueeze(2) for b in range(B)]
        from torch.nn.attention import sdpa_kernel
        for bname, backend in sdpa_backends():
            try:
                with sdpa_kernel([backend]):
                    def loop(_):
                        for b in range(B):
                            F.scaled_dot_product_attention(qs[b], ks[b], vs[b], enable_gqa=True)
                    loop(0)
                    torch.cuda.synchronize()
                    row["loop_" + bname] = time_calls(loop, 1, max(10, iters // 5)) * 1e3
            except Exception as e:
                row["loop_" + bname] = None
                row["loop_" + bname + "_err"] = str(e).splitlines()[0][:120]
        del ks, vs, qs
        torch.cuda.empty_cache()
        cands = {k: v for k, v in row.items() if (k.startswith("padded_") or k.startswith("loop_"))
                 and not k.endswith("_err") and v}
        best_k = min(cands, key=cands.get) if cands else None
        row["best_torch"] = best_k
        row["best_torch_us"] = cands[best_k] if best_k else float("nan")
        row["ratio_vs_best_torch"] = row["best_torch_us"] / row["ours_us"]
        ragged.append(row)
        print("  %s: %d requests, %d tokens: ours %.1f us (%.1f%%), best torch %s %.1f us, ratio %.2f, err %.1e" % (
            name, B, tokens, row["ours_us"], 100 * row["ours_frac"], best_k, row["best_torch_us"],
            row["ratio_vs_best_torch"], row["max_abs_err"]), flush=True)
    bad = [r for r in rows + ragged if "ours_error" in r or not (r["max_abs_err"] < 2e-2)]
    return {"rows": rows, "ragged": ragged, "ceiling_gbs": ceiling,
            "failed": [r.get("model", r.get("name")) for r in bad]}


def print_models_table(dev_name, date, res):
    ceiling = res["ceiling_gbs"]
    print()
    print("## kvattn decode on model shapes vs PyTorch SDPA -- %s, %s, read ceiling %.0f GB/s" %
          (dev_name, date, ceiling))
    print("bf16, page 16 (shuffled); % ceil = K+V bytes / time / ceiling; ratio = best torch time / ours")
    print("| model | q/kv heads, d | batch x ctx | K/V MB | ours us | % ceil | flash us | cuDNN us | ratio | chunk/work |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        if "ours_error" in r:
            print("| %s | %d/%d, %d | %d x %d | %.0f | %s | | | | | |" % (
                r["model"], r["hq"], r["hk"], r["d"], r["batch"], r["ctx"], r["kv_bytes"] / 1e6, r["ours_error"]))
            continue
        print("| %s | %d/%d, %d | %d x %d | %.0f | %.1f | %.1f%% | %s | %s | %.2f | %d/%d |" % (
            r["model"], r["hq"], r["hk"], r["d"], r["batch"], r["ctx"], r["kv_bytes"] / 1e6,
            r["ours_us"], 100 * r["ours_frac"],
            ("%.1f" % r["flash_us"]) if r.get("flash_us") else "n/a",
            ("%.1f" % r["cudnn_us"]) if r.get("cudnn_us") else "n/a",
            r["ratio_vs_best_torch"], r["chunk"], r["work"]))
    print()
    print("## kvattn decode on ragged batches vs PyTorch SDPA -- %s, %s (32 q / 8 kv, d 128, bf16)" % (dev_name, date))
    print("torch: best of the padded batch (no mask) and a loop of one call per request, flash or cuDNN")
    print("| batch | requests | tokens | K/V MB | ours us | % ceil | best torch | torch us | ratio | chunk/work |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in res["ragged"]:
        print("| %s | %d | %d | %.0f | %.1f | %.1f%% | %s | %.1f | %.2f | %d/%d |" % (
            r["name"], r["batch"], r["tokens"], r["kv_bytes"] / 1e6, r["ours_us"], 100 * r["ours_frac"],
            r["best_torch"], r["best_torch_us"], r["ratio_vs_best_torch"], r["chunk"], r["work"]))


# ---- prefill -------------------------------------------------------------------------------

PF_HQ, PF_HK = 32, 8
PF_TOKENS = 16384
PF_SEQS = [512, 2048, 8192, 16384]
# (dtype, head dim); d96 runs on the d128 layout (zero-filled columns; on Hopper with its own d96 products)
PF_SETS = [("bf16", 128), ("f16", 128), ("bf16", 64), ("bf16", 256), ("bf16", 96)]
PF_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
RAGGED_SEED, RAGGED_MEDIAN, RAGGED_SIGMA, RAGGED_LO, RAGGED_HI = 6, 800, 1.0, 16, 8192
CHUNK_NEW, CHUNK_PREFIX, CHUNK_PAGE = 512, 16384, 16
REL_TOL_REF = 1e-2    # ours (or a torch variant) vs the float32 reference, sampled rows
REL_TOL_TORCH = 2e-2  # ours vs a torch output over the whole tensor


def attn_flops(q_lens, kv_lens, causal, hq, d):
    """4 * hq * d FLOPs per visible (query, key) pair (two products, 2 FLOPs per multiply-add);
    causal (bottom-right) sees q*kv - q^2/2 pairs per request: half the square when q == kv."""
    pairs = 0.0
    for q, k in zip(q_lens, kv_lens):
        pairs += q * k - (q * q / 2.0 if causal else 0.0)
    return 4.0 * hq * d * pairs


def ragged_lengths(total):
    """Prompt lengths, log-normal (seeded), clipped, summing to exactly `total`."""
    import random
    rng = random.Random(RAGGED_SEED)
    lens = []
    while sum(lens) < total:
        x = rng.lognormvariate(math.log(RAGGED_MEDIAN), RAGGED_SIGMA)
        lens.append(int(min(RAGGED_HI, max(RAGGED_LO, round(x)))))
    lens[-1] -= sum(lens) - total  # stays >= 1: the sum was < total before the last draw
    if lens[-1] < RAGGED_LO and len(lens) > 1:
        lens[-2] += lens.pop()
    return lens


def cumsum0(xs):
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def rotation_sets(set_bytes, l2):
    """How many input sets: their total >= 4x L2 (at least 50 MB of L2 assumed), >= 2 sets."""
    return max(2, math.ceil(4 * max(l2, 50 << 20) / max(1, set_bytes)))


class OurPrefill:
    """Our prefill of one batch over input sets, through kvattn.BatchPrefillWrapper (which owns
    its workspace). Ragged (k/v [tokens, HK, d], kv_indptr) or paged (pools + page table).
    plan_status / plan_error: the plan's kva_status and text (KvattnError caught), so callers
    can tell KVA_ERR_UNSUPPORTED from an error; run(s) and run_dense(s) raise KvattnError."""

    def __init__(self, hq, hk, d, causal, q_lens, kv_lens, q_sets, o, kv_sets=None, paged=None):
        self.q_lens, self.kv_lens = list(q_lens), list(kv_lens)
        self.causal = bool(causal)
        self.q_sets, self.o = q_sets, o
        self.paged = paged is not None
        self.wrapper = kvattn.BatchPrefillWrapper(str(o.device))
        qo_indptr = cumsum0(q_lens)
        if not self.paged:
            self.kv_sets = kv_sets
            plan = lambda: self.wrapper.plan(qo_indptr, cumsum0(kv_lens), hq, hk, d, causal=self.causal)
        else:
            # paged = (page_indptr, page_indices, last_page_len [host int32 tensors], pools,
            #          num_pages, page_size); pools = [(k_pool, v_pool)] of [pages, ps, HK, d]
            p_indptr, p_idx, p_last, pools, num_pages, ps = paged
            self.pages = [kvattn.KVPages(kp, vp) for kp, vp in pools]
            plan = lambda: self.wrapper.plan(qo_indptr, None, hq, hk, d, page_size=ps,
                                             paged_kv_indptr=p_indptr, paged_kv_indices=p_idx,
                                             paged_kv_last_page_len=p_last, num_pages=num_pages,
                                             causal=self.causal)
        self.plan_status, err = kva_status_of(plan)
        self.plan_error = None
        if self.plan_status != KVA_OK:
            # the wrapper sizes its workspace inside plan(): no workspace means that step failed
            sized = "device_bytes" in self.wrapper.plan_info
            self.plan_error = ("plan: " if sized else "workspace size: ") + err

    def plan_info(self):
        p = self.wrapper.plan_info
        return {"qo_tile": p["qo_tile_size"], "kv_chunk": p["kv_chunk_size"], "work": p["num_work"],
                "split_kv": p["split_kv"]}

    def run(self, s):
        if self.paged:
            self.wrapper.run(self.q_sets[s], self.pages[s], out=self.o)
        else:
            self.wrapper.run(self.q_sets[s], self.kv_sets[s][0], self.kv_sets[s][1], out=self.o)

    def run_dense(self, s):
        """kva_attention (no plan) on the same set; batch 1, ragged inputs only."""
        k, v = self.kv_sets[s]
        kvattn.attention(self.q_sets[s], k, v, causal=self.causal, out=self.o, planned=False)

    def free(self):
        self.wrapper = None  # frees the workspace (after waiting for runs in flight)


def reference_rows(q, k, v, rows, causal, group):
    """float32 attention of one request for the query rows `rows` (LongTensor on the GPU).
    q: [q_len, HQ, d], k, v: [kv_len, HK, d] (any float dtype); bottom-right causal."""
    q_len, kv_len, d = q.shape[0], k.shape[0], q.shape[2]
    qf = q[rows].float()
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    s = torch.einsum("rhd,khd->hrk", qf, kf) * (1.0 / math.sqrt(d))
    if causal:
        qpos = rows + (kv_len - q_len)
        kpos = torch.arange(kv_len, device=q.device)
        s.masked_fill_((kpos[None, :] > qpos[:, None])[None], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("hrk,khd->rhd", p, vf)


def sample_rows(q_len, gen):
    """First 32, last 32 and 64 random query rows (sorted, unique)."""
    idx = set(range(min(32, q_len))) | set(range(max(0, q_len - 32), q_len))
    if q_len > 64:
        idx |= set(torch.randint(0, q_len, (64,), generator=gen).tolist())
    return torch.tensor(sorted(idx), dtype=torch.long, device="cuda")


class Check:
    """Reference data of one case on input set 0: sampled rows' float32 outputs per request."""

    def __init__(self, q, k, v, q_lens, kv_lens, causal, group, requests):
        qi, ki = cumsum0(q_lens), cumsum0(kv_lens)
        gen = torch.Generator(device="cpu").manual_seed(99)
        self.q_lens, self.qi = q_lens, qi
        self.samples = []  # (request, rows, reference [R, HQ, d] f32)
        for b in requests:
            rows = sample_rows(q_lens[b], gen)
            ref = reference_rows(q[qi[b]:qi[b + 1]], k[ki[b]:ki[b + 1]], v[ki[b]:ki[b + 1]],
                                 rows, causal, group)
            self.samples.append((b, rows, ref))

    def rel_err(self, per_request):
        """||x - ref|| / ||ref|| over the sampled rows; per_request(b) -> [q_len_b, HQ, d]."""
        num = den = 0.0
        for b, rows, ref in self.samples:
            x = per_request(b)[rows].float()
            if not bool(torch.isfinite(x).all()):
                return float("inf")
            num += float(((x - ref) ** 2).sum())
            den += float((ref ** 2).sum())
        return math.sqrt(num / max(den, 1e-30))

    def compare(self, o_ours, per_request):
        """Whole-tensor comparison of ours ([tokens, HQ, d]) with a torch output:
        (relative L2 difference, max abs difference)."""
        num = den = 0.0
        mx = 0.0
        for b in range(len(self.q_lens)):
            a = o_ours[self.qi[b]:self.qi[b + 1]].float()
            t = per_request(b).float()
            dlt = a - t
            num += float((dlt ** 2).sum())
            den += float((t ** 2).sum())
            if dlt.numel():
                m = float(dlt.abs().max())
                mx = float("nan") if (m != m or mx != mx) else max(mx, m)  # NaN sticks
        return math.sqrt(num / max(den, 1e-30)), mx


class TorchVariant:
    """One way of running a case through PyTorch: fn(s) -> output; per_request(out, b) -> the
    output rows of request b as [q_len_b, HQ, d]; backend = SDPBackend (entered around calls)."""

    def __init__(self, name, column, backend, fn, per_request, note=""):
        self.name, self.column, self.backend = name, column, backend
        self.fn, self.per_request, self.note = fn, per_request, note


def run_torch_variant(tv, check, nsets, iters, o_ours, kva_ok):
    """Checks and times one torch variant; returns a result dict (time or why not)."""
    from torch.nn.attention import sdpa_kernel
    res = {"name": tv.name, "column": tv.column, "note": tv.note}
    try:
        with sdpa_kernel([tv.backend]):
            out = tv.fn(0)
            torch.cuda.synchronize()
            rel = check.rel_err(lambda b: tv.per_request(out, b))
            res["rel_err_ref"] = rel
            if kva_ok:
                res["rel_vs_ours"], res["max_abs_vs_ours"] = check.compare(
                    o_ours, lambda b: tv.per_request(out, b))
            del out
            if not rel < REL_TOL_REF:
                res["error"] = "wrong output (rel err %.2e vs float32 reference)" % rel
                return res
            res["ms"] = time_calls(tv.fn, nsets, iters, warmup=3, burst_ms=BURST_MS)
            res["calls"] = LAST_ITERS
            res["mhz"] = LAST_MHZ
    except Exception as e:  # a backend that refuses the shape, mask or GQA
        res["error"] = (str(e).strip().splitlines() or ["?"])[0][:160]
        res.pop("ms", None)
    return res


def make_gqa_variants(F, name_col_backend, q, k, v, extra_kw, per_request, note):
    """SDPA with enable_gqa=True per backend (time_torch retries a refusal with K/V heads
    repeated)."""
    variants = []
    for name, column, backend in name_col_backend:
        variants.append(TorchVariant(
            name, column, backend,
            (lambda s, q=q, k=k, v=v: F.scaled_dot_product_attention(
                q[s], k[s], v[s], enable_gqa=True, **extra_kw)),
            per_request, note + " enable_gqa=True"))
    return variants


def repeated_variant(F, tv, q, k, v, group, extra_kw):
    """The same variant with K/V heads repeated (for a backend that refuses enable_gqa)."""
    k_rep = [x.repeat_interleave(group, dim=1) for x in k]
    v_rep = [x.repeat_interleave(group, dim=1) for x in v]
    fn = lambda s: F.scaled_dot_product_attention(q[s], k_rep[s], v_rep[s], **extra_kw)
    return TorchVariant(tv.name + "+rep", tv.column, tv.backend, fn, tv.per_request,
                        tv.note.replace("enable_gqa=True", "K/V heads repeated")), (k_rep, v_rep)


def time_torch(F, variants, rep_inputs, check, nsets, iters, o_ours, kva_ok):
    """Runs every variant; a GQA SDPA variant that fails is retried with repeated K/V heads."""
    results = []
    for tv in variants:
        r = run_torch_variant(tv, check, nsets, iters, o_ours, kva_ok)
        if "error" in r and tv.name in rep_inputs and "wrong output" not in r["error"]:
            q, k, v, group, kw = rep_inputs[tv.name]
            try:
                tv2, keep = repeated_variant(F, tv, q, k, v, group, kw)
                r2 = run_torch_variant(tv2, check, nsets, iters, o_ours, kva_ok)
                r2["gqa_error"] = r["error"]
                r = r2
                del keep
            except Exception as e:  # out of memory for the repeated heads, ...
                r["error_rep"] = str(e).splitlines()[0][:160] if str(e) else "?"
        results.append(r)
    torch.cuda.empty_cache()
    return results


def best_by_column(results):
    """{column: (ms, variant name)} of the fastest correct variant per column."""
    best = {}
    for r in results:
        if r.get("ms") is None:
            continue
        c = r["column"]
        if c not in best or r["ms"] < best[c][0]:
            best[c] = (r["ms"], r["name"])
    return best


def first_ok_output(results):
    for r in results:
        if "rel_vs_ours" in r and r.get("rel_err_ref", 1.0) < REL_TOL_REF:
            return r
    return None


def finish_case(row, ours_res, torch_res, flops, gemm_tflops):
    """Fills the row's derived numbers and verdict from ours' and torch's results."""
    row["flops"] = flops
    row["torch"] = torch_res
    best = best_by_column(torch_res)
    for col in ("flash", "cudnn"):
        if col in best:
            row[col + "_ms"], row[col + "_variant"] = best[col]
            row[col + "_tflops"] = flops / (best[col][0] * 1e-3) / 1e12
            row[col + "_mhz"] = next((r.get("mhz") for r in torch_res if r["name"] == best[col][1]
                                      and r["column"] == col), None)
    row.update(ours_res)
    ref = first_ok_output(torch_res)
    if ref is not None:
        row["rel_vs_torch"], row["max_abs_vs_torch"] = ref["rel_vs_ours"], ref["max_abs_vs_ours"]
        row["compared_with"] = ref["name"]
    if row.get("ours_state") == "ok":
        wrong = []
        if not row.get("finite", False):
            wrong.append("non-finite or unwritten outputs")
        if not row.get("rel_err_ref", float("inf")) < REL_TOL_REF:
            wrong.append("rel err %.2e vs float32 reference" % row.get("rel_err_ref", float("inf")))
        if ref is not None and not row["rel_vs_torch"] < REL_TOL_TORCH:
            wrong.append("rel diff %.2e vs %s" % (row["rel_vs_torch"], ref["name"]))
        if wrong:
            row["ours_state"] = "WRONG"
            row["ours_error"] = "; ".join(wrong)
            row.pop("ours_ms", None)
            row.pop("dense_ms", None)
    if row.get("ours_ms"):
        row["ours_tflops"] = flops / (row["ours_ms"] * 1e-3) / 1e12
        row["ours_frac_gemm"] = row["ours_tflops"] / gemm_tflops if gemm_tflops else None
        if row.get("flash_ms"):
            row["flash_over_ours"] = row["flash_ms"] / row["ours_ms"]
        tb = [row[c + "_ms"] for c in ("flash", "cudnn") if row.get(c + "_ms")]
        if tb:
            row["best_torch_over_ours"] = min(tb) / row["ours_ms"]
    if row.get("dense_ms"):
        row["dense_tflops"] = flops / (row["dense_ms"] * 1e-3) / 1e12
    return row


def ours_check_and_time(ours, check, o, nsets, iters, dense=False):
    """Plan status, poisoned check run, accuracy, then timing; never raises for a kvattn
    status. Returns a dict: ours_state ok / unsupported / error, numbers when ok."""
    res = {}
    if ours.plan_status != KVA_OK:
        res["ours_state"] = "unsupported" if ours.plan_status == KVA_ERR_UNSUPPORTED else "error"
        res["ours_error"] = ours.plan_error
        return res
    res["plan"] = ours.plan_info()
    o.fill_(float("nan"))
    st, err = kva_status_of(lambda: ours.run(0))
    torch.cuda.synchronize()
    if st != KVA_OK:
        res["ours_state"] = "unsupported" if st == KVA_ERR_UNSUPPORTED else "error"
        res["ours_error"] = "run: " + err
        return res
    res["ours_state"] = "ok"
    res["finite"] = bool(torch.isfinite(o).all())
    qi = check.qi
    res["rel_err_ref"] = check.rel_err(lambda b: o[qi[b]:qi[b + 1]])
    if res["finite"] and res["rel_err_ref"] < REL_TOL_REF:
        def fn(s):
            try:
                ours.run(s)
            except kvattn.KvattnError as e:
                raise RuntimeError("kvattn prefill run: " + status_text(e))
        res["ours_ms"] = time_calls(fn, nsets, iters, warmup=3, burst_ms=BURST_MS)
        res["ours_calls"] = LAST_ITERS
        res["ours_mhz"] = LAST_MHZ
    if dense:
        o.fill_(float("nan"))
        st, err = kva_status_of(lambda: ours.run_dense(0))
        torch.cuda.synchronize()
        if st != KVA_OK:
            res["dense_state"] = "unsupported" if st == KVA_ERR_UNSUPPORTED else "error"
            res["dense_error"] = err
        else:
            fin = bool(torch.isfinite(o).all())
            rel = check.rel_err(lambda b: o[qi[b]:qi[b + 1]])
            res["dense_rel_err_ref"] = rel
            if fin and rel < REL_TOL_REF:
                res["dense_state"] = "ok"

                def fn_dense(s):
                    try:
                        ours.run_dense(s)
                    except kvattn.KvattnError as e:
                        raise RuntimeError("kva_attention: " + status_text(e))
                res["dense_ms"] = time_calls(fn_dense, nsets, iters, warmup=3, burst_ms=BURST_MS)
                res["dense_calls"] = LAST_ITERS
            else:
                res["dense_state"] = "WRONG"
    # leave o holding set 0's result of the planned path for the whole-tensor comparison with
    # torch (the timed calls and the dense run overwrote it)
    st, err = kva_status_of(lambda: ours.run(0))
    if st != KVA_OK:
        raise RuntimeError("kvattn prefill run: " + err)
    torch.cuda.synchronize()
    return res


def backends_list():
    from torch.nn.attention import SDPBackend
    return [("flash", "flash", SDPBackend.FLASH_ATTENTION),
            ("cudnn", "cudnn", SDPBackend.CUDNN_ATTENTION)]


class EqualRow:
    """The inputs of an equal-length row (B requests of S tokens, PF_HQ / PF_HK heads): `sets`
    rotated input sets (enough to exceed L2 4x) of q [T, HQ, d], k / v [T, HK, d] in the dtype,
    one output o, and torch's contiguous [B, heads, S, d] copies tq / tk / tv (made on demand)."""

    def __init__(self, dname, d, B, S, l2):
        tdt = PF_DTYPES[dname]
        self.B, self.S, self.d, T = B, S, d, B * S
        self.sets = rotation_sets(T * (PF_HQ + 2 * PF_HK) * d * 2, l2)
        self.q = [torch.randn(T, PF_HQ, d, device="cuda", dtype=tdt) for _ in range(self.sets)]
        self.k = [torch.randn(T, PF_HK, d, device="cuda", dtype=tdt) for _ in range(self.sets)]
        self.v = [torch.randn(T, PF_HK, d, device="cuda", dtype=tdt) for _ in range(self.sets)]
        self.o = torch.empty(T, PF_HQ, d, device="cuda", dtype=tdt)
        self.tq = self.tk = self.tv = None

    def torch_layout(self):
        """(tq, tk, tv): the sets as [B, heads, S, d] contiguous copies."""
        if self.tq is None:
            B, S, d = self.B, self.S, self.d
            self.tq = [x.view(B, S, PF_HQ, d).transpose(1, 2).contiguous() for x in self.q]
            self.tk = [x.view(B, S, PF_HK, d).transpose(1, 2).contiguous() for x in self.k]
            self.tv = [x.view(B, S, PF_HK, d).transpose(1, 2).contiguous() for x in self.v]
        return self.tq, self.tk, self.tv

    def ours(self, causal):
        return OurPrefill(PF_HQ, PF_HK, self.d, causal, [self.S] * self.B, [self.S] * self.B, self.q, self.o,
                          kv_sets=list(zip(self.k, self.v)))

    def cudnn(self, causal):
        """fn(set): SDPA on cuDNN (enable_gqa) over the torch-layout sets."""
        from torch.nn.attention import SDPBackend, sdpa_kernel
        tq, tk, tv = self.torch_layout()

        def fn(s):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                F.scaled_dot_product_attention(tq[s], tk[s], tv[s], is_causal=causal, enable_gqa=True)
        return fn


def case_equal(F, dname, d, B, S, causal, l2, iters, gemm):
    """One row of the main table: B requests of S tokens each (q_len = kv_len = S)."""
    hq, hk, g = PF_HQ, PF_HK, PF_HQ // PF_HK
    x = EqualRow(dname, d, B, S, l2)
    nsets, q, k, v, o = x.sets, x.q, x.k, x.v, x.o
    row = {"kind": "equal", "dtype": dname, "d": d, "batch": B, "seq": S,
           "causal": bool(causal), "sets": nsets}
    lens = [S] * B
    check = Check(q[0], k[0], v[0], lens, lens, causal, g, sorted({0, B - 1}))
    ours = x.ours(causal)
    ours_res = ours_check_and_time(ours, check, o, nsets, iters, dense=(B == 1))
    # torch: contiguous [B, heads, S, d] copies of the same sets
    tq, tk, tv = x.torch_layout()
    per_req = lambda out, b: out[b].transpose(0, 1)
    kw = {"is_causal": bool(causal)}
    variants = make_gqa_variants(F, backends_list(), tq, tk, tv, kw, per_req,
                                 "SDPA on contiguous [%d, heads, %d, d], is_causal=%s," % (B, S, bool(causal)))
    rep = {tvar.name: (tq, tk, tv, g, kw) for tvar in variants}
    torch_res = time_torch(F, variants, rep, check, nsets, iters, o, ours_res.get("ours_state") == "ok")
    row = finish_case(row, ours_res, torch_res, attn_flops(lens, lens, causal, hq, d), gemm)
    ours.free()
    del q, k, v, o, tq, tk, tv, ours, check, x
    torch.cuda.empty_cache()
    return row


def case_ragged(F, l2, iters, gemm, dname="bf16", d=128, causal=True):
    """Prompts of log-normal lengths, 16384 tokens in all, one ragged plan; torch padded, looped
    and (flash) varlen."""
    tdt = PF_DTYPES[dname]
    hq, hk, g = PF_HQ, PF_HK, PF_HQ // PF_HK
    lens = ragged_lengths(PF_TOKENS)
    B, T, M = len(lens), sum(lens), max(lens)
    qi = cumsum0(lens)
    nsets = rotation_sets(T * (hq + 2 * hk) * d * 2, l2)
    row = {"kind": "ragged", "dtype": dname, "d": d, "batch": B, "seq": M, "lens": lens,
           "tokens": T, "causal": bool(causal), "sets": nsets}
    q = [torch.randn(T, hq, d, device="cuda", dtype=tdt) for _ in range(nsets)]
    k = [torch.randn(T, hk, d, device="cuda", dtype=tdt) for _ in range(nsets)]
    v = [torch.randn(T, hk, d, device="cuda", dtype=tdt) for _ in range(nsets)]
    o = torch.empty(T, hq, d, device="cuda", dtype=tdt)
    longest = max(range(B), key=lambda b: lens[b])
    check = Check(q[0], k[0], v[0], lens, lens, causal, g, sorted({0, B - 1, longest}))
    ours = OurPrefill(hq, hk, d, causal, lens, lens, q, o, kv_sets=list(zip(k, v)))
    ours_res = ours_check_and_time(ours, check, o, nsets, iters)

    def padded(x, h):  # [B, h, M, d], random padding (right), request b's rows at [b, :, :len]
        p = torch.randn(B, h, M, d, device="cuda", dtype=tdt)
        for b in range(B):
            p[b, :, :lens[b]] = x[qi[b]:qi[b + 1]].transpose(0, 1)
        return p
    pq = [padded(x, hq) for x in q]
    pk = [padded(x, hk) for x in k]
    pv = [padded(x, hk) for x in v]
    kw = {"is_causal": bool(causal)}
    per_pad = lambda out, b: out[b, :, :lens[b]].transpose(0, 1)
    variants, rep = [], {}
    for name, col, backend in backends_list():
        vp = TorchVariant(
            name + "-padded", col, backend,
            lambda s: F.scaled_dot_product_attention(pq[s], pk[s], pv[s], enable_gqa=True, **kw),
            per_pad, "SDPA on the right-padded batch [%d, heads, %d, d], is_causal, enable_gqa=True" % (B, M))
        variants.append(vp)
        rep[vp.name] = (pq, pk, pv, g, kw)

        def loop(s):
            return [F.scaled_dot_product_attention(pq[s][b:b + 1, :, :lens[b]],
                                                   pk[s][b:b + 1, :, :lens[b]],
                                                   pv[s][b:b + 1, :, :lens[b]],
                                                   enable_gqa=True, **kw) for b in range(B)]
        variants.append(TorchVariant(name + "-loop", col, backend, loop,
                                     lambda out, b: out[b][0].transpose(0, 1),
                                     "one SDPA call per request (%d calls), is_causal, enable_gqa=True" % B))
    # FA2's varlen kernel as torch ships it (cu_seqlens; GQA native; causal bottom-right)
    from torch.nn.attention import SDPBackend
    cu = torch.tensor(qi, dtype=torch.int32, device="cuda")

    def varlen(s):
        return torch.ops.aten._flash_attention_forward(q[s], k[s], v[s], cu, cu, M, M, 0.0,
                                                       bool(causal), False)[0]
    variants.append(TorchVariant("flash-varlen", "flash", SDPBackend.FLASH_ATTENTION, varlen,
                                 lambda out, b: out[qi[b]:qi[b + 1]],
                                 "torch.ops.aten._flash_attention_forward with cu_seqlens"))
    torch_res = time_torch(F, variants, rep, check, nsets, iters, o, ours_res.get("ours_state") == "ok")
    row = finish_case(row, ours_res, torch_res, attn_flops(lens, lens, causal, hq, d), gemm)
    ours.free()
    del q, k, v, o, pq, pk, pv, ours, check
    torch.cuda.empty_cache()
    return row


def case_chunked(F, l2, iters, gemm, dname="bf16", d=128):
    """512 new tokens over a 16384-token cached prefix (kv_len 16896), causal bottom-right.
    Ours paged (page 16, shuffled), then ours on the same keys contiguous (ragged plan, the
    issue's comparison); torch on contiguous K/V."""
    tdt = PF_DTYPES[dname]
    hq, hk, g = PF_HQ, PF_HK, PF_HQ // PF_HK
    nq, nk, ps = CHUNK_NEW, CHUNK_PREFIX + CHUNK_NEW, CHUNK_PAGE
    num_pages = (nk + ps - 1) // ps
    nsets = rotation_sets(num_pages * ps * hk * d * 2 * 2 + nq * hq * d * 2, l2)
    row = {"kind": "chunked", "dtype": dname, "d": d, "batch": 1, "seq": nq, "kv_len": nk,
           "page_size": ps, "causal": True, "sets": nsets}
    gen = torch.Generator(device="cpu").manual_seed(4242)
    perm = torch.randperm(num_pages, generator=gen).to(torch.int32)
    p_indptr = torch.tensor([0, num_pages], dtype=torch.int32)
    p_last = torch.tensor([nk - (num_pages - 1) * ps], dtype=torch.int32)
    q = [torch.randn(nq, hq, d, device="cuda", dtype=tdt) for _ in range(nsets)]
    kp = [torch.randn(num_pages, ps, hk, d, device="cuda", dtype=tdt) for _ in range(nsets)]
    vp = [torch.randn(num_pages, ps, hk, d, device="cuda", dtype=tdt) for _ in range(nsets)]
    o = torch.empty(nq, hq, d, device="cuda", dtype=tdt)
    idx = perm.long().cuda()
    # logical K/V, [kv_len, HK, d] contiguous (NHD), gathered through the page table
    k = [x[idx].reshape(num_pages * ps, hk, d)[:nk].contiguous() for x in kp]
    v = [x[idx].reshape(num_pages * ps, hk, d)[:nk].contiguous() for x in vp]
    check = Check(q[0], k[0], v[0], [nq], [nk], True, g, [0])
    ours = OurPrefill(hq, hk, d, True, [nq], [nk], q, o,
                      paged=(p_indptr, perm, p_last, list(zip(kp, vp)), num_pages, ps))
    ours_res = ours_check_and_time(ours, check, o, nsets, iters)
    from torch.nn.attention import SDPBackend
    from torch.nn.attention.bias import causal_lower_right
    tq = [x.transpose(0, 1).unsqueeze(0).contiguous() for x in q]   # [1, HQ, nq, d]
    tk = [x.transpose(0, 1).unsqueeze(0).contiguous() for x in k]   # [1, HK, nk, d]
    tv = [x.transpose(0, 1).unsqueeze(0).contiguous() for x in v]
    per_req = lambda out, b: out[0].transpose(0, 1)
    bias = causal_lower_right(nq, nk)
    # True = visible: key j <= query i's position nk - nq + i
    mask = (torch.arange(nk, device="cuda")[None, :] <=
            torch.arange(nq, device="cuda")[:, None] + (nk - nq))
    kw_flash, kw_cudnn = {"attn_mask": bias}, {"attn_mask": mask}
    variants = [
        TorchVariant("flash-lower-right", "flash", SDPBackend.FLASH_ATTENTION,
                     lambda s: F.scaled_dot_product_attention(tq[s], tk[s], tv[s], enable_gqa=True, **kw_flash),
                     per_req, "SDPA, attn_mask=causal_lower_right(%d, %d), enable_gqa=True" % (nq, nk)),
        TorchVariant("cudnn-mask", "cudnn", SDPBackend.CUDNN_ATTENTION,
                     lambda s: F.scaled_dot_product_attention(tq[s], tk[s], tv[s], enable_gqa=True, **kw_cudnn),
                     per_req, "SDPA, explicit bottom-right bool mask [%d, %d], enable_gqa=True" % (nq, nk)),
    ]
    rep = {"flash-lower-right": (tq, tk, tv, g, kw_flash), "cudnn-mask": (tq, tk, tv, g, kw_cudnn)}
    cq = torch.tensor([0, nq], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, nk], dtype=torch.int32, device="cuda")

    def varlen(s):
        return torch.ops.aten._flash_attention_forward(q[s], k[s], v[s], cq, ck, nq, nk, 0.0,
                                                       True, False)[0]
    variants.append(TorchVariant("flash-varlen", "flash", SDPBackend.FLASH_ATTENTION, varlen,
                                 lambda out, b: out,
                                 "torch.ops.aten._flash_attention_forward (FA2, bottom-right causal)"))
    torch_res = time_torch(F, variants, rep, check, nsets, iters, o, ours_res.get("ours_state") == "ok")
    row = finish_case(row, ours_res, torch_res, attn_flops([nq], [nk], True, hq, d), gemm)
    ours.free()
    # ours on the same keys contiguous (a ragged plan), what the prefill issue compares the paged
    # row with (after torch, which compares its output with ours' in o)
    contig = OurPrefill(hq, hk, d, True, [nq], [nk], q, o, kv_sets=list(zip(k, v)))
    contig_res = ours_check_and_time(contig, check, o, nsets, iters)
    contig.free()
    if contig_res.get("ours_ms"):
        row["ours_contig_ms"] = contig_res["ours_ms"]
    else:  # (failed, unsupported or inaccurate: said in the notes)
        row["ours_contig_error"] = "%s, rel err %s: %s" % (
            contig_res.get("ours_state"), contig_res.get("rel_err_ref"), contig_res.get("ours_error", ""))
    del q, kp, vp, k, v, o, tq, tk, tv, ours, check, mask
    torch.cuda.empty_cache()
    return row


def gemm_rate(dtype, iters, n=8192):
    """TFLOP/s of torch.matmul n^3 (cuBLAS) on random data, median, 2 operand sets."""
    a = [torch.randn(n, n, device="cuda", dtype=dtype) for _ in range(2)]
    b = [torch.randn(n, n, device="cuda", dtype=dtype) for _ in range(2)]
    c = torch.empty(n, n, device="cuda", dtype=dtype)
    ms = time_calls(lambda s: torch.matmul(a[s], b[s], out=c), 2, iters, warmup=5, burst_ms=BURST_MS)
    del a, b, c
    torch.cuda.empty_cache()
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12, LAST_MHZ


def mma_rate(build, dtype, iters, groups=200):
    """(TFLOP/s, MHz) of the tensor cores' widest wgmma issued back to back on random operands
    (bench/mma_ceiling.cu, libkvattn_mma_ceiling.so in `build`), timed like the GEMM; None where
    the library, the build (not sm_90a) or the device has no wgmma."""
    import ctypes
    path = os.path.join(build, "libkvattn_mma_ceiling.so")
    if not os.path.exists(path):
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:  # (a library built for another toolkit: the table goes on without it)
        print("prefill: tensor-core ceiling not measured: %s" % e, flush=True)
        return None
    sink = torch.zeros(1 << 16, dtype=torch.float32, device="cuda")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    flops = ctypes.c_double(0.0)
    code = 0 if dtype == torch.bfloat16 else 1

    def fn(_):
        err = lib.kva_bench_mma(code, groups, ctypes.c_void_p(sink.data_ptr()), stream, ctypes.byref(flops))
        if err != 0:
            raise RuntimeError("mma ceiling kernel: %d" % err)

    try:
        fn(0)
        torch.cuda.synchronize()
    except RuntimeError:
        return None
    if sink[0].item() == -1.0:
        return None
    ms = time_calls(fn, 1, iters, warmup=5, burst_ms=BURST_MS)
    return flops.value / (ms * 1e-3) / 1e12, LAST_MHZ


def row_label(r):
    if r["kind"] == "ragged":
        return "ragged %d req, %d tok (max %d)" % (r["batch"], r["tokens"], r["seq"])
    if r["kind"] == "chunked":
        return "chunk %d over %d (paged %d)" % (r["seq"], r["kv_len"] - r["seq"], r["page_size"])
    return "%d x %d" % (r["batch"], r["seq"])


def ours_cell(r):
    st = r.get("ours_state")
    if st == "ok" and r.get("ours_ms"):
        return "%.3f" % r["ours_ms"], "%.0f" % r["ours_tflops"], (
            "%.0f%%" % (100 * r["ours_frac_gemm"]) if r.get("ours_frac_gemm") else "-") + (
            " / %.0f%%" % (100 * r["ours_frac_mma"]) if r.get("ours_frac_mma") else "")
    if st == "unsupported":
        return "unsupported", "-", "-"
    if st == "WRONG":
        return "WRONG", "-", "-"
    if st == "aborted":
        return "aborted", "-", "-"
    return "error", "-", "-"


def prefill_line(r):
    ms, tf, frac = ours_cell(r)
    return "  %-5s d%-3d %-34s %-6s ours %11s ms %5s TFLOP/s %4s  flash %s  cudnn %s%s" % (
        r["dtype"], r["d"], row_label(r), "causal" if r["causal"] else "full", ms, tf, frac,
        ("%.0f" % r["flash_tflops"]) if r.get("flash_tflops") else "n/a",
        ("%.0f" % r["cudnn_tflops"]) if r.get("cudnn_tflops") else "n/a",
        ("  [%s]" % r["ours_error"]) if r.get("ours_error") else "")


def run_prefill(args, info):
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference stays float32
    l2 = info["l2_bytes"]
    iters = 10 if args.quick else 30
    gemm_bf16, gemm_mhz = gemm_rate(torch.bfloat16, iters)
    gemm_calls = LAST_ITERS
    gemm_f16, _ = gemm_rate(torch.float16, iters)
    print("prefill: bf16 GEMM 8192^3 %.0f TFLOP/s, f16 %.0f TFLOP/s (median of %d calls)%s" %
          (gemm_bf16, gemm_f16, gemm_calls, (", bf16 at %d MHz" % gemm_mhz) if gemm_mhz else ""), flush=True)
    mma = {n: mma_rate(args.build, t, iters) for n, t in (("bf16", torch.bfloat16), ("f16", torch.float16))}
    if mma["bf16"]:
        print("prefill: tensor-core ceiling (wgmma m64n256k16 back to back, random operands) bf16 %.0f "
              "TFLOP/s%s, f16 %.0f" % (mma["bf16"][0], (" at %d MHz" % mma["bf16"][1]) if mma["bf16"][1] else "",
                                       mma["f16"][0] if mma["f16"] else float("nan")), flush=True)
    seqs = [int(x) for x in args.seqs.split(",")] if args.seqs else PF_SEQS
    sets = PF_SETS
    if args.prefill_sets:
        sets = [(s.split(":")[0], int(s.split(":")[1])) for s in args.prefill_sets.split(",")]
    cases = []
    for dname, d in sets:
        for S in seqs:
            for causal in (True, False):
                cases.append(("equal", dname, d, PF_TOKENS // S, S, causal))
    if not args.no_extra_rows:
        cases.append(("ragged",))
        cases.append(("chunked",))
    rows = []
    aborted = None
    for c in cases:
        if aborted:
            break
        try:
            if c[0] == "equal":
                _, dname, d, B, S, causal = c
                r = case_equal(F, dname, d, B, S, causal, l2, iters, gemm_bf16)
            elif c[0] == "ragged":
                r = case_ragged(F, l2, iters, gemm_bf16)
            else:
                r = case_chunked(F, l2, iters, gemm_bf16)
        except Exception as e:  # a CUDA error, out of memory, ...: record it, go on if possible
            msg = (str(e).strip().splitlines() or ["?"])[0][:200]
            r = {"kind": c[0], "dtype": c[1] if c[0] == "equal" else "bf16",
                 "d": c[2] if c[0] == "equal" else 128, "batch": c[3] if c[0] == "equal" else 0,
                 "seq": c[4] if c[0] == "equal" else 0, "causal": c[5] if c[0] == "equal" else True,
                 "ours_state": "error", "ours_error": "exception: " + msg}
            if c[0] == "ragged":
                r.update({"tokens": PF_TOKENS, "seq": 0})
            if c[0] == "chunked":
                r.update({"seq": CHUNK_NEW, "kv_len": CHUNK_PREFIX + CHUNK_NEW, "page_size": CHUNK_PAGE})
            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception:  # the context is gone (sticky CUDA error): stop here
                aborted = msg
        rows.append(r)
        print(prefill_line(r), flush=True)
    if aborted:
        print("prefill: aborted after a CUDA error: %s" % aborted, flush=True)
    for r in rows:  # the fraction of the row's dtype's tensor-core ceiling, where measured
        peak = mma.get(r.get("dtype"))
        if peak and r.get("ours_tflops"):
            r["ours_frac_mma"] = r["ours_tflops"] / peak[0]
            if r["ours_frac_mma"] > 1.0:
                print("WARNING: %s d%d %s at %.0f%% of the tensor-core ceiling: the ceiling is wrong" % (
                    r["dtype"], r["d"], row_label(r), 100 * r["ours_frac_mma"]), flush=True)
    return {"gemm_bf16_tflops": gemm_bf16, "gemm_f16_tflops": gemm_f16, "gemm_bf16_mhz": gemm_mhz, "iters": iters,
            "mma_bf16_tflops": mma["bf16"][0] if mma["bf16"] else None,
            "mma_f16_tflops": mma["f16"][0] if mma["f16"] else None,
            "mma_bf16_mhz": mma["bf16"][1] if mma["bf16"] else None,
            "burst_ms": BURST_MS, "gemm_calls": gemm_calls, "rows": rows, "aborted": aborted,
            "flops_formula": "4 * heads_q * d * sum_b(q_b * kv_b) full; causal "
                             "4 * heads_q * d * sum_b(q_b * kv_b - q_b^2 / 2) "
                             "(= 4 * seq^2 * heads * d * batch / 2 for q = kv = seq)"}


SUSTAINED_ROWS = [("bf16", 128, 1, 16384, True), ("bf16", 128, 1, 16384, False), ("bf16", 128, 2, 8192, False),
                  ("bf16", 256, 1, 16384, False)]


def run_prefill_sustained(seconds, l2):
    """The headline rows in the power-limited state a server at full load runs in: the bf16
    8192^3 GEMM, then ours and cuDNN (SDPA, enable_gqa) per row, each run back to back for
    `seconds` (time_sustained: the median call of the second half, its SM clock and power).
    The rows' outputs were checked in the main table (same shapes and code); not re-checked."""
    n = 8192
    a = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    b = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    gms, gmhz, gw = time_sustained(lambda s: torch.matmul(a[s], b[s], out=c), 2, seconds)
    del a, b, c
    res = {"seconds": seconds, "gemm_bf16_tflops": 2.0 * n ** 3 / (gms * 1e-3) / 1e12, "gemm_mhz": gmhz,
           "gemm_watts": gw, "rows": []}
    print("prefill, sustained (%.1f s back to back, second half): bf16 GEMM 8192^3 %.0f TFLOP/s%s" % (
        seconds, res["gemm_bf16_tflops"], (" at %d MHz, %.0f W" % (gmhz, gw)) if gmhz else ""), flush=True)
    for dname, d, B, S, causal in SUSTAINED_ROWS:
        x = EqualRow(dname, d, B, S, l2)
        flops = attn_flops([S] * B, [S] * B, causal, PF_HQ, d)
        row = {"dtype": dname, "d": d, "batch": B, "seq": S, "causal": causal, "kind": "equal"}
        ours = x.ours(causal)
        if ours.plan_status == KVA_OK:
            try:
                ms, mhz, w = time_sustained(ours.run, x.sets, seconds)
                row.update({"ours_ms": ms, "ours_tflops": flops / ms * 1e-9, "ours_mhz": mhz, "ours_watts": w})
            except Exception as e:  # a kvattn error (the main table already reported the row)
                row["ours_error"] = (str(e).strip().splitlines() or ["?"])[0][:160]
        else:
            row["ours_error"] = ours.plan_error
        try:
            ms, mhz, w = time_sustained(x.cudnn(causal), x.sets, seconds)
            row.update({"cudnn_ms": ms, "cudnn_tflops": flops / ms * 1e-9, "cudnn_mhz": mhz, "cudnn_watts": w})
        except Exception as e:  # cuDNN refuses the shape
            row["cudnn_error"] = (str(e).strip().splitlines() or ["?"])[0][:160]
        res["rows"].append(row)
        print("  %s d%d %d x %d %s: ours %s, cudnn %s" % (
            dname, d, B, S, "causal" if causal else "full",
            "%.3f ms %.0f TFLOP/s" % (row["ours_ms"], row["ours_tflops"]) if "ours_ms" in row else "-",
            "%.3f ms %.0f TFLOP/s" % (row["cudnn_ms"], row["cudnn_tflops"]) if "cudnn_ms" in row else "-"),
            flush=True)
        ours.free()
        del x, ours
        torch.cuda.empty_cache()
    return res


def print_sustained_table(res):
    g = res["gemm_bf16_tflops"]
    print("\nPrefill in the power-limited state (%.1f s of each back to back, median call of the second "
          "half; bf16 GEMM 8192^3 the same way: %.0f TFLOP/s%s%s):\n" % (
              res["seconds"], g, (" at %d MHz" % res["gemm_mhz"]) if res.get("gemm_mhz") else "",
              (", %.0f W" % res["gemm_watts"]) if res.get("gemm_watts") else ""))
    # (no "% GEMM": under the power limit the GEMM, which draws more power per FLOP, runs at a
    # lower clock than attention, so its rate is no ceiling for attention there)
    print("| dtype | d | batch x seq | mask | ours ms | ours TFLOP/s | cuDNN TFLOP/s | x cuDNN | SM MHz | W |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        o, c = r.get("ours_tflops"), r.get("cudnn_tflops")
        mhz = lambda k: "%d" % r[k] if r.get(k) else "-"
        watts = lambda k: "%.0f" % r[k] if r.get(k) else "-"
        print("| %s | %d | %d x %d | %s | %s | %s | %s | %s | %s/%s | %s/%s |" % (
            r["dtype"], r["d"], r["batch"], r["seq"], "causal" if r["causal"] else "full",
            "%.3f" % r["ours_ms"] if o else "-", "%.0f" % o if o else "-",
            "%.0f" % c if c else "-", "%.2f" % (r["cudnn_ms"] / r["ours_ms"]) if o and c else "-",
            mhz("ours_mhz"), mhz("cudnn_mhz"), watts("ours_watts"), watts("cudnn_watts")))


def prefill_failures(res):
    """Rows that make the script fail: wrong results and kvattn errors (not 'unsupported')."""
    return [r for r in res["rows"] if r.get("ours_state") in ("WRONG", "error") or
            r.get("dense_state") in ("WRONG", "error")]


def print_prefill_table(dev_name, date, res):
    print()
    mma = res.get("mma_bf16_tflops")
    print("## kvattn prefill vs PyTorch SDPA -- %s, %s, bf16 GEMM %.0f TFLOP/s (f16 %.0f)%s" % (
        dev_name, date, res["gemm_bf16_tflops"], res["gemm_f16_tflops"],
        (", tensor-core ceiling bf16 %.0f TFLOP/s (f16 %.0f)" % (mma, res.get("mma_f16_tflops") or float("nan")))
        if mma else ""))
    print("%d q / %d kv heads; TFLOP/s = 4*seq^2*heads*d*batch / time, causal counts half; "
          "%% GEMM = of the bf16 8192^3 torch.matmul rate%s; x flash, x best = torch time / ours; "
          "%s, inputs rotated over >= 4x L2" % (PF_HQ, PF_HK,
              " / ceiling = of the row's dtype's tensor-core ceiling (bench/mma_ceiling.cu: wgmma m64n256k16 back to back)"
              if mma else "",
              ("CUDA-event medians of the calls that fit in %.0f ms after an idle pause (3..%d)" % (res["burst_ms"], res["iters"]))
              if res.get("burst_ms") else "CUDA-event medians of %d" % res["iters"]))
    if res.get("gemm_bf16_mhz"):
        print("SM MHz: the median SM clock (NVML, every 5 ms) over ours' / cuDNN's timed calls "
              "(the bf16 GEMM ran at %d MHz)" % res["gemm_bf16_mhz"])
    print("| dtype | d | batch x seq | mask | ours ms | ours TFLOP/s | %% GEMM%s | dense ms | "
          "flash TFLOP/s | cuDNN TFLOP/s | x flash | x best | max abs diff | rel err | SM MHz |" % (
              " / ceiling" if mma else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        ms, tf, frac = ours_cell(r)
        dense = "-"
        if r.get("dense_ms"):
            dense = "%.3f" % r["dense_ms"]
        elif r.get("dense_state"):
            dense = r["dense_state"]
        mhz = "/".join(("%d" % r[k]) if r.get(k) else "-" for k in ("ours_mhz", "cudnn_mhz"))
        print("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["dtype"], r["d"], row_label(r), "causal" if r["causal"] else "full", ms, tf, frac,
            dense,
            ("%.0f" % r["flash_tflops"]) if r.get("flash_tflops") else "n/a",
            ("%.0f" % r["cudnn_tflops"]) if r.get("cudnn_tflops") else "n/a",
            ("%.2f" % r["flash_over_ours"]) if r.get("flash_over_ours") else "-",
            ("%.2f" % r["best_torch_over_ours"]) if r.get("best_torch_over_ours") else "-",
            ("%.1e" % r["max_abs_vs_torch"]) if r.get("max_abs_vs_torch") is not None else "-",
            ("%.1e" % r["rel_err_ref"]) if r.get("rel_err_ref") is not None else "-", mhz))
    notes = []
    for r in res["rows"]:
        if r["kind"] in ("ragged", "chunked"):
            for col in ("flash", "cudnn"):
                name = r.get(col + "_variant")
                if name:
                    note = next((t["note"] for t in r.get("torch", []) if t["name"] == name), "")
                    notes.append("%s %s: torch %s = %s (%s)" % (r["kind"], col, col, name, note))
        if r.get("ours_contig_error"):
            notes.append("chunked, ours on the same keys contiguous: no time (%s)" % r["ours_contig_error"])
        if r["kind"] == "chunked" and r.get("ours_contig_ms") and r.get("ours_ms"):
            notes.append("chunked, ours on the same keys contiguous (ragged plan): %.3f ms; paged / "
                         "contiguous time %.2f" % (r["ours_contig_ms"], r["ours_ms"] / r["ours_contig_ms"]))
        if r.get("ours_error"):
            notes.append("%s d%d %s %s: %s" % (r["dtype"], r["d"], row_label(r),
                                               "causal" if r["causal"] else "full", r["ours_error"]))
        for t in r.get("torch", []):
            if t.get("error"):
                notes.append("%s d%d %s %s: torch %s refused/failed: %s" % (
                    r["dtype"], r["d"], row_label(r), "causal" if r["causal"] else "full",
                    t["name"], t["error"]))
            elif t["name"].endswith("+rep"):
                notes.append("%s d%d %s %s: torch %s needed K/V heads repeated (%s)" % (
                    r["dtype"], r["d"], row_label(r), "causal" if r["causal"] else "full",
                    t["name"], t.get("gqa_error", "")))
    ragged = [r for r in res["rows"] if r["kind"] == "ragged" and r.get("lens")]
    if ragged:
        notes.append("ragged lengths (log-normal, seed %d, median %d, sigma %.1f): %s" % (
            RAGGED_SEED, RAGGED_MEDIAN, RAGGED_SIGMA, ",".join(str(x) for x in ragged[0]["lens"])))
    for n in notes[:60]:
        print("- " + n)
    if len(notes) > 60:
        print("- (%d more notes in the JSON)" % (len(notes) - 60))


def run_host_overhead():
    """Host time of one decode run() from Python over the bare C call (kvattn.bench), one line;
    the result (or the error) for the JSON. Own RNG state: the benchmark's inputs stay as they
    were without it."""
    try:
        with torch.random.fork_rng(devices=[torch.cuda.current_device()]):
            r = kb.host_overhead("cuda")
    except Exception as e:  # not a reason to skip the tables
        msg = (str(e).strip().splitlines() or ["?"])[0][:200]
        print("host overhead: failed: %s" % msg, flush=True)
        return {"error": msg}
    hot = r["styles"]["run(q, KVPages, out=out)"]
    print("host overhead: decode run() from Python %.2f us, bare C call %.2f us: %+.2f us per call "
          "(target <= 3 us: %s)" % (hot["python_us"], r["c_call_us"], r["overhead_us"],
                                    "met" if r["overhead_us"] <= 3.0 else "MISSED"), flush=True)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("KVA_BUILD", "build"))
    ap.add_argument("--settle", type=float, default=SETTLE_S,
                    help="seconds of idle GPU before each timed series (default %(default)s; 0: none)")
    ap.add_argument("--quick", action="store_true",
                    help="fewer timed calls (decode 30, prefill 10 instead of 100 / 30)")
    ap.add_argument("--json", default=None, help="write every number to this file")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--decode-only", action="store_true", help="only the decode table")
    which.add_argument("--prefill-only", action="store_true", help="only the prefill table")
    ap.add_argument("--shapes", default=None, help="decode shapes, e.g. 1x8192,64x4096")
    ap.add_argument("--variants", action="store_true",
                    help="decode: also time other split choices (main table and ragged batches), and HND "
                         "pages (main and model tables)")
    ap.add_argument("--no-models", action="store_true",
                    help="decode: skip the model-shape and ragged-batch tables")
    ap.add_argument("--models", default=None,
                    help="decode: only these model-shape rows, e.g. Falcon-7B,Llama-3-8B")
    ap.add_argument("--seqs", default=None,
                    help="prefill sequence lengths (16384 tokens per batch), default 512,2048,8192,16384")
    ap.add_argument("--prefill-sets", default=None,
                    help="prefill dtype:head_dim list, default bf16:128,f16:128,bf16:64,bf16:256,bf16:96")
    ap.add_argument("--no-extra-rows", action="store_true",
                    help="prefill: skip the ragged and chunked-prefill rows")
    ap.add_argument("--burst-ms", type=float, default=BURST_MS,
                    help="prefill / GEMM: time only the calls that fit in this many ms after an idle pause "
                         "(default %(default)s; 0: all of --quick's 10 / the default 30)")
    ap.add_argument("--sustained", type=float, default=None,
                    help="prefill: seconds per side of the power-limited table (default 1.5 with the "
                         "whole default table, else 0; 0: none)")
    args = ap.parse_args()
    globals()["SETTLE_S"] = args.settle
    globals()["BURST_MS"] = args.burst_ms
    if args.sustained is None:  # (only with the whole default table: its rows are fixed)
        args.sustained = 0.0 if args.quick or args.prefill_sets or args.seqs else 1.5

    torch.manual_seed(0)
    load_kvattn(args.build)
    info = kvattn.device_info("cuda:%d" % torch.cuda.current_device())
    dev_name = info["name"]
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print("device: %s (%d SMs, L2 %.0f MB), torch %s, %s" %
          (dev_name, info["num_sms"], info["l2_bytes"] / 1e6, torch.__version__, date), flush=True)
    out = {"device": dev_name, "date": date, "torch": torch.__version__,
           "num_sms": info["num_sms"], "l2_bytes": info["l2_bytes"]}
    out["host_overhead"] = run_host_overhead()
    status = 0
    dec = pre = models = None
    if not args.prefill_only:
        dec = run_decode(args, info)
        # the decode results stay at the top level, as before ("rows", "ceiling_gbs", ...)
        out.update({k: v for k, v in dec.items()})
        if not args.no_models and (not args.shapes or args.models):
            print(flush=True)
            models = run_decode_models(args, info, dec["ceiling_gbs"])
            out["decode_models"] = models
    if not args.decode_only:
        print(flush=True)
        pre = run_prefill(args, info)
        out["prefill"] = pre
        if args.sustained > 0 and not pre["aborted"]:
            print(flush=True)
            try:
                pre["sustained"] = run_prefill_sustained(args.sustained, info["l2_bytes"])
            except Exception as e:  # keep every number measured so far (the JSON is written next)
                pre["sustained_error"] = (str(e).strip().splitlines() or ["?"])[0][:200]
                print("prefill, sustained: failed: %s" % pre["sustained_error"], flush=True)
    if args.json:  # (before the tables: a table that fails to print loses no number)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    # the tables last, so that `sed -n '/^## kvattn/,$p'` shows both and nothing else
    if dec is not None:
        print_decode_table(dev_name, date, dec)
    if models is not None:
        print_models_table(dev_name, date, models)
    if pre is not None:
        print_prefill_table(dev_name, date, pre)
        if pre.get("sustained"):
            print_sustained_table(pre["sustained"])
    if dec is not None and dec["failed"]:
        print("ERROR: decode outputs differ from SDPA for", dec["failed"])
        status = 1
    if models is not None and models["failed"]:
        print("ERROR: model-shape / ragged decode rows failing or wrong:", models["failed"])
        status = 1
    if pre is not None:
        bad = prefill_failures(pre)
        if bad:
            print("ERROR: prefill rows wrong or failing: %s" % "; ".join(
                "%s d%d %s %s: %s" % (r["dtype"], r["d"], row_label(r),
                                      "causal" if r["causal"] else "full",
                                      r.get("ours_error") or r.get("dense_error") or r.get("dense_state"))
                for r in bad))
            status = 1
        if pre["aborted"]:
            status = 1
        states = [r.get("ours_state", "?") for r in pre["rows"]]
        print("prefill rows: %d ok, %d unsupported, %d wrong, %d error (of %d)%s" % (
            states.count("ok"), states.count("unsupported"), states.count("WRONG"),
            states.count("error"), len(states), "; aborted" if pre["aborted"] else ""))
    return status


if __name__ == "__main__":
    sys.exit(main())
