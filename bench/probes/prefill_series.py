"""prefill_series.py -- why one prefill row read 612 TFLOP/s in one table and 685 in another at the
same SM clock (bench/NOTES.md, "Prefill series across the power limit"): each call of a series
timed on its own, ours and cuDNN alternated, the SM clock and board power sampled meanwhile (NVML
every 5 ms: bench_torch.SmClock), then a sustained run of each.

Per round and side: median / min / max / p10 / p90 of the per-call times of a series of N calls
(3 warm-up calls, then 0.5 s of idle GPU, as bench_torch.py's series before --burst-ms), TFLOP/s
of the median, and the median SM clock and power over the series. A bimodal row (calls of two
speeds in one series) points at something per call or at a step inside the series; a row whose
series differ from each other but not inside one, at something per series. The sustained run (S
seconds back to back, reported in 10-call windows) shows when and how far the speed falls, and
energy per call (power x time) says which kernel a power limit slows more. NVML's clock lags a
step by a few ms, and its power reading is a 1 s average where the instantaneous field is
missing, so per-call times, not the samples, say when a step came.

Usage: python3 bench/probes/prefill_series.py --build DIR [--rounds 4] [--calls 30] [--sustain 2]
           [ROW ...]   ROW = dtype:d:batch:seq:causal|full (default: bf16:128:2:8192:full
                       bf16:128:1:16384:full bf16:256:2:8192:full)
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_torch as bt  # noqa: E402
import torch  # noqa: E402


def fmt(mhz, w):
    return "%s MHz %s W" % (mhz if mhz is not None else "-", "%.0f" % w if w is not None else "-")


def timed(clock, fn, nsets, n):
    """per-call ms of n calls, their host end times (seconds), the clock's samples kept."""
    clock.start(power=True)
    try:
        ms, end = bt.per_call_ms(fn, nsets, n)
    finally:
        if clock.nvml is not None:
            clock.stop_flag.set()
            clock.thread.join()
    ends, acc = [], end
    for m in reversed(ms):
        ends.append(acc)
        acc -= m * 1e-3
    ends.reverse()
    return ms, ends


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
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    clock = bt.SmClock()
    print("device: %s, %s UTC, NVML %s" % (torch.cuda.get_device_name(0), time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                                           "on" if clock.nvml else "off"), flush=True)
    for spec in a.rows:
        dname, d, B, S, mask = spec.split(":")
        d, B, S, causal = int(d), int(B), int(S), mask == "causal"
        inputs = bt.EqualRow(dname, d, B, S, l2)
        nsets = inputs.sets
        ours = inputs.ours(causal)
        assert ours.plan_status == bt.KVA_OK, ours.plan_error
        cudnn = inputs.cudnn(causal)
        flops = bt.attn_flops([S] * B, [S] * B, causal, bt.PF_HQ, d)
        print("\n%s: %d sets, plan %s" % (spec, nsets, ours.plan_info()), flush=True)
        sides = [("ours", ours.run), ("cudnn", cudnn)]
        for r in range(a.rounds):
            for name, fn in (sides if r % 2 == 0 else sides[::-1]):
                for i in range(3):
                    fn(i % nsets)
                torch.cuda.synchronize()
                time.sleep(0.5)
                ms, ends = timed(clock, fn, nsets, a.calls)
                mhz, w = clock.between(ends[0] - ms[0] * 1e-3, ends[-1])
                s = sorted(ms)
                med = statistics.median(ms)
                print("  round %d %-5s median %.3f ms (%.0f TFLOP/s) min %.3f p10 %.3f p90 %.3f max %.3f  %s"
                      % (r, name, med, flops / med * 1e-9, s[0], s[len(s) // 10], s[(9 * len(s)) // 10], s[-1],
                         fmt(mhz, w)), flush=True)
                if r == 0:
                    print("    calls: " + " ".join("%.2f" % x for x in ms), flush=True)
        if a.sustain > 0:
            for name, fn in sides:
                one = bt.kb.time_calls(fn, nsets, 2, warmup=1)
                n = max(20, int(a.sustain * 1e3 / max(one, 0.05)))
                torch.cuda.synchronize()
                time.sleep(1.0)
                x, ends = timed(clock, fn, nsets, n)
                # 10-call windows, each with the samples taken while it ran
                wins = [(statistics.median(x[i:i + 10]), ends[i] - x[i] * 1e-3, ends[min(i + 9, n - 1)])
                        for i in range(0, n - 9, 10)]
                line = []
                for i, (m, w0, w1) in enumerate(wins):
                    if i in (0, 1, 2) or i == len(wins) // 4 or i == len(wins) // 2 or i == len(wins) - 1:
                        line.append("w%d %.3f ms %.0f TF %s" % (i, m, flops / m * 1e-9, fmt(*clock.between(w0, w1))))
                last = wins[len(wins) // 2:]
                mhz, w = clock.between(last[0][1], last[-1][2])
                m = statistics.median(y[0] for y in last)
                print("  sustained %-5s %d calls: %s | second half %.3f ms (%.0f TFLOP/s) %s -> %s J/call"
                      % (name, n, "; ".join(line), m, flops / m * 1e-9, fmt(mhz, w),
                         "%.3f" % (w * m * 1e-3) if w else "-"), flush=True)
        ours.free()
        del inputs, ours, cudnn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
