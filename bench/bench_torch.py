#!/usr/bin/env python3
"""bench_torch.py -- kvattn's paged decode against PyTorch SDPA, in one process, on one stream.

Loads libkvattn.so with ctypes, hands it torch tensors' data_ptr()s and torch's current stream
(kva_context_set_stream), and times ours and SDPA (flash and cuDNN backends, enable_gqa=True,
contiguous KV) side by side with CUDA events. Also measures the device's read-bandwidth ceiling
(a streaming reduction over 4 GiB, libkvattn_read_ceiling.so) in the same run, and CUDA-graph
replay of our decode for the small shapes.

Shapes: bf16, 32 query / 8 KV heads, head dim 128, page 16, physical pages shuffled, one query
token per request. Inputs are random; every timed call uses the next of several input sets whose
total size is well beyond L2, so no call reads from a warm cache. Reported: median time, GB/s of
K+V read, fraction of the ceiling, and the ratio best-torch-time / our-time (> 1: we are faster).

Usage: bench_torch.py [--build DIR] [--quick] [--json FILE] [--shapes 1x1024,8x4096,...]
"""
import argparse
import ctypes as C
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

# ---- the C API, mirrored -------------------------------------------------------------------


class Workspace(C.Structure):
    _fields_ = [("device", C.c_void_p), ("device_bytes", C.c_size_t),
                ("host", C.c_void_p), ("host_bytes", C.c_size_t)]


class PlanLimits(C.Structure):
    _fields_ = [("max_batch", C.c_int32), ("max_total_pages", C.c_int64),
                ("max_total_kv", C.c_int64), ("max_total_qo", C.c_int64),
                ("num_qo_heads", C.c_int32), ("num_kv_heads", C.c_int32),
                ("head_dim", C.c_int32), ("page_size", C.c_int32),
                ("min_fixed_chunk", C.c_int32)]


class PageTable(C.Structure):
    _fields_ = [("batch_size", C.c_int32), ("indptr", C.c_void_p), ("indices", C.c_void_p),
                ("last_page_len", C.c_void_p)]


class KVPages(C.Structure):
    _fields_ = [("k_data", C.c_void_p), ("v_data", C.c_void_p), ("dtype", C.c_int),
                ("num_pages", C.c_int32), ("page_size", C.c_int32), ("num_kv_heads", C.c_int32),
                ("head_dim", C.c_int32), ("stride_page", C.c_int64), ("stride_token", C.c_int64),
                ("stride_head", C.c_int64)]


class Tensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dtype", C.c_int), ("stride_token", C.c_int64),
                ("stride_head", C.c_int64)]


class AttnParams(C.Structure):
    _fields_ = [("num_qo_heads", C.c_int32), ("num_kv_heads", C.c_int32), ("head_dim", C.c_int32),
                ("sm_scale", C.c_float), ("causal", C.c_int32), ("window_left", C.c_int32),
                ("logits_soft_cap", C.c_float), ("score_mod", C.c_void_p),
                ("score_mod_user", C.c_void_p)]


class PlanOptions(C.Structure):
    _fields_ = [("flags", C.c_uint32), ("fixed_chunk_size", C.c_int32), ("algo", C.c_int)]


class Plan(C.Structure):
    _fields_ = [("magic", C.c_uint32), ("kind", C.c_int32), ("batch_size", C.c_int32),
                ("num_qo_heads", C.c_int32), ("num_kv_heads", C.c_int32), ("head_dim", C.c_int32),
                ("page_size", C.c_int32), ("kv_chunk_size", C.c_int32),
                ("qo_tile_size", C.c_int32), ("num_work", C.c_int32), ("padded_work", C.c_int32),
                ("split_kv", C.c_int32), ("flags", C.c_uint32), ("algo", C.c_int),
                ("request_indices", C.c_void_p), ("qo_tile_indices", C.c_void_p),
                ("kv_tile_indices", C.c_void_p), ("merge_indptr", C.c_void_p),
                ("workspace", Workspace), ("generation", C.c_uint32)]


class DeviceInfo(C.Structure):
    _fields_ = [("name", C.c_char * 128), ("num_sms", C.c_int), ("l2_bytes", C.c_size_t),
                ("total_memory", C.c_size_t)]


KVA_BF16, KVA_DEVICE_CUDA, KVA_PLAN_GRAPH = 2, 1, 2

HQ, HK, D, PS = 32, 8, 128, 16
SHAPES = [(1, 1024), (1, 8192), (1, 32768), (8, 4096), (16, 8192), (32, 4096), (64, 2048),
          (64, 4096), (128, 1024), (128, 4096), (256, 512)]
GRAPH_SHAPES = {(1, 1024), (1, 8192), (1, 32768), (8, 4096)}
# FlashInfer on an H200 (GPU.md, 2026-11-22), GB/s: (cuda-core, tensor-core)
FLASHINFER_H200 = {(1, 1024): (308, 336), (1, 8192): (1465, 1476), (1, 32768): (2243, 2890),
                   (8, 4096): (2325, 2906), (16, 8192): (2672, 4026), (32, 4096): (2673, 4157),
                   (64, 2048): (2646, 4011), (64, 4096): (2769, 4312), (128, 1024): (2751, 3847),
                   (128, 4096): (2848, 4385), (256, 512): (2832, 3711)}


class Kvattn:
    def __init__(self, path):
        self.lib = C.CDLL(path)
        L = self.lib
        L.kva_last_error.restype = C.c_char_p
        L.kva_status_str.restype = C.c_char_p
        self.ctx = C.c_void_p()
        self.check(L.kva_context_create(KVA_DEVICE_CUDA, torch.cuda.current_device(),
                                        C.byref(self.ctx)), "kva_context_create")

    def check(self, status, what):
        if status != 0:
            raise RuntimeError("%s: %s (%s)" % (what, self.lib.kva_status_str(status).decode(),
                                                self.lib.kva_last_error().decode()))

    def set_stream(self, stream):
        self.check(self.lib.kva_context_set_stream(self.ctx, C.c_void_p(stream.cuda_stream)),
                   "kva_context_set_stream")

    def info(self):
        i = DeviceInfo()
        self.check(self.lib.kva_context_info(self.ctx, C.byref(i)), "kva_context_info")
        return i


class OurDecode:
    """One shape: pools (one per input set), page table, plan and workspace of our decode."""

    def __init__(self, kva, batch, ctx_len, nsets, graph=False, flags=0, fixed_chunk=0, hnd=False):
        self.kva, self.B, self.L = kva, batch, ctx_len
        ppr = (ctx_len + PS - 1) // PS
        self.num_pages = batch * ppr
        gen = torch.Generator(device="cpu").manual_seed(1234 + batch * 7 + ctx_len)
        self.perm = torch.randperm(self.num_pages, generator=gen).to(torch.int32)
        self.indptr = (torch.arange(batch + 1, dtype=torch.int32) * ppr).contiguous()
        self.last = torch.full((batch,), ctx_len - (ppr - 1) * PS, dtype=torch.int32)
        self.table = PageTable(batch, self.indptr.data_ptr(), self.perm.data_ptr(),
                               self.last.data_ptr())
        shape = (self.num_pages, HK, PS, D) if hnd else (self.num_pages, PS, HK, D)
        self.hnd = hnd
        self.k = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(nsets)]
        self.v = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(nsets)]
        self.q = [torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
                  for _ in range(nsets)]
        self.o = torch.empty(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
        self.params = AttnParams(HQ, HK, D, 0.0, 0, -1, 0.0, None, None)
        self.limits = PlanLimits(batch, self.num_pages, 0, 0, HQ, HK, D, PS)
        lib = kva.lib
        dev_b, host_b = C.c_size_t(), C.c_size_t()
        kva.check(lib.kva_decode_workspace_size(kva.ctx, C.byref(self.limits), C.byref(dev_b),
                                                C.byref(host_b)), "workspace_size")
        self.ws_dev = torch.empty(dev_b.value, dtype=torch.uint8, device="cuda")
        host = C.c_void_p()
        kva.check(lib.kva_host_alloc(kva.ctx, C.c_size_t(host_b.value), C.byref(host)), "host_alloc")
        self.ws_host = host
        self.ws = Workspace(self.ws_dev.data_ptr(), dev_b.value, host.value, host_b.value)
        self.plan = Plan()
        opt = PlanOptions(flags | (KVA_PLAN_GRAPH if graph else 0), fixed_chunk, 0)
        kva.check(lib.kva_decode_plan(kva.ctx, C.byref(self.limits), C.byref(self.table),
                                      self.num_pages, C.byref(opt), self.ws, C.byref(self.plan)),
                  "kva_decode_plan")
        self.pages = []
        for s in range(nsets):
            st_tok, st_head = (D, PS * D) if hnd else (HK * D, D)
            self.pages.append(KVPages(self.k[s].data_ptr(), self.v[s].data_ptr(), KVA_BF16,
                                      self.num_pages, PS, HK, D, PS * HK * D, st_tok, st_head))
        self.qt = [Tensor(q.data_ptr(), KVA_BF16, HQ * D, D) for q in self.q]
        self.ot = Tensor(self.o.data_ptr(), KVA_BF16, HQ * D, D)

    def run(self, s):
        st = self.kva.lib.kva_decode_run(self.kva.ctx, C.byref(self.plan), C.byref(self.params),
                                         self.qt[s], C.byref(self.pages[s]), self.ot, None)
        if st != 0:
            self.kva.check(st, "kva_decode_run")

    def contiguous_kv(self, s):
        """Set s's K and V as torch wants them: [B, HK, L, D], logical order."""
        ppr = self.num_pages // self.B
        idx = self.perm.long().to("cuda")
        assert not self.hnd
        k = self.k[s][idx].reshape(self.B, ppr * PS, HK, D)[:, : self.L].permute(0, 2, 1, 3)
        v = self.v[s][idx].reshape(self.B, ppr * PS, HK, D)[:, : self.L].permute(0, 2, 1, 3)
        return k.contiguous(), v.contiguous()

    def free(self):
        self.kva.lib.kva_host_free(self.kva.ctx, self.ws_host)


def time_calls(fn, nsets, iters, warmup=5):
    """Median milliseconds of fn(set) over iters calls, each bracketed by CUDA events. The GPU is
    first given a sleep so that the host enqueues ahead of it and launch latency on the host side
    does not leak into the event times."""
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
    lib = C.CDLL(os.path.join(build, "libkvattn_read_ceiling.so"))
    nbytes = gib << 30
    buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    buf.random_(0, 255)
    sink = torch.zeros(65536, dtype=torch.int32, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream

    def fn(_):
        err = lib.kva_bench_read(C.c_void_p(buf.data_ptr()), C.c_size_t(nbytes),
                                 C.c_void_p(sink.data_ptr()), C.c_void_p(stream))
        if err != 0:
            raise RuntimeError("read ceiling kernel: cuda error %d" % err)

    ms = time_calls(fn, 1, 15, warmup=3)
    del buf

    def empty(_):  # one empty 1-block kernel: the launch floor as these events see it
        lib.kva_bench_empty(C.c_void_p(stream))

    floor_ms = time_calls(empty, 1, 50)
    return nbytes / (ms * 1e-3) / 1e9, floor_ms * 1e3


def sdpa_backends():
    from torch.nn.attention import SDPBackend
    return [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.environ.get("KVA_BUILD", "build"))
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    ap.add_argument("--json", default=None)
    ap.add_argument("--shapes", default=None, help="e.g. 1x8192,64x4096")
    ap.add_argument("--variants", action="store_true", help="also time other split choices")
    args = ap.parse_args()
    from torch.nn.attention import sdpa_kernel

    torch.manual_seed(0)
    kva = Kvattn(os.path.join(args.build, "libkvattn.so"))
    stream = torch.cuda.current_stream()
    kva.set_stream(stream)
    info = kva.info()
    dev_name = info.name.decode()
    l2 = info.l2_bytes
    ceiling, launch_floor_us = read_ceiling(args.build)
    print("device: %s, %d SMs, L2 %.0f MB; read ceiling %.0f GB/s; empty-kernel launch %.1f us" %
          (dev_name, info.num_sms, l2 / 1e6, ceiling, launch_floor_us), flush=True)
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    iters = 30 if args.quick else 100
    rot_bytes = 4 * max(l2, 50 << 20)  # rotate over sets totalling well beyond L2
    rows = []
    for (B, L) in shapes:
        kv_bytes = B * L * HK * D * 2 * 2
        nsets = max(1, math.ceil(rot_bytes / kv_bytes))
        ours = OurDecode(kva, B, L, nsets)
        row = {"batch": B, "ctx": L, "kv_bytes": kv_bytes, "sets": nsets,
               "chunk": ours.plan.kv_chunk_size, "work": ours.plan.num_work,
               "split": ours.plan.split_kv}
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
        if (B, L) in GRAPH_SHAPES:
            g_ours = OurDecode(kva, B, L, nsets, graph=True)
            graphs = []
            side = torch.cuda.Stream()
            for s in range(nsets):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=side):
                    kva.set_stream(torch.cuda.current_stream())
                    g_ours.run(s)
                graphs.append(g)
            kva.set_stream(stream)
            gms = time_calls(lambda s: graphs[s].replay(), nsets, iters)
            row["graph_us"] = gms * 1e3
            del graphs
            g_ours.free()
        if args.variants:
            h = OurDecode(kva, B, L, nsets, hnd=True)
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
                    v = OurDecode(kva, B, L, nsets, flags=flags, fixed_chunk=fixed)
                except RuntimeError:
                    continue
                row["variants"][label] = (v.plan.num_work, time_calls(v.run, nsets, iters) * 1e3)
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
            except Exception as e:  # a backend that refuses the shape
                row[name + "_us"] = None
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

    print()
    print("## kvattn paged decode vs PyTorch SDPA -- %s, read ceiling %.0f GB/s, empty launch %.1f us" %
          (dev_name, ceiling, launch_floor_us))
    print("bf16, %d q / %d kv heads, d=%d, page %d (shuffled); GB/s of K+V read; ratio = best torch time / ours" % (HQ, HK, D, PS))
    print("| batch x ctx | ours us | ours GB/s | % ceil | graph us | flash GB/s | cuDNN GB/s | ratio | chunk/work |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %d x %d | %.1f | %.0f | %.1f%% | %s | %s | %s | %.2f | %d/%d |" % (
            r["batch"], r["ctx"], r["ours_us"], r["ours_gbs"], 100 * r["ours_frac"],
            ("%.1f" % r["graph_us"]) if "graph_us" in r else "-",
            ("%.0f" % r["flash_gbs"]) if r.get("flash_us") else "n/a",
            ("%.0f" % r["cudnn_gbs"]) if r.get("cudnn_us") else "n/a",
            r["ratio_vs_best_torch"], r["chunk"], r["work"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev_name, "ceiling_gbs": ceiling, "launch_floor_us": launch_floor_us,
                       "rows": rows}, f, indent=1)
    bad = [r for r in rows if not (r["max_abs_err"] < 2e-2)]
    if bad:
        print("ERROR: outputs differ from SDPA for", [(r["batch"], r["ctx"]) for r in bad])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
