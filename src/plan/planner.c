/* planner.c -- chunk-size binary search and work flattening; see planner.h. */
#include "planner.h"

static int32_t qo_len_of(const kva__split_problem *p, int32_t b) {
    return p->qo_len ? p->qo_len[b] : 1;
}

static int64_t tiles_of(int32_t qo_len, int32_t qo_tile) {
    return ((int64_t)qo_len + qo_tile - 1) / qo_tile;
}

static int64_t chunks_of(int32_t kv_len, int32_t chunk) {
    if (kv_len <= 0) return 1; /* an empty request still writes its (zero) output */
    return ((int64_t)kv_len + chunk - 1) / chunk;
}

int64_t kva__count_work(const kva__split_problem *p, int32_t chunk) {
    int64_t total = 0;
    for (int32_t b = 0; b < p->batch_size; ++b)
        total += tiles_of(qo_len_of(p, b), p->qo_tile) * chunks_of(p->kv_len[b], chunk);
    return total;
}

int32_t kva__search_chunk_size(const kva__split_problem *p) {
    int32_t max_kv = 1;
    for (int32_t b = 0; b < p->batch_size; ++b)
        if (p->kv_len[b] > max_kv) max_kv = p->kv_len[b];
    if (p->fixed_chunk > 0) return p->fixed_chunk;
    if (p->no_split) return max_kv;

    int64_t heads = p->num_kv_heads > 0 ? p->num_kv_heads : 1;
    int32_t low = p->min_chunk > 0 ? p->min_chunk : 1;
    if (low >= max_kv) return max_kv;
    /* If even one chunk per request overflows the budget, splitting only adds merge work. */
    if (kva__count_work(p, max_kv) * heads > p->max_blocks) return max_kv;

    int32_t high = max_kv; /* invariant: high satisfies the budget */
    while (low < high) {
        int32_t mid = low + (high - low) / 2;
        if (kva__count_work(p, mid) * heads > p->max_blocks)
            low = mid + 1;
        else
            high = mid;
    }
    return high;
}

int64_t kva__flatten_work(const kva__split_problem *p, int32_t chunk, int32_t *request_indices,
                          int32_t *qo_tile_indices, int32_t *kv_tile_indices, int64_t capacity,
                          int32_t *group_indptr, int64_t group_capacity) {
    int64_t w = 0, g = 0;
    if (group_capacity < 1) return -1;
    group_indptr[0] = 0;
    for (int32_t b = 0; b < p->batch_size; ++b) {
        int64_t tiles = tiles_of(qo_len_of(p, b), p->qo_tile);
        int64_t chunks = chunks_of(p->kv_len[b], chunk);
        for (int64_t t = 0; t < tiles; ++t) {
            if (g + 1 >= group_capacity) return -1;
            for (int64_t c = 0; c < chunks; ++c) {
                if (w >= capacity) return -1;
                request_indices[w] = b;
                qo_tile_indices[w] = (int32_t)t;
                kv_tile_indices[w] = (int32_t)c;
                ++w;
            }
            group_indptr[++g] = (int32_t)w;
        }
    }
    return w;
}
