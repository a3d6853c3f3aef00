"""prefill_order_model.py -- the list-scheduling model behind the causal last-wave order
(src/plan/prefill_balance.c, kva__balance_causal_tail; bench/NOTES.md, "Causal plans: the last
wave by order").

The persistent prefill launch walks (KV head, work item) pairs, heads outer, items from the
plan's last; block b takes pair b first and draws its next ticket when it starts an item. An
item costs its causal key tiles plus a fixed overhead (tile-times). Prints, per row, the makespan
over the mean work per block with the plan in flattening order and with the groups of its first
WAVES x BLOCKS items sorted by causal key tiles (fewest first, stable) where the library would
sort them: their longest at least twice their shortest, their requests' K/V within half of L2.

    python3 bench/probes/prefill_order_model.py [overhead]
"""
import heapq
import sys

BLOCKS, HEADS, WAVES = 132, 8, 4
CACHE_BYTES = 60 << 20 >> 1  # half of the H200's L2 (policy.order_cache_bytes)
ROWS = {"32 x 512": [512] * 32, "8 x 2048": [2048] * 8, "2 x 8192": [8192] * 2, "1 x 16384": [16384],
        "ragged": [773, 647, 310, 112, 1568, 984, 246, 1632, 4190, 1946, 2053, 336, 1109, 478]}
DIMS = [("d128", 32, 128, 128), ("d64", 48, 128, 64), ("d256", 32, 64, 256)]  # (tokens per item, keys per tile, d)


def plan(lens, tok, bn):
    """Groups in flattening order: (causal keys, key tiles, request) per (request, query tile)."""
    out = []
    for r, n in enumerate(lens):
        for t in range((n + tok - 1) // tok):
            keys = min(n, (t + 1) * tok)
            out.append((keys, (keys + bn - 1) // bn, r))
    return out


def ordered(groups, window, lens, bytes_per_key):
    """kva__balance_causal_tail's rule (prefill_balance.h)."""
    k = min(window, len(groups))
    tiles = [g[1] for g in groups[:k]]
    kv = sum(lens[r] for r in set(g[2] for g in groups[:k])) * bytes_per_key
    if k < 2 or max(tiles) < 2 * min(tiles) or kv > CACHE_BYTES:
        return groups
    lead = sorted(range(k), key=lambda i: groups[i][1])  # stable
    return [groups[i] for i in lead] + groups[k:]


def makespan(groups, overhead):
    costs = [g[1] + overhead for _ in range(HEADS) for g in reversed(groups)]
    starts = [(0.0, b, b) for b in range(min(BLOCKS, len(costs)))]
    heapq.heapify(starts)
    nxt, end = len(starts), [0.0] * BLOCKS
    while starts:
        s, b, i = heapq.heappop(starts)
        end[b] = s + costs[i]
        if nxt < len(costs):  # the ticket drawn when item i starts
            heapq.heappush(starts, (end[b], b, nxt))
            nxt += 1
    return max(end) / (sum(costs) / BLOCKS)


if __name__ == "__main__":
    ovh = float(sys.argv[1]) if len(sys.argv) > 1 else 1.5
    for name, tok, bn, d in DIMS:
        for row, lens in ROWS.items():
            g = plan(lens, tok, bn)
            a, b = makespan(g, ovh), makespan(ordered(g, WAVES * BLOCKS, lens, d * 4), ovh)
            print("%-5s %-10s now %.3f  ordered %.3f  (%+.1f%%)" % (name, row, a, b, (a / b - 1) * 100))
