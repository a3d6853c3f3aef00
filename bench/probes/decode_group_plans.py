"""decode_group_plans.py -- decode batches of large GQA groups (Falcon-7B 71/1 d64, StarCoder-15B
48/1 d128), which run on the Hopper prefill kernel's persistent grid (one block per SM), timed at
the plan's chunk and at other fixed chunks in one process: whether the decode scheduler's choice
for that grid is the best one the kernel can run (bench/NOTES.md, "Decode on the prefill kernel:
the scheduler's grid"). With --algorithm global_rowmax the same shapes run seed 002's two-pass
algorithm, which these groups run on the sub-group decode kernel. Prints one table line per shape:

    | model | batch x ctx | plan chunk / work items | plan us | c512 | c1024 | c2048 | c4096 | nosplit |

Run it on two builds alternately to compare their plans (scripts/gpu-check.sh's A/B mode:
GPU_CHECK_AB_CMD="python3 bench/probes/decode_group_plans.py --build {build}"). --groups and --shapes
pick others (e.g. --groups 64/1/192,71/1/96 --shapes 1x8192,2x16384 --no-fixed, once as it is and
once under KVA_DECODE_GROUP_PATH=prefill: whether a plan kept on the sub-group decode kernel,
where it merges shared, beats the prefill kernel's); --chunks 128,256,0 times those fixed chunks
(0: no split) instead of the default columns.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_torch as bt  # noqa: E402
import torch  # noqa: E402

GROUPS = [("Falcon-7B", 71, 1, 64), ("StarCoder-15B", 48, 1, 128)]
SHAPES = [(8, 4096), (40, 3000), (64, 1024), (64, 2048), (64, 4096), (100, 4096), (128, 1024), (128, 4096),
          (64, 8192)]
FIXED = [("c512", False, 512), ("c1024", False, 1024), ("c2048", False, 2048), ("c4096", False, 4096),
         ("nosplit", True, 0)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build-gpu")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--no-fixed", action="store_true", help="only the plan's chunk")
    ap.add_argument("--chunks", default=None,
                    help="fixed chunks to time instead of the default columns, e.g. 128,192,256 (0: no split)")
    ap.add_argument("--groups", default=None, help="q/kv/d list, e.g. 71/1/64,48/1/128 (default: Falcon, StarCoder)")
    ap.add_argument("--shapes", default=None, help="batch x context list, e.g. 1x8192,4x8192")
    ap.add_argument("--algorithm", default="partial_rowmax", choices=["partial_rowmax", "global_rowmax"],
                    help="global_rowmax runs these groups on the sub-group decode kernel (two passes)")
    args = ap.parse_args()
    groups = GROUPS if not args.groups else [("%s/%s d%s" % tuple(g.split("/")),) + tuple(int(x) for x in g.split("/"))
                                             for g in args.groups.split(",")]
    shapes = SHAPES if not args.shapes else [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    bt.load_kvattn(args.build)
    bt.SETTLE_S = 0.1
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    fixed_cols = FIXED if not args.chunks else [("c%d" % c if c else "nosplit", c == 0, c)
                                                for c in (int(x) for x in args.chunks.split(","))]
    print("| model | batch x ctx | plan chunk / work | plan us |" +
          ("" if args.no_fixed else " " + " | ".join(f[0] for f in fixed_cols) + " |"))
    for (name, hq, hk, d) in groups:
        for (B, L) in shapes:
            nsets = bt.decode_sets(B * L * hk * d * 4, l2)
            ours = bt.kb.PagedDecode(B, L, nsets, hq=hq, hk=hk, d=d, page=16, algorithm=args.algorithm)
            info = ours.plan_info
            us = bt.time_calls(ours.run, nsets, args.iters) * 1e3
            ours.free()
            cells = []
            for (_, no_split, fixed) in ([] if args.no_fixed else fixed_cols):
                if fixed and fixed >= L:
                    cells.append("-")
                    continue
                try:
                    v = bt.kb.PagedDecode(B, L, nsets, hq=hq, hk=hk, d=d, page=16, no_split=no_split,
                                          fixed_chunk=fixed, algorithm=args.algorithm)
                except bt.kvattn.KvattnError as e:
                    # (a fixed chunk may need more work items than a workspace sized without
                    # limits.min_fixed_chunk holds: that cell is not timed, the rest of the probe is)
                    cells.append("n/a (%s)" % e.status_name)
                    continue
                cells.append("%.1f" % (bt.time_calls(v.run, nsets, args.iters) * 1e3))
                v.free()
            torch.cuda.empty_cache()
            print("| %s | %d x %d | %d / %d | %.1f |%s" % (name, B, L, info["kv_chunk_size"], info["num_work"], us,
                                                          "".join(" %s |" % c for c in cells)), flush=True)


if __name__ == "__main__":
    main()
