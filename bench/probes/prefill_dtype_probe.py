"""prefill_dtype_probe.py -- runs our ragged prefill (32 q / 8 kv heads, d 128, B x S tokens) in one
dtype, N calls on the same inputs, for a profiler to compare dtypes kernel by kernel (why f16 reads
slower than bf16 on short causal rows, bench/NOTES.md).
Usage: python3 bench/probes/prefill_dtype_probe.py --build DIR bf16|f16 [B S causal|full N]
       python3 bench/probes/prefill_dtype_probe.py --build DIR --time [B S causal|full ROUNDS]
(--time: both dtypes in alternated rounds, each the median of 30 calls rotated over 4 input sets,
bracketed by CUDA events as bench_torch.py times them)"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_torch as bt  # noqa: E402
import torch  # noqa: E402

args = sys.argv[1:]
build = "build"
if args[:1] == ["--build"]:
    build, args = args[1], args[2:]
timing = args[:1] == ["--time"]
dname = "bf16" if timing else args[0]
B, S = (int(args[1]), int(args[2])) if len(args) > 2 else (32, 512)
causal = (args[3] if len(args) > 3 else "causal") == "causal"
n = int(args[4]) if len(args) > 4 else 20
bt.load_kvattn(build)
tdt = bt.PF_DTYPES[dname]
hq, hk, d, T = bt.PF_HQ, bt.PF_HK, 128, B * S
torch.manual_seed(0)
q = torch.randn(T, hq, d, device="cuda", dtype=tdt)
k = torch.randn(T, hk, d, device="cuda", dtype=tdt)
v = torch.randn(T, hk, d, device="cuda", dtype=tdt)
o = torch.empty(T, hq, d, device="cuda", dtype=tdt)
if timing:
    runs = {}
    for dn in ("bf16", "f16"):
        dt = bt.PF_DTYPES[dn]
        qs = [torch.randn(T, hq, d, device="cuda", dtype=dt) for _ in range(4)]
        kvs = [(torch.randn(T, hk, d, device="cuda", dtype=dt), torch.randn(T, hk, d, device="cuda", dtype=dt))
               for _ in range(4)]
        od = torch.empty(T, hq, d, device="cuda", dtype=dt)
        runs[dn] = bt.OurPrefill(hq, hk, d, causal, [S] * B, [S] * B, qs, od, kv_sets=kvs)
        assert runs[dn].plan_status == bt.KVA_OK, runs[dn].plan_error
    for r in range(n):
        for dn, ours in runs.items():
            ms = bt.kb.time_calls(ours.run, 4, 30, warmup=3)
            print("round %d %s %d x %d %s: %.4f ms" % (r, dn, B, S, "causal" if causal else "full", ms), flush=True)
    sys.exit(0)
ours = bt.OurPrefill(hq, hk, d, causal, [S] * B, [S] * B, [q], o, kv_sets=[(k, v)])
assert ours.plan_status == bt.KVA_OK, ours.plan_error
for _ in range(n):
    ours.run(0)
torch.cuda.synchronize()
print(dname, B, S, "causal" if causal else "full", n, "calls")
