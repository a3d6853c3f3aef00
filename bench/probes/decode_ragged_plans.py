"""decode_ragged_plans.py -- ragged decode batches at few KV heads (d128: 8/1, 16/2, 32/4), where
the decode scheduler's choice is most sensitive to its candidate set, timed at the plan's chunk:
run it on two builds alternately to compare two schedulers (scripts/gpu-check.sh's A/B mode:
GPU_CHECK_AB_CMD="python3 bench/probes/decode_ragged_plans.py --build {build}"). Lengths are
drawn with a fixed seed, so both builds see the same batches. One table line per batch:

    | heads | batch | tokens | plan chunk / work | us | % of the K/V bytes at 4.6 TB/s |
"""
import argparse
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_torch as bt  # noqa: E402
import torch  # noqa: E402

HEADS = [(8, 1), (16, 2), (32, 4)]
BATCHES = [17, 24, 33, 46, 61, 89]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build-gpu")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--seed", type=int, default=29)
    args = ap.parse_args()
    bt.load_kvattn(args.build)
    bt.SETTLE_S = 0.1
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rng = random.Random(args.seed)
    print("| heads | batch | tokens | plan chunk / work | us | % of 4.6 TB/s |")
    for (hq, hk) in HEADS:
        for B in BATCHES:
            top = 40000 if rng.random() < 0.5 else 4096
            lens = [rng.randint(1, top) for _ in range(B)]
            kv_bytes = sum(lens) * hk * 128 * 4
            nsets = bt.decode_sets(kv_bytes, l2)
            ours = bt.kb.PagedDecode(0, 0, nsets, hq=hq, hk=hk, d=128, page=16, lens=lens)
            info = ours.plan_info
            us = bt.time_calls(ours.run, nsets, args.iters) * 1e3
            ours.free()
            torch.cuda.empty_cache()
            print("| %d/%d | %d (<= %d) | %d | %d / %d | %.1f | %.1f%% |" % (
                hq, hk, B, top, sum(lens), info["kv_chunk_size"], info["num_work"], us,
                100 * kv_bytes / (us * 1e-6) / 4.6e12), flush=True)


if __name__ == "__main__":
    main()
