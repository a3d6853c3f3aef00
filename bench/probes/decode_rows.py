"""decode_rows.py -- a fixed set of decode rows (head dims 32..256, f32 / f16 / bf16, one- and
multi-round plans, a ragged batch) timed on one build: the rows bench/NOTES.md's paired decode
A/B rounds compare, so a kernel change is read on every shape it can move. Run it on each side
alternately (A B B A; scripts/gpu-check.sh's A/B mode:
GPU_CHECK_AB_CMD="python3 bench/probes/decode_rows.py --build {build}"). One table line per row:

    | row | us |

(medians of --iters calls over input sets rotated past the L2, bench_torch.py's time_calls).
--rows takes a comma-separated subset of the rows' tags (d32, d64, d80, d128, d256, ragged; e.g.
d64,ragged).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_torch as bt  # noqa: E402
import torch  # noqa: E402

# (tag, dtype, q heads, kv heads, head dim, batch, context); ragged rows give batch = None and
# name one of bench_torch.py's ragged batches by index in context.
ROWS = [
    ("d64", "bf16", 32, 4, 64, 1, 8192),
    ("d64", "bf16", 32, 4, 64, 8, 4096),
    ("d64", "bf16", 32, 4, 64, 64, 4096),
    ("d64", "bf16", 32, 8, 64, 64, 4096),
    ("d64", "bf16", 16, 16, 64, 64, 4096),
    ("d64", "bf16", 8, 8, 64, 128, 2048),
    ("d64", "f16", 32, 8, 64, 64, 4096),
    ("d64", "f32", 32, 8, 64, 8, 4096),
    ("d32", "bf16", 32, 8, 32, 64, 4096),
    ("d128", "bf16", 32, 8, 128, 1, 8192),
    ("d128", "bf16", 32, 8, 128, 8, 4096),
    ("d128", "bf16", 32, 8, 128, 64, 4096),
    ("d128", "bf16", 32, 32, 128, 64, 4096),
    ("d128", "f16", 32, 8, 128, 8, 4096),
    ("d80", "bf16", 32, 8, 80, 8, 4096),
    ("d256", "bf16", 16, 8, 256, 64, 4096),
    ("d256", "bf16", 16, 16, 256, 8, 4096),
    ("ragged", "bf16", 32, 8, 128, None, 1),
]
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build-gpu")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--rows", default=None, help="tags to run, e.g. d64,ragged")
    args = ap.parse_args()
    bt.load_kvattn(args.build)
    bt.SETTLE_S = 0.1
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    tags = set(args.rows.split(",")) if args.rows else None
    ragged = bt.ragged_decode_batches()
    for (tag, dt, hq, hk, d, batch, ctx) in ROWS:
        if tags and tag not in tags:
            continue
        lens = ragged[ctx][1] if batch is None else [ctx] * batch
        es = torch.finfo(DTYPES[dt]).bits // 8
        nsets = bt.decode_sets(2 * sum(lens) * hk * d * es, l2)
        ours = bt.kb.PagedDecode(0, 0, nsets, hq=hq, hk=hk, d=d, page=16, lens=lens, dtype=DTYPES[dt])
        us = bt.time_calls(ours.run, nsets, args.iters) * 1e3
        ours.free()
        label = ("%s %d/%d d%d %s" % (dt, hq, hk, d, ragged[ctx][0][:3] if batch is None else "%d x %d" % (batch, ctx)))
        print("| %s | %.2f |" % (label, us), flush=True)


if __name__ == "__main__":
    main()
