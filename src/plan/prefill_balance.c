/* prefill_balance.c -- an even last wave for the persistent prefill launch; see prefill_balance.h. */
#include "prefill_balance.h"
#include "planner.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* Cost model, in tile-times of one block: an item costs its key tiles plus a fixed 1.5 for its
 * start and epilogue (the v6.23 model of bench/NOTES.md, which predicted the dynamic walk's gains);
 * a cut adds the split merge, a few microseconds after the launch (~3 tile-times at d128), and
 * must gain more than half a percent to be worth a plan that differs from the plain one. */
#define ITEM_OVERHEAD 1.5
#define MERGE_COST 3.0
#define MIN_GAIN 0.005

static double tiles_of(int32_t keys, int32_t tile_keys) {
    return keys > 0 ? (double)(((int64_t)keys + tile_keys - 1) / tile_keys) : 0.0;
}

/* A min-heap of the blocks' finishing times. */
static void sift_down(double *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, m = i;
        if (l < n && h[l] < h[m]) m = l;
        if (l + 1 < n && h[l + 1] < h[m]) m = l + 1;
        if (m == i) return;
        const double t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* The next free block takes an item of cost c (blocks start at 0, so the first B items go to
 * B distinct blocks, as the launch's first pairs do). */
static void take(double *h, int n, double c) {
    h[0] += c;
    sift_down(h, n, 0);
}

void kva__balance_piece(int32_t keys, int32_t parts, int32_t tile_keys, int32_t j, int32_t *beg, int32_t *end) {
    const int64_t tiles = keys > 0 ? ((int64_t)keys + tile_keys - 1) / tile_keys : 0;
    const int64_t t0 = tiles * j / parts, t1 = tiles * (j + 1) / parts;
    const int64_t b = t0 * tile_keys, e = t1 * tile_keys;
    *beg = (int32_t)(b < keys ? b : keys);
    *end = (int32_t)(e < keys ? e : keys);
}

double kva__balance_makespan(const kva__balance_problem *p, int32_t which, int32_t parts) {
    if (which < 0 || which >= p->num_items) parts = 1;
    const int B = p->blocks > 0 ? p->blocks : 1;
    double *h = (double *)calloc((size_t)B, sizeof(double));
    if (!h) return -1.0;
    for (int32_t kh = 0; kh < p->num_kv_heads; ++kh) {
        /* the launch's order within a head: the plan's last item first; the cut item's pieces
         * sit at the plan's front, so they run last */
        for (int32_t i = p->num_items - 1; i >= 0; --i)
            if (parts <= 1 || i != which) take(h, B, tiles_of(p->item_keys[i], p->tile_keys) + ITEM_OVERHEAD);
        if (parts > 1)
            for (int32_t j = parts - 1; j >= 0; --j) {
                int32_t b, e;
                kva__balance_piece(p->item_keys[which], parts, p->tile_keys, j, &b, &e);
                take(h, B, tiles_of(e - b, p->tile_keys) + ITEM_OVERHEAD);
            }
    }
    double m = 0.0;
    for (int i = 0; i < B; ++i)
        if (h[i] > m) m = h[i];
    free(h);
    return m;
}

int32_t kva__balance_last_wave(const kva__balance_problem *p, int32_t *which) {
    *which = -1;
    if (p->blocks < 2 || p->num_items < 1 || p->num_kv_heads < 1 || p->tile_keys < 1 || p->max_parts < 2)
        return 0;
    const int64_t pairs = (int64_t)p->num_items * p->num_kv_heads;
    /* fewer pairs than blocks: every item has a block of its own (splitting them is the split
     * search's job, planner.h); too many: the last wave is too small a part to matter */
    if (pairs <= p->blocks || pairs > KVA__BALANCE_MAX_PAIRS) return 0;
    int32_t w = 0;
    for (int32_t i = 1; i < p->num_items; ++i)
        if (p->item_keys[i] > p->item_keys[w]) w = i;
    const double tiles = tiles_of(p->item_keys[w], p->tile_keys);
    if (tiles < (p->min_cut_tiles > 0 ? p->min_cut_tiles : KVA__BALANCE_MIN_CUT_TILES)) return 0;
    /* Greedy list scheduling ends within one item of the mean (every block is busy until the
     * last item starts), and no cut ends before the mean: when the longest item cannot pay for
     * the merge and the minimum gain, skip the simulations (O(items) instead of O(pairs log B)). */
    double sum = 0.0;
    for (int32_t i = 0; i < p->num_items; ++i) sum += tiles_of(p->item_keys[i], p->tile_keys) + ITEM_OVERHEAD;
    const double mean = sum * p->num_kv_heads / p->blocks;
    if (tiles + ITEM_OVERHEAD <= MERGE_COST + MIN_GAIN * mean) return 0;
    const double base = kva__balance_makespan(p, -1, 1);
    if (base <= 0.0) return 0;
    double best = base * (1.0 - MIN_GAIN);
    int32_t best_parts = 0;
    for (int32_t parts = 2; parts <= p->max_parts && parts <= tiles; parts *= 2) {
        const double m = kva__balance_makespan(p, w, parts);
        if (m >= 0.0 && m + MERGE_COST < best) {
            best = m + MERGE_COST;
            best_parts = parts;
        }
    }
    if (best_parts) *which = w;
    return best_parts;
}

int64_t kva__balance_apply_cut(int64_t w, int32_t which, int32_t parts, int32_t *req, int32_t *qt, int32_t *kt,
                               int32_t *gi) {
    const int32_t rb = req[which], rq = qt[which];
    /* items after the cut one move up by parts - 1, those before it by parts (from the end) */
    for (int64_t i = w - 1; i > which; --i) {
        req[i + parts - 1] = req[i];
        qt[i + parts - 1] = qt[i];
        kt[i + parts - 1] = kt[i];
    }
    for (int64_t i = (int64_t)which - 1; i >= 0; --i) {
        req[i + parts] = req[i];
        qt[i + parts] = qt[i];
        kt[i + parts] = kt[i];
    }
    for (int32_t j = 0; j < parts; ++j) {
        req[j] = rb;
        qt[j] = rq;
        kt[j] = j;
    }
    /* groups: the cut item's pieces, then one item each */
    gi[0] = 0;
    for (int64_t k = 1; k <= w; ++k) gi[k] = (int32_t)(parts + k - 1);
    return w + parts - 1;
}

int32_t kva__balance_causal_keys(int32_t qo_len, int32_t kv_len, int32_t qo_tile, int32_t t) {
    int32_t tok0, ntok;
    kva__qo_tile_span(qo_len, qo_tile, t, &tok0, &ntok);
    const int64_t keys = (int64_t)kv_len - qo_len + tok0 + ntok;
    return keys < 0 ? 0 : keys > kv_len ? kv_len : (int32_t)keys;
}

int64_t kva__balance_causal_tail(const kva__causal_tail *p, int64_t w, int64_t g, int32_t *req, int32_t *qt,
                                 int32_t *kt, int32_t *gi, int32_t *scratch) {
    int64_t n = 0; /* the leading groups that start inside the window */
    while (n < g && gi[n] < p->window) ++n;
    if (n < 2 || p->qo_tile < 1 || p->tile_keys < 1 || p->cache_bytes <= 0) return 0;
    const int64_t m = gi[n]; /* their items */
    if (m > w) return 0;
    int32_t *key = scratch, *idx = key + n, *tmp = idx + n, *old_gi = tmp + n;
    int32_t *old_req = old_gi + n + 1, *old_qt = old_req + m, *old_kt = old_qt + m;
    bool sorted = true;
    int32_t lo = INT32_MAX, hi = 0;
    int64_t kv_bytes = 0;
    for (int64_t j = 0; j < n; ++j) {
        const int32_t i = gi[j], b = req[i];
        const int32_t keys = kva__balance_causal_keys(p->qo_len[b], p->kv_len[b], p->qo_tile, qt[i]);
        key[j] = (int32_t)(((int64_t)keys + p->tile_keys - 1) / p->tile_keys);
        idx[j] = (int32_t)j;
        if (j > 0 && key[j] < key[j - 1]) sorted = false;
        lo = key[j] < lo ? key[j] : lo;
        hi = key[j] > hi ? key[j] : hi;
        /* (a request's groups are adjacent in plan order: count each request once) */
        if (j == 0 || b != req[gi[j - 1]]) kv_bytes += (int64_t)p->kv_len[b] * p->kv_bytes_per_key;
    }
    if (sorted || hi < 2 * (int64_t)lo || kv_bytes > p->cache_bytes) return 0;
    /* stable bottom-up merge sort of the group indices by key */
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t l = 0; l < n; l += 2 * width) {
            const int64_t mid = l + width < n ? l + width : n, r = l + 2 * width < n ? l + 2 * width : n;
            int64_t a = l, b = mid, o = l;
            while (a < mid && b < r) tmp[o++] = key[idx[b]] < key[idx[a]] ? idx[b++] : idx[a++];
            while (a < mid) tmp[o++] = idx[a++];
            while (b < r) tmp[o++] = idx[b++];
        }
        int32_t *s = idx;
        idx = tmp;
        tmp = s;
    }
    for (int64_t j = 0; j <= n; ++j) old_gi[j] = gi[j];
    for (int64_t i = 0; i < m; ++i) {
        old_req[i] = req[i];
        old_qt[i] = qt[i];
        old_kt[i] = kt[i];
    }
    int64_t o = 0;
    for (int64_t j = 0; j < n; ++j) {
        gi[j] = (int32_t)o;
        for (int32_t i = old_gi[idx[j]]; i < old_gi[idx[j] + 1]; ++i, ++o) {
            req[o] = old_req[i];
            qt[o] = old_qt[i];
            kt[o] = old_kt[i];
        }
    }
    return n; /* (groups from n on keep their items and offsets: gi[n] = m still) */
}
