"""prefill_series.py -- why one prefill row reads 612 TFLOP/s in one table and 685 in another at the
same SM clock (bench/NOTES.md: d128 2 x 8192 full, and d256 2 x 8192 / 16k full between the quick
rounds and the table): each call of a series timed on its own, ours and cuDNN alternated, the SM
clock and board power sampled meanwhile (NVML, every 5 ms), then a sustained run of each.

Per round and side: median / min / max / p10 / p90 of the per-call times of a series of N calls
(after 0.5 s of idle GPU, as bench_torch.py's series), TFLOP/s of the median, and the median SM
clock and power of the series' window. A bimodal row (calls of two speeds in one series) points at
something per call (the work's order, L2 placement); a row whose series differ from each other but
not inside one, at something per series (power, clocks, the process). The sustained run (S seconds
back to back, 10-call windows) shows whether speed falls as the board heats, and energy per call
(power x time) says which kernel a power limit would slow more.

Usage: python3 bench/probes/prefill_series.py --build DIR [--rounds 4] [--calls 30] [--sustain 2]
           [ROW ...]   ROW = dtype:d:batch:seq:causal|full (default: bf16:128:2:8192:full
                       bf16:128:1:16384:full bf16:256:2:8192:full)
"""
import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_torch as bt  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Sampler:
    """(time, SM MHz, watts) every 5 ms on a thread, while started; empty without NVML."""

    def __init__(self):
        self.nvml = None
        try:
            import pynvml
            pynvml.nvmlInit()
            p = torch.cuda.get_device_properties(torch.cuda.current_device())
            bus = "%08x:%02x:%02x.0" % (p.pci_domain_id, p.pci_bus_id, p.pci_device_id)
            self.h = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
            self.nvml = pynvml
        except Exception:
            pass

    def start(self):
        self.samples, self.stop_flag = [], threading.Event()
        if self.nvml is None:
            return

        def run():
            while not self.stop_flag.is_set():
                try:
                    mhz = self.nvml.nvmlDeviceGetClockInfo(self.h, self.nvml.NVML_CLOCK_SM)
                    mw = self.nvml.nvmlDeviceGetPowerUsage(self.h)
                except Exception:
                    return
                self.samples.append((time.monotonic(), mhz, mw / 1000.0))
                self.stop_flag.wait(0.005)
        self.t = threading.Thread(target=run, daemon=True)
        self.t.start()

    def stop(self):
        self.stop_flag.set()
        if self.nvml is not None:
            self.t.join()
        return self.samples


def window(samples, t0, t1):
    """Median MHz and watts of the samples in [t0, t1] (host monotonic times), or (None, None)."""
    s = [x for x in samples if t0 <= x[0] <= t1] or samples[-1:]
    if not s:
        return None, None
    return statistics.median(x[1] for x in s), statistics.median(x[2] for x in s)


def per_call_ms(fn, nsets, n, warmup=3):
    """Each of n back-to-back calls bracketed by its own pair of events (GPU sleep first, so the
    host has queued them all): list of ms, and the host times the series covered."""
    for i in range(warmup):
        fn(i % nsets)
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    torch.cuda._sleep(20_000_000)
    for i in range(n):
        ev[i].record()
        fn(i % nsets)
    ev[n].record()
    torch.cuda.synchronize()
    t_end = time.monotonic()
    ms = [ev[i].elapsed_time(ev[i + 1]) for i in range(n)]
    return ms, t_end - sum(ms) * 1e-3, t_end


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--sustain", type=float, default=2.0, help="seconds of the sustained run per side (0: none)")
    ap.add_argument("rows", nargs="*",
                    default=["bf16:128:2:8192:full", "bf16:128:1:16384:full", "bf16:256:2:8192:full"])
    a = ap.parse_args()
    bt.load_kvattn(a.build)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    smp = Sampler()
    print("device: %s, %s UTC, NVML %s" % (torch.cuda.get_device_name(0), time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                                           "on" if smp.nvml else "off"), flush=True)
    for spec in a.rows:
        dname, d, B, S, mask = spec.split(":")
        d, B, S, causal = int(d), int(B), int(S), mask == "causal"
        tdt = bt.PF_DTYPES[dname]
        hq, hk = bt.PF_HQ, bt.PF_HK
        T = B * S
        nsets = bt.rotation_sets(T * (hq + 2 * hk) * d * 2, l2)
        q = [torch.randn(T, hq, d, device="cuda", dtype=tdt) for _ in range(nsets)]
        k = [torch.randn(T, hk, d, device="cuda", dtype=tdt) for _ in range(nsets)]
        v = [torch.randn(T, hk, d, device="cuda", dtype=tdt) for _ in range(nsets)]
        o = torch.empty(T, hq, d, device="cuda", dtype=tdt)
        ours = bt.OurPrefill(hq, hk, d, causal, [S] * B, [S] * B, q, o, kv_sets=list(zip(k, v)))
        assert ours.plan_status == bt.KVA_OK, ours.plan_error
        tq = [x.view(B, S, hq, d).transpose(1, 2).contiguous() for x in q]
        tk = [x.view(B, S, hk, d).transpose(1, 2).contiguous() for x in k]
        tv = [x.view(B, S, hk, d).transpose(1, 2).contiguous() for x in v]

        def cudnn(s):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                F.scaled_dot_product_attention(tq[s], tk[s], tv[s], is_causal=causal, enable_gqa=True)
        flops = bt.attn_flops([S] * B, [S] * B, causal, hq, d)
        print("\n%s: %d sets, plan %s" % (spec, nsets, ours.plan_info()), flush=True)
        sides = [("ours", ours.run), ("cudnn", cudnn)]
        for r in range(a.rounds):
            for name, fn in (sides if r % 2 == 0 else sides[::-1]):
                torch.cuda.synchronize()
                time.sleep(0.5)
                smp.start()
                ms, t0, t1 = per_call_ms(fn, nsets, a.calls)
                mhz, w = window(smp.stop(), t0, t1)
                s = sorted(ms)
                med = statistics.median(ms)
                print("  round %d %-5s median %.3f ms (%.0f TFLOP/s) min %.3f p10 %.3f p90 %.3f max %.3f  %s MHz %s W"
                      % (r, name, med, flops / med * 1e-9, s[0], s[len(s) // 10], s[(9 * len(s)) // 10], s[-1],
                         mhz, "%.0f" % w if w else None), flush=True)
                if r == 0:
                    print("    calls: " + " ".join("%.2f" % x for x in ms), flush=True)
        if a.sustain > 0:
            for name, fn in sides:
                torch.cuda.synchronize()
                time.sleep(1.0)
                n = max(20, int(a.sustain * 1e3 / max(statistics.median(ms), 0.05)))
                smp.start()
                x, t0, t_end = per_call_ms(fn, nsets, n, warmup=0)
                samples = smp.stop()
                # 10-call windows; call i ended at t_end - sum(x[i + 1:]) (host clock, GPU-side gaps ignored)
                ends, acc = [], t_end
                for m in reversed(x):
                    ends.append(acc)
                    acc -= m * 1e-3
                ends.reverse()
                wins = [(statistics.median(x[i:i + 10]), ends[i] - x[i] * 1e-3, ends[min(i + 9, n - 1)])
                        for i in range(0, n - 9, 10)]
                line = []
                for i, (m, w0, w1) in enumerate(wins):
                    if i in (0, 1, 2) or i == len(wins) // 4 or i == len(wins) // 2 or i == len(wins) - 1:
                        mhz, w = window(samples, w0, w1)
                        line.append("w%d %.3f ms %.0f TF %s MHz %s W" % (i, m, flops / m * 1e-9, mhz,
                                                                        "%.0f" % w if w else None))
                last = wins[len(wins) // 2:]
                mhz, w = window(samples, last[0][1], last[-1][2])
                m = statistics.median(y[0] for y in last)
                print("  sustained %-5s %d calls: %s | second half %.3f ms (%.0f TFLOP/s) %s MHz %s W -> %s J/call"
                      % (name, n, "; ".join(line), m, flops / m * 1e-9, mhz, "%.0f" % w if w else None,
                         "%.3f" % (w * m * 1e-3) if w else None), flush=True)
        ours.free()
        del q, k, v, o, tq, tk, tv, ours
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
