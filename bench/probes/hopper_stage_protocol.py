"""hopper_stage_protocol.py -- a model of the Hopper prefill kernel's K/V stage protocol
(src/cuda/prefill_hopper.cuh) with warpgroups that skip tiles (G::SKIP, -DKVA__HP_SKIP=1),
checked for deadlock on the CPU. Not the kernel: the order of its waits and releases, written
out by hand; re-run it (and update it) when the consumers' wait / release order changes.

The K and the V producer each fill tile t into stage t % S once every consumer warpgroup has
released tile t - S there. A consumer warpgroup walks the items: per tile it waits for K (Q K^T),
then for the previous tile's V (P V), releasing each after use; its tail waits for its last V (and,
with the cross-item tail, the next item's first K). Tiles it skips (n_own < n) are waited for and
released too -- "old": all skipped K stages before its tail, all skipped V stages after it (the
order measured on 2026-11-29, c97220b); "fixed": the same where the warpgroup has rows, K and V
tile by tile where it has none (e4344ed). The system is monotone (a satisfied wait stays
satisfied), so one greedy run decides whether any order completes.

    python3 bench/probes/hopper_stage_protocol.py
prints, for random item sequences, how many deadlock under each order, and for a warpgroup
with rows the smallest number of skipped tiles that deadlocks per stage count (the kernel's
bound is 2: a warpgroup's last row is within ROWS - 64 <= BN keys of its item's).
"""
import random


def consumer_ops(items, c, fixed, xitem):
    """The waits ('w') and releases ('r') of consumer warpgroup c, in order: (op, K|V, tile)."""
    ops, g, s0_done = [], 0, False
    for idx, (n, owns) in enumerate(items):
        own = owns[c]
        nxt = items[idx + 1] if idx + 1 < len(items) else None
        if own > 0:
            if not s0_done:
                ops += [('w', 'K', g), ('r', 'K', g)]
            for j in range(1, own):
                ops += [('w', 'K', g + j), ('w', 'V', g + j - 1), ('r', 'K', g + j), ('r', 'V', g + j - 1)]
        for j in range(own, n):  # skipped K stages before the tail (and V too, row-less, fixed)
            ops += [('w', 'K', g + j), ('r', 'K', g + j)]
            if fixed and own == 0:
                ops += [('w', 'V', g + j), ('r', 'V', g + j)]
        nx_s0 = xitem and nxt is not None and nxt[1][c] > 0 and own > 0
        if nx_s0:  # the next item's first Q K^T under this item's last P V
            ops += [('w', 'V', g + own - 1), ('w', 'K', g + n), ('r', 'K', g + n), ('r', 'V', g + own - 1)]
        elif own > 0:
            ops += [('w', 'V', g + own - 1), ('r', 'V', g + own - 1)]
        for j in range((own if own > 0 else n) if fixed else own, n):  # skipped V stages after it
            ops += [('w', 'V', g + j), ('r', 'V', g + j)]
        s0_done = nx_s0
        g += n
    return ops, g


def completes(items, consumers, stages, fixed, xitem):
    runs = [consumer_ops(items, c, fixed, xitem) for c in range(consumers)]
    tiles = runs[0][1]
    released = {x: [0] * tiles for x in 'KV'}
    filled = {x: 0 for x in 'KV'}  # tiles the producer has filled (in order)
    pos = [0] * consumers
    moved = True
    while moved:
        moved = False
        for x in 'KV':
            t = filled[x]
            while t < tiles and (t < stages or released[x][t - stages] == consumers):
                t += 1
                moved = True
            filled[x] = t
        for c in range(consumers):
            ops = runs[c][0]
            while pos[c] < len(ops):
                op, x, t = ops[pos[c]]
                if op == 'w' and t >= filled[x]:
                    break
                if op == 'r':
                    released[x][t] += 1
                pos[c] += 1
                moved = True
    return all(pos[c] == len(runs[c][0]) for c in range(consumers))


def main():
    rng = random.Random(1)
    dead = {True: 0, False: 0}
    trials = 20000
    for _ in range(trials):
        consumers, stages, xitem = rng.choice([1, 2, 3]), rng.choice([2, 3, 4]), rng.random() < 0.5
        items = []
        for _ in range(rng.randint(1, 5)):
            n = rng.randint(0, 20)
            # row-less (0), or rows skipping at most 2 tiles (the kernel's bound)
            owns = [0 if n == 0 or rng.random() < 0.25 else max(1, n - rng.randint(0, 2)) for _ in range(consumers)]
            items.append((n, owns))
        for fixed in (True, False):
            dead[fixed] += not completes(items, consumers, stages, fixed, xitem)
    print("random item sequences: %d; deadlocked: fixed order %d, old order %d" % (trials, dead[True], dead[False]))
    for stages in (2, 3, 4):
        worst = None
        for consumers in (2, 3):
            for n in range(1, 21):
                for skip in range(n):
                    for xitem in (False, True):
                        owns = [n] * consumers
                        owns[0] = n - skip
                        if not completes([(n, owns), (n, [n] * consumers)], consumers, stages, True, xitem):
                            worst = skip if worst is None else min(worst, skip)
        print("stages %d: a warpgroup with rows deadlocks from %s skipped tiles on" % (stages, worst))


if __name__ == "__main__":
    main()
