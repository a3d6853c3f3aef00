"""decode_variant_rows.py -- where a decode variant's time goes: the same paged decode rows
(32 q / 8 kv heads, d 128, bf16, page 16, shuffled pages, input sets rotated past the L2) run
plain, with the built-in soft cap, with the examples' soft-cap snippet (its cap read from caller
data), the same function with the cap a literal (no caller data; unlike the examples' source it
does not define KVA_VARIANT_PINGPONG, which only the prefill kernels read), an identity modifier
and the built-in ALiBi, the modes taking turns over --rounds rounds (round r opens with mode r
mod 6; odd rounds take the others in reverse order). Each series after 0.1 s of idle GPU (README's tables
take 0.5 s). One table line per row and mode, medians of the rounds' medians:

    | row | mode | us | vs base |

(vs base: the snippets against the built-in cap, the others against plain), so the issue's 3%
line is read per mode, and a snippet's cost splits into its caller-data load (snippet against
snippet-const) and the rest (snippet-const against the built-in cap: the generic modifier path,
which identity against plain reads alone, and the snippet's own arithmetic).
Usage: python3 bench/probes/decode_variant_rows.py --build DIR [--shapes 8x4096,64x4096]
           [--rounds 7] [--iters 100]
"""
import argparse
import os
import statistics
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_torch as bt  # noqa: E402
import torch  # noqa: E402

CAP = 50.0
SNIPPET = """#define KVA_VARIANT_PINGPONG 1
float softcap(float score, int32_t q_pos, int32_t kv_pos, int32_t qo_head, const void *user) {
    const float cap = *(const float *)user;
    (void)q_pos; (void)kv_pos; (void)qo_head;
    return cap * kva_tanhf(score * (1.0f / cap));
}"""
SNIPPET_CONST = """float softcap_const(float score, int32_t q_pos, int32_t kv_pos, int32_t qo_head, const void *user) {
    (void)q_pos; (void)kv_pos; (void)qo_head; (void)user;
    return 50.0f * kva_tanhf(score * (1.0f / 50.0f));
}"""
IDENTITY = """float identity(float score, int32_t q_pos, int32_t kv_pos, int32_t qo_head, const void *user) {
    (void)q_pos; (void)kv_pos; (void)qo_head; (void)user;
    return score;
}"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build-gpu")
    ap.add_argument("--shapes", default="8x4096,64x4096")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=100)
    args = ap.parse_args()
    kvattn = bt.load_kvattn(args.build)
    bt.SETTLE_S = 0.1
    opts = {"kinds": "decode", "dtypes": ["bfloat16"], "head_dim": 128}
    variants = {
        "snippet": kvattn.Variant(SNIPPET, "softcap", options=opts, data=struct.pack("=f", CAP)),
        "snippet-const": kvattn.Variant(SNIPPET_CONST, "softcap_const", options=opts),
        "identity": kvattn.Variant(IDENTITY, "identity", options=opts),
        "alibi": kvattn.Variant.alibi(32, options=opts),
    }
    modes = [("plain", 0.0, None), ("cap", CAP, None), ("snippet", 0.0, "snippet"),
             ("snippet-const", 0.0, "snippet-const"), ("identity", 0.0, "identity"), ("alibi", 0.0, "alibi")]
    base = {"plain": None, "cap": "plain", "snippet": "cap", "snippet-const": "cap", "identity": "plain",
            "alibi": "plain"}
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print("device: %s" % torch.cuda.get_device_name(0), flush=True)
    for shape in args.shapes.split(","):
        B, L = (int(x) for x in shape.split("x"))
        nsets = bt.decode_sets(2 * B * L * 8 * 128 * 2, l2)
        row = bt.kb.PagedDecode(B, L, nsets)
        plans = {}
        for name, cap, var in modes:
            wr = kvattn.BatchDecodeWrapper("cuda")
            wr.plan(row.indptr, row.perm, row.last, 32, 8, 128, 16, num_pages=row.num_pages, logits_soft_cap=cap,
                    variant=variants[var] if var else None)
            plans[name] = wr
        times = {name: [] for name, _, _ in modes}
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            if r % 2:  # (reversed after the opening mode, so that every round opens with another)
                order = order[:1] + order[1:][::-1]
            for name, _, _ in order:
                wr = plans[name]
                times[name].append(bt.time_calls(lambda s: wr.run(row.q[s], row.pages[s], out=row.o), nsets,
                                                 args.iters) * 1e3)
        med = {name: statistics.median(v) for name, v in times.items()}
        for name, _, _ in modes:
            b = base[name]
            rel = "" if b is None else "%+.1f%%" % (100.0 * (med[name] / med[b] - 1.0))
            print("| %s | %s | %.2f | %s |" % (shape, name, med[name], rel), flush=True)
        del plans, row
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
