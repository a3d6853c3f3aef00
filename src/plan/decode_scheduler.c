/* decode_scheduler.c -- balanced decode chunking and longest-first order; see decode_scheduler.h. */
#include "decode_scheduler.h"

#include <math.h>

int32_t kva__sched_chunks_of(int32_t kv_len, int32_t chunk) {
    if (kv_len <= 0) return 1;
    return (int32_t)(((int64_t)kv_len + chunk - 1) / chunk);
}

void kva__sched_chunk_range(int32_t kv_len, int32_t chunk, int equal, int32_t c, int32_t *beg,
                            int32_t *end) {
    int64_t len = kv_len > 0 ? kv_len : 0, b, e;
    if (equal) {
        int64_t n = kva__sched_chunks_of(kv_len, chunk);
        /* rounded up: the longer parts come first, so a request's first item is its longest */
        b = (c * len + n - 1) / n;
        e = ((c + 1) * len + n - 1) / n;
    } else {
        b = (int64_t)c * chunk;
        e = b + chunk;
    }
    *beg = (int32_t)(b < len ? b : len);
    *end = (int32_t)(e < len ? e : len);
}

/* Keys of the longest work item of a request (what its units cost, up to the fixed part). */
static int32_t item_keys_of(int32_t kv_len, int32_t chunk, int equal) {
    if (kv_len <= 0) return 0;
    if (!equal) return kv_len < chunk ? kv_len : chunk;
    int64_t n = kva__sched_chunks_of(kv_len, chunk);
    return (int32_t)((kv_len + n - 1) / n);
}

/* Ascending heap sort of n int64 keys (no recursion, no allocation, deterministic). */
static void sift_down(int64_t *a, int64_t root, int64_t n) {
    for (;;) {
        int64_t child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n && a[child + 1] > a[child]) ++child;
        if (a[root] >= a[child]) return;
        int64_t t = a[root];
        a[root] = a[child];
        a[child] = t;
        root = child;
    }
}

static void sort_ascending(int64_t *a, int64_t n) {
    for (int64_t i = n / 2 - 1; i >= 0; --i) sift_down(a, i, n);
    for (int64_t end = n - 1; end > 0; --end) {
        int64_t t = a[0];
        a[0] = a[end];
        a[end] = t;
        sift_down(a, 0, end);
    }
}

void kva__sched_decode_order(const kva__split_problem *p, int32_t chunk, int equal, int64_t *keys,
                             int32_t *order) {
    /* (INT32_MAX - item keys, request) ascending: longest item first, then lower request */
    for (int32_t b = 0; b < p->batch_size; ++b)
        keys[b] = ((int64_t)(INT32_MAX - item_keys_of(p->kv_len[b], chunk, equal)) << 32) | b;
    sort_ascending(keys, p->batch_size);
    for (int32_t j = 0; j < p->batch_size; ++j) order[j] = (int32_t)(keys[j] & 0xffffffff);
}

int64_t kva__sched_decode_flatten(const kva__split_problem *p, int32_t chunk, const int32_t *order,
                                  int32_t *request_indices, int32_t *kv_tile_indices,
                                  int64_t capacity, int32_t *group_indptr, int64_t group_capacity) {
    if (group_capacity < (int64_t)p->batch_size + 1) return -1;
    int64_t w = 0;
    group_indptr[0] = 0;
    for (int32_t j = 0; j < p->batch_size; ++j) {
        const int32_t b = order[j], n = kva__sched_chunks_of(p->kv_len[b], chunk);
        for (int32_t c = 0; c < n; ++c) {
            if (w >= capacity) return -1;
            request_indices[w] = b;
            kv_tile_indices[w] = c;
            ++w;
        }
        group_indptr[j + 1] = (int32_t)w;
    }
    return w;
}

/* Integers x in [lo, hi) with x = r (mod m), for 0 <= r < m. */
static int64_t count_congruent(int64_t lo, int64_t hi, int64_t r, int64_t m) {
    if (hi <= lo) return 0;
    /* floor((x - r) / m) for x >= 0 and x = -1 (floor of negatives done by hand) */
    int64_t a = lo - 1 - r, b = hi - 1 - r;
    int64_t fa = a >= 0 ? a / m : -((-a + m - 1) / m);
    int64_t fb = b >= 0 ? b / m : -((-b + m - 1) / m);
    return fb - fa;
}

/* States the busiest merging block reads for a request of n chunks: all n, or with a merge
 * tree of runs of r, one run and then the run states. */
static int64_t merged_states(int64_t n, int32_t r) {
    if (n <= 1) return 0;
    if (r <= 0 || n <= r) return n;
    return r + (n + r - 1) / r;
}

/* Estimated makespan of the plan for `chunk` in the order of kva__sched_decode_order: with
 * units sorted by cost, block loads do not increase with the block index, so block 0 is the
 * slowest. A grid of at most G / sm_blocks units gets an SM per block (the hardware hands out
 * a grid's blocks breadth-first), and a block alone on its SM streams almost sm_blocks times
 * faster (p->lone_block_percent of it, by default KVA__SCHED_LONE_BLOCK_PERCENT) -- its keys,
 * not its fixed costs; otherwise we cannot know which blocks share an SM and take the block's
 * own share. The largest merge is added on top (latency bound; a tree's second level adds
 * merge_level_keys, except where CUDA merges the request shared, without a tree). */
static double estimate_makespan(const kva__split_problem *p, int32_t chunk, const int32_t *order) {
    const int64_t H = p->num_kv_heads > 0 ? p->num_kv_heads : 1;
    const int64_t G = p->max_blocks > 0 ? p->max_blocks : 1;
    const int64_t sm_blocks = p->sm_blocks > 1 ? p->sm_blocks : 1;
    const double next_item = p->next_item_keys > 0 ? p->next_item_keys : KVA__SCHED_NEXT_ITEM_COST_KEYS;
    const double split_scale = p->split_key_percent > 0 ? p->split_key_percent / 100.0 : 1.0;
    double keys0 = 0.0, fixed0 = 0.0, merge = 0.0;
    int64_t pos = 0, units0 = 0, total = 0;
    for (int32_t j = 0; j < p->batch_size; ++j) total += kva__sched_chunks_of(p->kv_len[order[j]], chunk) * H;
    for (int32_t j = 0; j < p->batch_size; ++j) {
        const int32_t len = p->kv_len[order[j]];
        const int64_t n = kva__sched_chunks_of(len, chunk);
        const int64_t mine = count_congruent(pos, pos + n * H, 0, G);
        /* (in double: an item of a 2^31 - 1 key request plus the fixed cost passes int32) */
        keys0 += (double)item_keys_of(len, chunk, 1) * (n > 1 ? split_scale : 1.0) * (double)mine;
        fixed0 += next_item * (double)mine;
        units0 += mine;
        const int64_t states = merged_states(n, p->merge_run);
        const double m = (double)(states * KVA__SCHED_MERGE_COST_PER_STATE_KEYS) + (n > 1 ? (double)p->split_keys : 0.0);
        /* CUDA merges a request shared, on all its chunk blocks at once and with no tree, where
         * each of its units is its block's last: in one round all are; in more, the first G
         * units (blocks walk last to first) or, walking forward, the last G */
        const int shared = p->forward_walk ? pos >= total - G : pos + n * H <= G;
        const double level = p->merge_run > 0 && n > p->merge_run && !shared ? (double)p->merge_level_keys : 0.0;
        if (m + level > merge) merge = m + level;
        pos += n * H;
    }
    /* block 0's first unit starts with the launch, like every block's: the fixed cost of a first unit */
    if (units0 > 0) fixed0 -= next_item - KVA__SCHED_ITEM_COST_KEYS;
    const int32_t lone = p->lone_block_percent > 0 ? p->lone_block_percent : KVA__SCHED_LONE_BLOCK_PERCENT;
    const double share = pos <= G / sm_blocks && sm_blocks > 1 ? (double)sm_blocks * lone / 100.0 : 1.0;
    /* a lone block streams faster, but its fixed costs (launch, first tile, epilogue: latency)
     * are not shorter */
    return fixed0 + keys0 / share + merge;
}

/* The shortest chunk in [lo, hi] whose units (work items x KV heads) fit in max_blocks; hi if
 * none does (units do not increase with the chunk). */
static int64_t one_round_chunk(const kva__split_problem *p, int64_t lo, int64_t hi) {
    const int64_t H = p->num_kv_heads > 0 ? p->num_kv_heads : 1;
    const int64_t G = p->max_blocks > 0 ? p->max_blocks : 1;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        int64_t units = 0;
        for (int32_t b = 0; b < p->batch_size && units <= G; ++b)
            units += (int64_t)kva__sched_chunks_of(p->kv_len[b], (int32_t)mid) * H;
        if (units <= G) hi = mid;
        else lo = mid + 1;
    }
    return hi;
}

/* The chunk before the order: see kva__sched_decode_chunk. */
static int32_t choose_chunk(const kva__split_problem *p, int64_t *keys, int32_t *order,
                            int32_t *ordered_for) {
    int32_t max_len = 1;
    double keys_total = 0.0;
    for (int32_t b = 0; b < p->batch_size; ++b) {
        if (p->kv_len[b] > max_len) max_len = p->kv_len[b];
        keys_total += (double)(p->kv_len[b] > 0 ? p->kv_len[b] : 0) + KVA__SCHED_ITEM_COST_KEYS;
    }
    if (p->fixed_chunk > 0) return p->fixed_chunk;
    if (p->no_split) return max_len;

    const int64_t H = p->num_kv_heads > 0 ? p->num_kv_heads : 1;
    const int64_t G = p->max_blocks > 0 ? p->max_blocks : 1;
    int64_t floor_chunk = p->min_chunk > KVA__SCHED_MIN_SPLIT_CHUNK ? p->min_chunk
                                                                    : KVA__SCHED_MIN_SPLIT_CHUNK;
    if (floor_chunk >= max_len) return max_len;
    /* the merge bound: no request in more chunks than max_chunks (with one block merging all
     * of them, past sqrt(len / merge cost) a chunk adds more merge than it saves streaming; a
     * merge tree reads ~2 sqrt(n) states, and the cost model weighs it) */
    int64_t max_chunks = p->merge_run > 0
                             ? KVA__SCHED_MAX_CHUNKS_PER_REQUEST
                             : (int64_t)sqrt((double)max_len / KVA__SCHED_MERGE_COST_PER_STATE_KEYS);
    if (max_chunks > KVA__SCHED_MAX_CHUNKS_PER_REQUEST) max_chunks = KVA__SCHED_MAX_CHUNKS_PER_REQUEST;
    if (max_chunks > G / H) max_chunks = G / H;
    if (max_chunks <= 1) return max_len;
    const int64_t merge_floor = (max_len + max_chunks - 1) / max_chunks;
    if (merge_floor > floor_chunk) floor_chunk = merge_floor;

    /* candidates from the largest chunk (no split) down; a smaller one must win by 2%, and the
     * search stops once a plan is within 3% of the mean block cost (no plan beats the mean;
     * each candidate costs a sort) */
    int32_t best = max_len;
    kva__sched_decode_order(p, best, 1, keys, order);
    *ordered_for = best;
    double best_cost = estimate_makespan(p, best, order);
    const double mean_block = keys_total * (double)H / (double)G;
    /* candidates: mean block cost x sm_blocks (one block per SM, each streaming almost
     * sm_blocks times faster: 1 x 8192 at 8 KV heads gets 16 chunks of 512), then mean / R */
    const int32_t sm_blocks = p->sm_blocks > 1 ? p->sm_blocks : 1;
    double per_block[16];
    int ncand = 0;
    if (sm_blocks > 1) per_block[ncand++] = (double)sm_blocks;
    /* then the shortest chunk whose units fit one round of the grid (one unit per block: no later
     * unit at all), which the mean-based ones miss when a few long requests share the grid
     * (64 x 8192 on 132 blocks: 2 chunks each; ragged batches at few KV heads: H200, decode
     * kernel, 16/2 d128 33 requests of up to 40k keys 212 -> 149 us; "-1" marks it) */
    per_block[ncand++] = -1.0;
    for (int32_t rounds = 1; rounds <= KVA__SCHED_MAX_ROUNDS; rounds *= 2) per_block[ncand++] = 1.0 / rounds;
    for (int i = 0; i < ncand && best_cost > 1.03 * mean_block; ++i) {
        int64_t c;
        if (per_block[i] < 0.0) {
            c = one_round_chunk(p, floor_chunk, max_len);
        } else {
            double want = ceil(mean_block * per_block[i]);
            c = want > (double)max_len ? max_len : (int64_t)want;
        }
        if (c < floor_chunk) c = floor_chunk;
        c = (c + KVA__SCHED_CHUNK_GRANULE - 1) / KVA__SCHED_CHUNK_GRANULE * KVA__SCHED_CHUNK_GRANULE;
        if (c >= max_len || c >= best) continue;
        kva__sched_decode_order(p, (int32_t)c, 1, keys, order);
        *ordered_for = (int32_t)c;
        double cost = estimate_makespan(p, (int32_t)c, order);
        if (cost < 0.98 * best_cost) {
            best = (int32_t)c;
            best_cost = cost;
        }
    }
    return best;
}

int32_t kva__sched_decode_chunk(const kva__split_problem *p, int64_t *keys, int32_t *order) {
    int32_t ordered_for = 0;
    const int32_t chunk = choose_chunk(p, keys, order, &ordered_for);
    const int equal = p->fixed_chunk <= 0;
    if (!equal || ordered_for != chunk) kva__sched_decode_order(p, chunk, equal, keys, order);
    return chunk;
}

double kva__sched_simulate(int64_t num_work, const int32_t *item_keys, const int32_t *group_indptr,
                           int64_t num_groups, int32_t num_kv_heads, int64_t grid,
                           double *block_cost) {
    const int64_t H = num_kv_heads > 0 ? num_kv_heads : 1, units = num_work * H;
    for (int64_t i = 0; i < grid; ++i) block_cost[i] = 0.0;
    const int64_t launched = units < grid ? units : grid;
    if (launched <= 0) return 0.0;
    for (int64_t u = 0; u < units; ++u) /* a block's first unit, then its later ones */
        block_cost[u % launched] += (double)(u < launched ? KVA__SCHED_ITEM_COST_KEYS : KVA__SCHED_NEXT_ITEM_COST_KEYS) +
                                    (double)item_keys[u / H];
    for (int64_t g = 0; g < num_groups; ++g) {
        const int64_t n = group_indptr[g + 1] - group_indptr[g];
        if (n <= 1) continue;
        for (int64_t kh = 0; kh < H; ++kh) {
            const int64_t last_unit = ((int64_t)group_indptr[g + 1] - 1) * H + kh;
            block_cost[last_unit % launched] += (double)(n * KVA__SCHED_MERGE_COST_PER_STATE_KEYS);
        }
    }
    double worst = 0.0;
    for (int64_t i = 0; i < launched; ++i)
        if (block_cost[i] > worst) worst = block_cost[i];
    return worst;
}
