"""prefill_order_model.py -- the list-scheduling model behind the causal last-wave order
(src/plan/prefill_balance.c, kva__balance_causal_tail; bench/NOTES.md, "Causal plans: the last
wave by order").

The persistent prefill launch walks (KV head, work item) pairs, heads outer, items from the
plan's last; block b takes pair b first and draws its next ticket when it starts an item. An
item costs its causal key tiles plus a fixed overhead (tile-times). Prints, per row, the makespan
over the mean work per block with the plan in flattening order and with the groups of its first
WAVES x BLOCKS items sorted by causal keys (fewest first, stable).

    python3 bench/probes/prefill_order_model.py [overhead]
"""
import heapq
import sys

BLOCKS, HEADS, WAVES = 132, 8, 4
ROWS = {"32 x 512": [512] * 32, "8 x 2048": [2048] * 8, "2 x 8192": [8192] * 2, "1 x 16384": [16384],
        "ragged": [773, 647, 310, 112, 1568, 984, 246, 1632, 4190, 1946, 2053, 336, 1109, 478]}
DIMS = [("d128", 32, 128), ("d64", 48, 128), ("d256", 32, 64)]  # (query tokens per item, keys per tile)


def plan(lens, tok, bn):
    """Groups in flattening order: (causal keys, key tiles) per (request, query tile)."""
    out = []
    for n in lens:
        for t in range((n + tok - 1) // tok):
            keys = min(n, (t + 1) * tok)
            out.append((keys, (keys + bn - 1) // bn))
    return out


def ordered(groups, window):
    k = min(window, len(groups))
    lead = sorted(range(k), key=lambda i: groups[i][0])  # stable
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
    for name, tok, bn in DIMS:
        for row, lens in ROWS.items():
            g = plan(lens, tok, bn)
            a, b = makespan(g, ovh), makespan(ordered(g, WAVES * BLOCKS), ovh)
            print("%-5s %-10s now %.3f  ordered %.3f  (%+.1f%%)" % (name, row, a, b, (a / b - 1) * 100))
