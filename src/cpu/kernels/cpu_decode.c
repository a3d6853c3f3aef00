/*
 * cpu_decode.c -- batched decode over the paged KV cache on the CPU (the decode_run entry of an
 * ISA variant's kernel table, cpu_isa.h): one query token per request, at q_pos = kv_len - 1,
 * against the request's keys. Compiled once per ISA variant (see simd.h).
 *
 * Work split. A task is one plan work item (request, key chunk) for a group of consecutive KV
 * heads, with all G = Hq / Hk query heads of each: every K and V byte the task touches is read
 * from memory and converted to f32 exactly once (decode is bound by memory bandwidth; at
 * G = 4 it does about 2 FLOPs per byte). Tasks run on the context's threads under a dynamic
 * schedule. Head groups are as wide as the thread count allows (choose_head_groups), because
 * a task walks its keys token by token across all its heads: in an NHD page the rows of
 * neighbouring heads are adjacent, so the task streams through contiguous memory, which the
 * hardware prefetchers follow; one head alone would read 256 B out of every Hk * 256 B.
 * Keys are walked in blocks of BLOCK_KEYS through the plan's copy of the page table, and within
 * a block in windows of KVA_DECODE_KEY_PAD keys for all heads of the group, prefetching the next
 * window's rows while computing (PREFETCH_KEYS); the inner loops (decode_kernels.h) see only row
 * pointers. A sliding window clips the key range, so keys
 * outside it are never read; causality is automatic for a query at the last position.
 *
 * Requests the plan did not split write O (and LSE) directly. Split requests go through the
 * workspace's device part: per work item, partial O (f32 [rows_per_work = Hq][D]) at
 * off_partial_o and one f32 per row at off_partial_lse, then one merge per (request, head).
 *
 * The two flash-decoding algorithms of seed 002 (kva_decode_algo):
 *   PARTIAL_ROWMAX (Alg. 1): each task runs an online softmax over its chunk (one max / rescale
 *     per block of keys, not per key) and leaves a normalised state (O_i, LSE_i); the merge
 *     weights states by exp(LSE_i - LSE) (softmax_state.h).
 *   GLOBAL_ROWMAX (Alg. 2): pass 1 writes each chunk's scores S (log2 units) to the plan's
 *     score scratch (off_scores, f32 [Hq][sum of kv_len], requests in work order) and its row max R_i to
 *     the partial-LSE slot; pass 2 reduces the request's R_i to the global row max Rmax, then
 *     forms P = exp2(S - Rmax), O_i = P V (unnormalised) and L_i = rowsum(P), storing L_i in the
 *     first score slot of its chunk (its scores are consumed by then); the merge is
 *     O = sum O_i / sum L_i with no rescaling. Unsplit requests do both passes in one task.
 *   Alg. 2 reads K in pass 1 and V in pass 2 (the same bytes as Alg. 1) but also writes and
 *   re-reads 4 * Hq bytes of scores per key.
 */
#include "decode_kernels.h"
#include "../cpu_backend.h"
#include "../cpu_isa.h"
#include "../../common/internal.h"
#include "../../common/softmax_state.h"

#include <math.h>
#include <string.h>

/* Keys per block: one max / rescale of the running state per block. */
#define BLOCK_KEYS 64
/* Software prefetch distance in keys: while one window of KVA_DECODE_KEY_PAD keys is computed,
 * the K (V) rows PREFETCH_KEYS further on are requested into L2, a few lines per score tile
 * (accumulation pass) -- see kva__prefetch_cursor. Shuffled pages break the hardware
 * prefetchers' streams at every page. Measured (2 threads, bf16, NHD / HND): spreading the
 * prefetches this way raised decode from 57-61% to 77-82% / 96-100% of the streaming read
 * bandwidth, where issuing a window's prefetches in one burst stalled the core until they all
 * had line-fill buffers; distance 16 and 32 were equal, 8 was worse; two steps' worth per tile
 * was worse. */
#define PREFETCH_KEYS 16
/* Query heads a task holds at once (its scratch); larger GQA groups are processed in slices
 * of this many, re-reading K/V per slice. */
#define MAX_TASK_HEADS 64
/* Prefetch spans of one window: at most one per key and KV head (nothing merges). */
#define MAX_PF_SPANS (KVA_DECODE_KEY_PAD * MAX_TASK_HEADS)

/* Everything a task reads, decoded once per run from the plan, params and tensors. */
typedef struct decode_job {
    kva_dtype dtype;
    int32_t Hq, Hk, G, D;
    int32_t batch, num_work;
    const int32_t *request;     /* [num_work] request of each work item */
    const int32_t *work_indptr; /* [batch+1] the j-th request in work order (request[wi[j]])
                                   owns work items wi[j] .. wi[j+1]-1 */
    const int32_t *records;     /* [num_work][KVA__UNIT_RECORD_INTS]: key range, merge range */
    const int32_t *page_indptr, *page_indices, *kv_len;
    int32_t page_size;
    const unsigned char *k_base, *v_base;
    int64_t stride_page, stride_token, stride_head; /* bytes */
    size_t row_bytes;   /* one head's row of one key: head_dim elements */
    kva_tensor q, o;
    float *lse;
    float q_scale;      /* sm_scale, times log2(e) when scores need no further transform */
    int plain_scores;   /* no soft cap and no score_mod: q_scale already gives log2 units */
    float soft_cap;
    int32_t window_left;
    kva_score_mod_fn score_mod;
    void *score_mod_user;
    int64_t rows_per_work;
    float *partial_o, *partial_lse;
    float *scores;      /* Alg. 2: [Hq][total_keys] */
    int64_t total_keys;
    /* task shape: KV heads per task and query-head slices per KV head */
    int32_t kv_per_task, kv_groups, slice, slices;
} decode_job;

/* The query heads of one task: KV heads kvh0 .. kvh0+nkv-1, and of each the query heads
 * g0 .. g0+ng-1 of its group. Scratch row r = k * ng + i holds query head (kvh0+k)*G + g0+i. */
typedef struct task_heads {
    int32_t kvh0, nkv, g0, ng;
} task_heads;

static int32_t head_of_row(const decode_job *J, const task_heads *th, int32_t r) {
    return (th->kvh0 + r / th->ng) * J->G + th->g0 + r % th->ng;
}

/* One thread's scratch, carved from ctx->cpu_scratch. */
typedef struct task_scratch {
    float *q;     /* [MAX_TASK_HEADS][D] packed, scaled queries */
    float *o;     /* [MAX_TASK_HEADS][D] packed output accumulators */
    float *s;     /* [MAX_TASK_HEADS][BLOCK_KEYS] scores, then probabilities */
    float *m, *d, *alpha; /* [MAX_TASK_HEADS] running max (log2), sum, rescale */
    int32_t *bad; /* [MAX_TASK_HEADS] 1: a score overflowed f32 in log2 units (output NaN) */
    const unsigned char **krows, **vrows; /* [BLOCK_KEYS + PREFETCH_KEYS] rows of the first KV
                                             head: the block's, then those to prefetch */
    kva__pf_span *spans; /* [MAX_PF_SPANS] the next window's rows, merged where adjacent */
} task_scratch;

static size_t scratch_bytes_needed(int32_t D) {
    size_t f = sizeof(float);
    return kva__align_up((size_t)MAX_TASK_HEADS * (size_t)D * f, 64) * 2 +
           kva__align_up((size_t)MAX_TASK_HEADS * BLOCK_KEYS * f, 64) +
           kva__align_up((size_t)MAX_TASK_HEADS * f, 64) * 4 +
           kva__align_up((BLOCK_KEYS + PREFETCH_KEYS) * sizeof(void *), 64) * 2 +
           kva__align_up(MAX_PF_SPANS * sizeof(kva__pf_span), 64);
}

static task_scratch carve_scratch(unsigned char *p, int32_t D) {
    task_scratch S;
    size_t f = sizeof(float);
    S.q = (float *)(void *)p; p += kva__align_up((size_t)MAX_TASK_HEADS * (size_t)D * f, 64);
    S.o = (float *)(void *)p; p += kva__align_up((size_t)MAX_TASK_HEADS * (size_t)D * f, 64);
    S.s = (float *)(void *)p; p += kva__align_up((size_t)MAX_TASK_HEADS * BLOCK_KEYS * f, 64);
    S.m = (float *)(void *)p; p += kva__align_up((size_t)MAX_TASK_HEADS * f, 64);
    S.d = (float *)(void *)p; p += kva__align_up((size_t)MAX_TASK_HEADS * f, 64);
    S.alpha = (float *)(void *)p; p += kva__align_up((size_t)MAX_TASK_HEADS * f, 64);
    S.bad = (int32_t *)(void *)p; p += kva__align_up((size_t)MAX_TASK_HEADS * f, 64);
    S.krows = (const unsigned char **)(void *)p;
    p += kva__align_up((BLOCK_KEYS + PREFETCH_KEYS) * sizeof(void *), 64);
    S.vrows = (const unsigned char **)(void *)p;
    p += kva__align_up((BLOCK_KEYS + PREFETCH_KEYS) * sizeof(void *), 64);
    S.spans = (kva__pf_span *)(void *)p;
    return S;
}

/* ---- task geometry -------------------------------------------------------------------------- */

/* KV heads per task: all of them while that leaves every thread a task, fewer otherwise, and
 * never more query heads than the scratch holds. Measured (1 thread, bf16, 8 KV heads, d 128,
 * page 16, shuffled pages; % of the same thread's streaming read bandwidth) with 8 / 4 / 2 / 1
 * heads per task: NHD pages 66 / 48 / 47 / 47%, HND pages 78 / 73 / 67 / 64%. A task that skips
 * its neighbours' rows leaves the lines the hardware prefetchers fetch around its own unused. */
static void choose_head_groups(decode_job *J, int threads) {
    J->slice = J->G < MAX_TASK_HEADS ? J->G : MAX_TASK_HEADS;
    J->slices = (J->G + J->slice - 1) / J->slice;
    int32_t max_kv = J->G <= MAX_TASK_HEADS ? MAX_TASK_HEADS / J->G : 1;
    int32_t groups = (J->Hk + max_kv - 1) / max_kv;
    while ((int64_t)J->num_work * groups * J->slices < threads && groups < J->Hk) ++groups;
    J->kv_per_task = (J->Hk + groups - 1) / groups;
    J->kv_groups = (J->Hk + J->kv_per_task - 1) / J->kv_per_task;
}

static int64_t task_count(const decode_job *J) {
    return (int64_t)J->num_work * J->kv_groups * J->slices;
}

/* Task t: work item t / (groups * slices), then KV head group, then slice. */
static task_heads heads_of_task(const decode_job *J, int64_t t, int32_t *w) {
    int64_t per_item = (int64_t)J->kv_groups * J->slices;
    *w = (int32_t)(t / per_item);
    int32_t rest = (int32_t)(t % per_item);
    task_heads th;
    th.kvh0 = rest / J->slices * J->kv_per_task;
    th.nkv = kva__min32(J->kv_per_task, J->Hk - th.kvh0);
    th.g0 = rest % J->slices * J->slice;
    th.ng = kva__min32(J->slice, J->G - th.g0);
    return th;
}

typedef struct task_range {
    int32_t b;
    int32_t chunk_begin, chunk_end; /* the work item's keys */
    int32_t key_begin, key_end;     /* the visible part of them (sliding window) */
    int32_t q_pos;
} task_range;

static task_range range_of(const decode_job *J, int32_t w) {
    task_range r;
    r.b = J->request[w];
    int64_t len = J->kv_len[r.b];
    const int32_t *rec = J->records + (size_t)w * KVA__UNIT_RECORD_INTS;
    int64_t c0 = rec[KVA__UR_KEY_BEG], c1 = rec[KVA__UR_KEY_END];
    r.chunk_begin = (int32_t)c0;
    r.chunk_end = (int32_t)c1;
    r.q_pos = (int32_t)len - 1;
    int64_t lo = J->window_left >= 0 ? (int64_t)r.q_pos - J->window_left : 0;
    r.key_begin = (int32_t)(lo > c0 ? (lo < c1 ? lo : c1) : c0);
    r.key_end = r.chunk_end;
    return r;
}

/* The work items of w's request (its merge range) and whether there are several. */
static int32_t items_begin(const decode_job *J, int32_t w) {
    return J->records[(size_t)w * KVA__UNIT_RECORD_INTS + KVA__UR_ITEM_BEG];
}
static int32_t items_end(const decode_job *J, int32_t w) {
    return J->records[(size_t)w * KVA__UNIT_RECORD_INTS + KVA__UR_ITEM_END];
}
static int item_is_split(const decode_job *J, int32_t w) {
    return items_end(J, w) - items_begin(J, w) > 1;
}
static int group_is_split(const decode_job *J, int32_t j) {
    return J->work_indptr[j + 1] - J->work_indptr[j] > 1;
}

static int32_t padded(int32_t T) {
    return (T + KVA_DECODE_KEY_PAD - 1) / KVA_DECODE_KEY_PAD * KVA_DECODE_KEY_PAD;
}

/* Row pointers of the block's keys [k0, k0 + T) and of up to PREFETCH_KEYS keys after it (not
 * past key_end), for KV head kvh (either array may be NULL); another head's rows are
 * stride_head bytes further. Returns how many rows were gathered. K rows are padded to a
 * multiple of KVA_DECODE_KEY_PAD with real rows (their scores are discarded). */
static int32_t gather_rows(const decode_job *J, const task_range *r, int32_t kvh, int32_t k0,
                           int32_t T, const unsigned char **krows, const unsigned char **vrows) {
    const int32_t *pages = J->page_indices + J->page_indptr[r->b];
    int32_t pos = k0 / J->page_size, slot = k0 % J->page_size;
    int32_t n = kva__min32(T + PREFETCH_KEYS, r->key_end - k0);
    int64_t head = (int64_t)kvh * J->stride_head;
    for (int32_t t = 0; t < n; ++t) {
        int64_t off = (int64_t)pages[pos] * J->stride_page + (int64_t)slot * J->stride_token + head;
        if (krows) krows[t] = J->k_base + off;
        if (vrows) vrows[t] = J->v_base + off;
        if (++slot == J->page_size) {
            slot = 0;
            ++pos;
        }
    }
    if (krows)
        for (int32_t t = n; t < padded(T); ++t) krows[t] = krows[n - 1];
    return n;
}

/* A cursor that prefetches the rows of the window after the one at t0 (of the n gathered
 * rows), for all the task's KV heads, spread over `calls` kernel steps. The rows are listed in
 * address order where the layout allows (token-major for NHD, head-major for HND) and merged
 * into spans where adjacent, so a whole NHD page read across all its heads is one span. */
static kva__prefetch_cursor window_prefetch(const decode_job *J, const task_heads *th,
                                            const unsigned char **rows, int32_t t0, int32_t n,
                                            int32_t calls, kva__pf_span *spans) {
    const int32_t t1 = t0 + PREFETCH_KEYS, t2 = kva__min32(n, t1 + KVA_DECODE_KEY_PAD);
    const int head_major = J->stride_token == (int64_t)J->row_bytes;
    /* NHD with adjacent heads: a token's rows of all the task's heads are one range */
    const int heads_adjacent = !head_major && J->stride_head == (int64_t)J->row_bytes;
    const int32_t outer = head_major ? th->nkv : t2 - t1,
                  inner = head_major ? t2 - t1 : heads_adjacent ? 1 : th->nkv;
    const size_t run_bytes = heads_adjacent ? (size_t)th->nkv * J->row_bytes : J->row_bytes;
    int32_t count = 0;
    size_t bytes = 0;
    for (int32_t i = 0; i < outer; ++i)
        for (int32_t j = 0; j < inner; ++j) {
            int32_t t = t1 + (head_major ? j : i), k = head_major ? i : j;
            const unsigned char *row = rows[t] + (ptrdiff_t)k * J->stride_head;
            if (count > 0 && spans[count - 1].end == row) {
                spans[count - 1].end += run_bytes;
            } else {
                /* from the row's first line, so a row that starts mid-line is covered */
                spans[count].begin = (const unsigned char *)((uintptr_t)row & ~(uintptr_t)63);
                spans[count].end = row + run_bytes;
                ++count;
            }
            bytes += run_bytes;
        }
    kva__prefetch_cursor c;
    c.p = count > 0 ? spans[0].begin : NULL;
    c.end = count > 0 ? spans[0].end : NULL;
    c.next = spans + (count > 0);
    c.last = spans + count;
    int64_t lines = (int64_t)(bytes / 64) + count;
    c.step = (int32_t)((lines + calls - 1) / calls);
    return c;
}

/* Kernel steps (kva__prefetch_step calls) per window and KV head: the score tiles
 * kva__block_scores runs per KVA_DECODE_KEY_PAD keys, and kva__block_accumulate's passes (one
 * per 2 VL lanes of D and the tail, per register group of query heads). */
static int32_t score_steps(int32_t ng) { return kva__score_steps(ng); }
static int32_t value_steps(int32_t ng, int32_t D) { return kva__value_steps(ng, D); }

/* q rows of the task's heads, scaled and in packed order. */
static void load_queries(const decode_job *J, int32_t b, const task_heads *th, float *q) {
    size_t es = kva_dtype_size(J->q.dtype);
    for (int32_t r = 0; r < th->nkv * th->ng; ++r) {
        int32_t hq = head_of_row(J, th, r);
        const unsigned char *row =
            (const unsigned char *)J->q.data + (size_t)(b * J->q.stride_token + hq * J->q.stride_head) * es;
        float *qr = q + (size_t)r * J->D;
        kva__vf scale = kva__splat(J->q_scale);
        int32_t e = 0;
        for (; e + 2 * KVA__VL <= J->D; e += 2 * KVA__VL) {
            kva__vf a, b2;
            kva__load_pair(J->dtype, row + (size_t)e * es, &a, &b2);
            kva__storeu(qr + e, a * scale);
            kva__storeu(qr + e + KVA__VL, b2 * scale);
        }
        if (e < J->D) kva__storeu(qr + e, kva__loadv(row + (size_t)e * es, J->dtype) * scale);
    }
}

/* Soft cap and score_mod on raw scores (natural units) of keys k0.., then log2 units; padding
 * lanes [T, padded(T)) become -inf so they weigh nothing. A row whose dot product is not finite,
 * or whose score leaves f32 range in log2 units (|s| > FLT_MAX / log2(e)), is marked bad: its
 * result is NaN rather than a plausible wrong value (kvattn.h, kva_attn_params). */
static void finish_scores(const decode_job *J, const task_heads *th, float *s, int32_t T,
                          int32_t k0, int32_t q_pos, int32_t *bad) {
    for (int32_t r = 0; r < th->nkv * th->ng; ++r) {
        float *row = s + (size_t)r * BLOCK_KEYS;
        int32_t overflow = 0;
        if (!J->plain_scores) {
            int32_t hq = head_of_row(J, th, r);
            for (int32_t t = 0; t < T; ++t) {
                float x = row[t];
                overflow |= !(x - x == 0.0f);
                if (J->soft_cap > 0) x = J->soft_cap * tanhf(x / J->soft_cap);
                if (J->score_mod) x = J->score_mod(x, q_pos, k0 + t, hq, J->score_mod_user);
                const float y = x * KVA_LOG2E;
                /* not finite in log2 units: out of range, as is a NaN or +inf that score_mod
                 * returned; only a -inf mask is fine */
                overflow |= !(y - y == 0.0f) && x != -INFINITY;
                row[t] = y;
            }
        } else {
            for (int32_t t = 0; t < T; ++t) overflow |= !(row[t] - row[t] == 0.0f);
        }
        bad[r] |= overflow;
        for (int32_t t = T; t < padded(T); ++t) row[t] = -INFINITY;
    }
}

static float row_max(const float *row, int32_t Tpad) {
    kva__vf m = kva__splat(-INFINITY);
    for (int32_t t = 0; t < Tpad; t += KVA__VL) m = kva__max(m, kva__loadu(row + t));
    return kva__hmax(m);
}

/* row[t] = 2^(row[t] - max) over padded lanes; returns the sum. max must be finite. */
static float exp_row(float *row, int32_t Tpad, float max) {
    kva__vf sum = kva__splat(0.0f), mv = kva__splat(max);
    for (int32_t t = 0; t < Tpad; t += KVA__VL) {
        kva__vf p = kva__exp2(kva__loadu(row + t) - mv);
        kva__storeu(row + t, p);
        sum += p;
    }
    return kva__hsum(sum);
}

/* ---- one block of keys for all heads of a task, in windows of KVA_DECODE_KEY_PAD keys ------ */

/* S->s[r][t] for every row r and key t < padded(T) of the block in S->krows, prefetching the K
 * rows of the next window meanwhile (of the n gathered rows). When every head group is whole
 * tiles of 4 query heads x VL/4 keys (G % 4 == 0, as in GQA 32/8), the window is walked key
 * chunk by key chunk (KEY_CHUNK keys for all KV heads, then the next chunk), so an NHD page is
 * read front to back in a few interleaved streams instead of one head's 256 B rows at a time
 * across the whole page; otherwise head by head. Measured (1 thread, bf16 8x4096, AVX-512):
 * 15-16 -> 18-19 GB/s with the chunked order; chunks of 8 or 16 keys were slower. */
#define KEY_CHUNK 4
_Static_assert(KEY_CHUNK % (KVA__VL / 4) == 0 && KVA_DECODE_KEY_PAD % KEY_CHUNK == 0,
               "a key chunk holds whole 4-head tiles");
KVA__INLINE void block_scores(kva_dtype dtype, const decode_job *J, const task_heads *th, int32_t T, int32_t n,
                         task_scratch *S) {
    const int32_t D = J->D, ng = th->ng;
    for (int32_t t0 = 0; t0 < T; t0 += KVA_DECODE_KEY_PAD) {
        kva__prefetch_cursor pf = window_prefetch(J, th, S->krows, t0, n,
                                                 th->nkv * score_steps(ng), S->spans);
        if (ng % 4 == 0) {
            for (int32_t c = t0; c < t0 + KVA_DECODE_KEY_PAD; c += KEY_CHUNK)
                for (int32_t k = 0; k < th->nkv; ++k)
                    for (int32_t g = 0; g < ng; g += 4)
                        for (int32_t t = c; t < c + KEY_CHUNK; t += KVA__VL / 4)
                            kva__score_tile(dtype, 4, KVA__VL / 4, D,
                                            S->q + ((size_t)k * ng + g) * D, S->krows + t,
                                            (ptrdiff_t)k * J->stride_head,
                                            S->s + ((size_t)k * ng + g) * BLOCK_KEYS + t,
                                            BLOCK_KEYS, &pf);
        } else {
            for (int32_t k = 0; k < th->nkv; ++k)
                kva__block_scores(dtype, ng, D, S->q + (size_t)k * ng * D, S->krows + t0,
                                  (ptrdiff_t)k * J->stride_head,
                                  kva__min32(T - t0, KVA_DECODE_KEY_PAD),
                                  S->s + (size_t)k * ng * BLOCK_KEYS + t0, BLOCK_KEYS, &pf);
        }
    }
}

/* S->o[r] += sum_t S->s[r][t] * v[t] for the block in S->vrows, prefetching the V rows of the
 * next window meanwhile. Like the score pass, the window is walked in chunks of VALUE_CHUNK keys
 * for all KV heads (chunk c: heads 0..Hk-1, then chunk c+1), so an NHD page is read front to
 * back in a few streams instead of 16 rows 2 KB apart per head; each chunk reloads and stores
 * the accumulators kva__accumulate_group keeps in registers (one load and one store per vector
 * per VALUE_CHUNK FMAs). Measured (bench/NOTES.md, CPU decode II; 1 thread, paired, CPU time):
 * 8 keys: bf16 avx512 +0-2% from DRAM and +10% in cache, f16 avx512 +6%, avx2 +2-4%; 4 keys
 * lost 3-5% on bf16 avx512 and avx2 f16 (the reloads); 16 = the old order. */
#define VALUE_CHUNK 8
_Static_assert(KVA_DECODE_KEY_PAD % VALUE_CHUNK == 0, "a window holds whole value chunks");
KVA__INLINE void block_values(kva_dtype dtype, const decode_job *J, const task_heads *th, int32_t T, int32_t n,
                         task_scratch *S) {
    const int32_t D = J->D, ng = th->ng;
    for (int32_t t0 = 0; t0 < T; t0 += KVA_DECODE_KEY_PAD) {
        kva__prefetch_cursor pf = window_prefetch(
            J, th, S->vrows, t0, n,
            th->nkv * value_steps(ng, D) * (KVA_DECODE_KEY_PAD / VALUE_CHUNK), S->spans);
        const int32_t t1 = kva__min32(T, t0 + KVA_DECODE_KEY_PAD);
        for (int32_t c = t0; c < t1; c += VALUE_CHUNK)
            for (int32_t k = 0; k < th->nkv; ++k)
                kva__block_accumulate(dtype, ng, D, S->s + (size_t)k * ng * BLOCK_KEYS + c,
                                      BLOCK_KEYS, S->vrows + c, (ptrdiff_t)k * J->stride_head,
                                      kva__min32(t1 - c, VALUE_CHUNK), S->o + (size_t)k * ng * D,
                                      &pf);
    }
}

/* ---- Alg. 1: online softmax over one chunk -------------------------------------------------- */

/* Leaves S->o (unnormalised, packed), S->m (log2), S->d for the task's rows. */
KVA__INLINE void attend_online(kva_dtype dtype, const decode_job *J, const task_range *r,
                          const task_heads *th, task_scratch *S) {
    const int32_t n = th->nkv * th->ng, D = J->D;
    load_queries(J, r->b, th, S->q);
    memset(S->o, 0, sizeof(float) * (size_t)n * (size_t)D);
    for (int32_t i = 0; i < n; ++i) {
        S->m[i] = -INFINITY;
        S->d[i] = 0.0f;
        S->bad[i] = 0;
    }
    for (int32_t k0 = r->key_begin; k0 < r->key_end; k0 += BLOCK_KEYS) {
        int32_t T = kva__min32(BLOCK_KEYS, r->key_end - k0);
        int32_t rows = gather_rows(J, r, th->kvh0, k0, T, S->krows, S->vrows);
        block_scores(dtype, J, th, T, rows, S);
        finish_scores(J, th, S->s, T, k0, r->q_pos, S->bad);
        int any = 0;
        for (int32_t i = 0; i < n; ++i) {
            float *row = S->s + (size_t)i * BLOCK_KEYS;
            float bm = row_max(row, padded(T));
            float m_new = bm > S->m[i] ? bm : S->m[i];
            if (m_new == -INFINITY) { /* nothing visible yet: keep the empty state */
                memset(row, 0, sizeof(float) * (size_t)T);
                continue;
            }
            any = 1;
            float alpha = kva__rescale_log2(S->m[i], m_new);
            if (alpha != 1.0f) {
                float *o = S->o + (size_t)i * D;
                for (int32_t e = 0; e < D; e += KVA__VL)
                    kva__storeu(o + e, kva__loadu(o + e) * kva__splat(alpha));
            }
            S->d[i] = S->d[i] * alpha + exp_row(row, padded(T), m_new);
            S->m[i] = m_new;
        }
        if (any) block_values(dtype, J, th, T, rows, S);
    }
}

/* ---- Alg. 2: the two passes over one chunk ---------------------------------------------------- */

/* Row r's scores in the request-major scratch: srow(r)[k] for key k of the request. */
static float *score_row(const decode_job *J, const task_heads *th, int64_t key_off, int32_t r) {
    return J->scores + (size_t)head_of_row(J, th, r) * (size_t)J->total_keys + (size_t)key_off;
}

/* Pass 1: scores of keys [key_begin, key_end) to the scratch, row maxima (log2) to S->m. */
KVA__INLINE void scores_pass(kva_dtype dtype, const decode_job *J, const task_range *r, const task_heads *th,
                        int64_t key_off, task_scratch *S) {
    const int32_t n = th->nkv * th->ng;
    load_queries(J, r->b, th, S->q);
    for (int32_t i = 0; i < n; ++i) {
        S->m[i] = -INFINITY;
        S->bad[i] = 0;
    }
    for (int32_t k0 = r->key_begin; k0 < r->key_end; k0 += BLOCK_KEYS) {
        int32_t T = kva__min32(BLOCK_KEYS, r->key_end - k0);
        int32_t rows = gather_rows(J, r, th->kvh0, k0, T, S->krows, NULL);
        block_scores(dtype, J, th, T, rows, S);
        finish_scores(J, th, S->s, T, k0, r->q_pos, S->bad);
        for (int32_t i = 0; i < n; ++i) {
            const float *row = S->s + (size_t)i * BLOCK_KEYS;
            memcpy(score_row(J, th, key_off, i) + k0, row, sizeof(float) * (size_t)T);
            float bm = row_max(row, padded(T));
            if (bm > S->m[i]) S->m[i] = bm;
        }
    }
}

/* Pass 2: S->o = sum_k 2^(S_k - rmax) v_k (packed, unnormalised), S->d = sum_k 2^(S_k - rmax),
 * with rmax[r] the global row max. No rescaling: every chunk uses the same rmax. */
KVA__INLINE void values_pass(kva_dtype dtype, const decode_job *J, const task_range *r, const task_heads *th,
                        int64_t key_off, const float *rmax, task_scratch *S) {
    const int32_t n = th->nkv * th->ng;
    memset(S->o, 0, sizeof(float) * (size_t)n * (size_t)J->D);
    int any = 0;
    for (int32_t i = 0; i < n; ++i) {
        S->d[i] = 0.0f;
        any |= rmax[i] != -INFINITY;
    }
    if (!any) return;
    for (int32_t k0 = r->key_begin; k0 < r->key_end; k0 += BLOCK_KEYS) {
        int32_t T = kva__min32(BLOCK_KEYS, r->key_end - k0);
        int32_t rows = gather_rows(J, r, th->kvh0, k0, T, NULL, S->vrows);
        for (int32_t i = 0; i < n; ++i) {
            float *row = S->s + (size_t)i * BLOCK_KEYS;
            if (rmax[i] == -INFINITY) {
                memset(row, 0, sizeof(float) * (size_t)T);
                continue;
            }
            memcpy(row, score_row(J, th, key_off, i) + k0, sizeof(float) * (size_t)T);
            for (int32_t t = T; t < padded(T); ++t) row[t] = -INFINITY;
            S->d[i] += exp_row(row, padded(T), rmax[i]);
        }
        block_values(dtype, J, th, T, rows, S);
    }
}

/* ---- results ---------------------------------------------------------------------------------- */

static unsigned char *output_row(const decode_job *J, int32_t b, int32_t hq) {
    return (unsigned char *)J->o.data +
           (size_t)(b * J->o.stride_token + hq * J->o.stride_head) * kva_dtype_size(J->o.dtype);
}

/* A packed f32 accumulator row times scale, stored in natural order as dst_dtype. */
static void unpack_row(kva_dtype dtype, int32_t D, const float *acc, float scale, void *dst,
                       int dst_dtype) {
    size_t es = dst_dtype == KVA_F32 ? 4 : 2;
    unsigned char *out = dst;
    kva__vf sc = kva__splat(scale);
    int32_t e = 0;
    for (; e + 2 * KVA__VL <= D; e += 2 * KVA__VL) {
        kva__vf lo, hi;
        kva__unpack_pair(dtype, kva__loadu(acc + e) * sc, kva__loadu(acc + e + KVA__VL) * sc, &lo,
                         &hi);
        kva__storev(out + (size_t)e * es, dst_dtype, lo);
        kva__storev(out + (size_t)(e + KVA__VL) * es, dst_dtype, hi);
    }
    if (e < D) kva__storev(out + (size_t)e * es, dst_dtype, kva__loadu(acc + e) * sc);
}

/* Final output row of (b, hq) from a packed f32 accumulator times scale. */
static void write_output(const decode_job *J, int32_t b, int32_t hq, const float *acc, float scale,
                         float lse) {
    unpack_row(J->dtype, J->D, acc, scale, output_row(J, b, hq), J->dtype);
    if (J->lse) J->lse[(size_t)b * J->Hq + hq] = lse;
}

static float *partial_o_row(const decode_job *J, int32_t w, int32_t hq) {
    return J->partial_o + ((size_t)w * (size_t)J->rows_per_work + (size_t)hq) * (size_t)J->D;
}
static float *partial_lse_at(const decode_job *J, int32_t w, int32_t hq) {
    return J->partial_lse + (size_t)w * (size_t)J->rows_per_work + (size_t)hq;
}

/* A packed accumulator times scale into a partial-O row (natural order). */
static void write_partial(const decode_job *J, int32_t w, int32_t hq, const float *acc,
                          float scale) {
    unpack_row(J->dtype, J->D, acc, scale, partial_o_row(J, w, hq), KVA_F32);
}

/* Alg. 1 merge of group j's partial states (its request's chunks) for head hq (softmax_state.h). */
static void merge_online(const decode_job *J, int32_t j, int32_t hq, float *acc) {
    int32_t w0 = J->work_indptr[j], n = J->work_indptr[j + 1] - w0, b = J->request[w0];
    float total = kva__lse_combine(partial_lse_at(J, w0, hq), J->rows_per_work, n);
    memset(acc, 0, sizeof(float) * (size_t)J->D);
    for (int32_t i = 0; i < n; ++i) {
        float wgt = kva__lse_weight(*partial_lse_at(J, w0 + i, hq), total);
        if (wgt == 0.0f) continue;
        const float *src = partial_o_row(J, w0 + i, hq);
        for (int32_t e = 0; e < J->D; ++e) acc[e] += wgt * src[e];
    }
    unpack_row(KVA_F32, J->D, acc, 1.0f, output_row(J, b, hq), J->dtype);
    if (J->lse) J->lse[(size_t)b * J->Hq + hq] = total;
}

/* Alg. 2 merge: O = sum O_i / sum L_i; Rmax from the R_i kept in the partial-LSE slots. */
static void merge_global(const decode_job *J, int32_t j, int32_t hq, int64_t key_off, float *acc) {
    int32_t w0 = J->work_indptr[j], n = J->work_indptr[j + 1] - w0, b = J->request[w0];
    float rmax = -INFINITY, l = 0.0f;
    for (int32_t i = 0; i < n; ++i) {
        float ri = *partial_lse_at(J, w0 + i, hq);
        if (ri > rmax || ri != ri) rmax = ri; /* a NaN R_i (overflow) stays NaN */
        if (rmax != rmax) break;
    }
    memset(acc, 0, sizeof(float) * (size_t)J->D);
    if (rmax != -INFINITY) {
        const float *slots = J->scores + (size_t)hq * (size_t)J->total_keys + key_off;
        for (int32_t i = 0; i < n; ++i) {
            l += slots[range_of(J, w0 + i).chunk_begin];
            const float *src = partial_o_row(J, w0 + i, hq);
            for (int32_t e = 0; e < J->D; ++e) acc[e] += src[e];
        }
    }
    float inv = rmax != rmax ? NAN : l > 0.0f ? 1.0f / l : 0.0f;
    unpack_row(KVA_F32, J->D, acc, inv, output_row(J, b, hq), J->dtype);
    if (J->lse) J->lse[(size_t)b * J->Hq + hq] = kva__state_lse(rmax, l);
}

/* ---- tasks, instantiated per dtype ---------------------------------------------------------- */

KVA__INLINE void task_online(kva_dtype dtype, const decode_job *J, int64_t t, task_scratch *S) {
    int32_t w;
    task_heads th = heads_of_task(J, t, &w);
    task_range r = range_of(J, w);
    attend_online(dtype, J, &r, &th, S);
    int split = item_is_split(J, w);
    for (int32_t i = 0; i < th.nkv * th.ng; ++i) {
        int32_t hq = head_of_row(J, &th, i);
        float inv = S->bad[i] ? NAN : S->d[i] > 0.0f ? 1.0f / S->d[i] : 0.0f;
        float lse = S->bad[i] ? NAN : kva__state_lse(S->m[i], S->d[i]);
        const float *acc = S->o + (size_t)i * J->D;
        if (split) {
            write_partial(J, w, hq, acc, inv);
            *partial_lse_at(J, w, hq) = lse;
        } else {
            write_output(J, r.b, hq, acc, inv, lse);
        }
    }
}

/* Alg. 2, pass 1 of a split request (scores + R_i), or both passes of an unsplit one. */
KVA__INLINE void task_global_first(kva_dtype dtype, const decode_job *J, int64_t t, int64_t key_off,
                              task_scratch *S) {
    int32_t w;
    task_heads th = heads_of_task(J, t, &w);
    task_range r = range_of(J, w);
    const int32_t n = th.nkv * th.ng;
    scores_pass(dtype, J, &r, &th, key_off, S);
    if (item_is_split(J, w)) {
        for (int32_t i = 0; i < n; ++i)
            *partial_lse_at(J, w, head_of_row(J, &th, i)) = S->bad[i] ? NAN : S->m[i];
        return;
    }
    memcpy(S->alpha, S->m, sizeof(float) * (size_t)n); /* rmax: this chunk is the request */
    values_pass(dtype, J, &r, &th, key_off, S->alpha, S);
    for (int32_t i = 0; i < n; ++i) {
        float inv = S->bad[i] ? NAN : S->d[i] > 0.0f ? 1.0f / S->d[i] : 0.0f;
        write_output(J, r.b, head_of_row(J, &th, i), S->o + (size_t)i * J->D, inv,
                     S->bad[i] ? NAN : kva__state_lse(S->alpha[i], S->d[i]));
    }
}

/* Alg. 2, pass 2 of a split request: reduce the R_i to Rmax, then O_i and L_i. */
KVA__INLINE void task_global_second(kva_dtype dtype, const decode_job *J, int64_t t, int64_t key_off,
                               task_scratch *S) {
    int32_t w;
    task_heads th = heads_of_task(J, t, &w);
    task_range r = range_of(J, w);
    const int32_t n = th.nkv * th.ng;
    int32_t w0 = items_begin(J, w), w1 = items_end(J, w);
    for (int32_t i = 0; i < n; ++i) {
        int32_t hq = head_of_row(J, &th, i);
        float rmax = -INFINITY;
        for (int32_t x = w0; x < w1; ++x) {
            float ri = *partial_lse_at(J, x, hq);
            if (ri > rmax || ri != ri) rmax = ri; /* NaN (overflow) wins, merge_global sees it */
            if (rmax != rmax) break;
        }
        S->alpha[i] = rmax;
    }
    values_pass(dtype, J, &r, &th, key_off, S->alpha, S);
    for (int32_t i = 0; i < n; ++i) {
        write_partial(J, w, head_of_row(J, &th, i), S->o + (size_t)i * J->D, 1.0f);
        /* this chunk's scores are consumed: its first slot now holds L_i */
        score_row(J, &th, key_off, i)[r.chunk_begin] = S->d[i];
    }
}

enum task_kind { TASK_ONLINE, TASK_GLOBAL_FIRST, TASK_GLOBAL_SECOND };

KVA__INLINE void run_task(kva_dtype dtype, int kind, const decode_job *J, int64_t t, int64_t key_off,
                     task_scratch *S) {
    if (kind == TASK_ONLINE)
        task_online(dtype, J, t, S);
    else if (kind == TASK_GLOBAL_FIRST)
        task_global_first(dtype, J, t, key_off, S);
    else
        task_global_second(dtype, J, t, key_off, S);
}

/* One copy of the kernels per dtype, each with its conversions inlined. */
static void run_task_f32(int kind, const decode_job *J, int64_t t, int64_t key_off, task_scratch *S) {
    run_task(KVA_F32, kind, J, t, key_off, S);
}
static void run_task_f16(int kind, const decode_job *J, int64_t t, int64_t key_off, task_scratch *S) {
    run_task(KVA_F16, kind, J, t, key_off, S);
}
static void run_task_bf16(int kind, const decode_job *J, int64_t t, int64_t key_off, task_scratch *S) {
    run_task(KVA_BF16, kind, J, t, key_off, S);
}

static void dispatch_task(int kind, const decode_job *J, int64_t t, int64_t key_off, task_scratch *S) {
    if (J->dtype == KVA_F32)
        run_task_f32(kind, J, t, key_off, S);
    else if (J->dtype == KVA_F16)
        run_task_f16(kind, J, t, key_off, S);
    else
        run_task_bf16(kind, J, t, key_off, S);
}

/* Offset of group j's keys in the score scratch, which is laid out in work order (group j =
 * the j-th request of the plan's work list). Each thread takes its tasks and merge rows in
 * increasing order (the schedule hands out increasing indices), so a per-thread cursor makes
 * this O(batch) per thread instead of per task; it restarts if ever asked to go back. */
typedef struct key_cursor {
    int32_t j;
    int64_t off;
} key_cursor;

static int64_t key_offset(key_cursor *c, const decode_job *J, int32_t j) {
    if (j < c->j) {
        c->j = 0;
        c->off = 0;
    }
    for (; c->j < j; ++c->j) c->off += J->kv_len[J->request[J->work_indptr[c->j]]];
    return c->off;
}

static int32_t work_of_task(const decode_job *J, int64_t t) {
    return (int32_t)(t / ((int64_t)J->kv_groups * J->slices));
}

/* The group owning work item w (groups hold consecutive items), by the same cursor. */
static int32_t group_of_work(key_cursor *c, const decode_job *J, int32_t w) {
    if (w < J->work_indptr[c->j]) key_offset(c, J, 0);
    int32_t j = c->j;
    while (J->work_indptr[j + 1] <= w) ++j;
    return j;
}

/* ---- the run ---------------------------------------------------------------------------------- */

/* One phase of a run on the context's threads: tasks, then (split plans) merges, each phase a
 * pool run, so a phase starts only when the one before it has finished everywhere. */
typedef struct decode_phase {
    const kva_context *ctx;
    const decode_job *J;
    int kind; /* global_pass: which pass */
} decode_phase;

static task_scratch thread_scratch(const decode_phase *P, int thread) {
    return carve_scratch(P->ctx->cpu_scratch + (size_t)thread * P->ctx->cpu_scratch_per_thread, P->J->D);
}

static void online_tasks(void *arg, int thread, kva__tasks *tasks) {
    const decode_phase *P = (const decode_phase *)arg;
    task_scratch S = thread_scratch(P, thread);
    int64_t b, e;
    while (kva__tasks_claim(tasks, 1, &b, &e)) dispatch_task(TASK_ONLINE, P->J, b, 0, &S);
}

static void online_merges(void *arg, int thread, kva__tasks *tasks) {
    const decode_phase *P = (const decode_phase *)arg;
    const decode_job *J = P->J;
    task_scratch S = thread_scratch(P, thread);
    int64_t b, e;
    while (kva__tasks_claim(tasks, 8, &b, &e))
        for (int64_t i = b; i < e; ++i) {
            int32_t j = (int32_t)(i / J->Hq);
            if (group_is_split(J, j)) merge_online(J, j, (int32_t)(i % J->Hq), S.o);
        }
}

/* A pass of global rowmax over the tasks: TASK_GLOBAL_FIRST (every task's scores and row maxima)
 * or TASK_GLOBAL_SECOND (the split requests' second pass; every R_i is written by the first).
 * Claims come in increasing order on each thread, so its key cursor only walks forward. */
static void global_pass(void *arg, int thread, kva__tasks *tasks) {
    const decode_phase *P = (const decode_phase *)arg;
    const decode_job *J = P->J;
    task_scratch S = thread_scratch(P, thread);
    key_cursor cur = {0, 0};
    int64_t b, e;
    while (kva__tasks_claim(tasks, 1, &b, &e)) {
        int32_t w = work_of_task(J, b);
        if (P->kind == TASK_GLOBAL_SECOND && !item_is_split(J, w)) continue;
        int32_t j = group_of_work(&cur, J, w);
        dispatch_task(P->kind, J, b, key_offset(&cur, J, j), &S);
    }
}

static void global_merges(void *arg, int thread, kva__tasks *tasks) {
    const decode_phase *P = (const decode_phase *)arg;
    const decode_job *J = P->J;
    task_scratch S = thread_scratch(P, thread);
    key_cursor cur = {0, 0};
    int64_t b, e;
    while (kva__tasks_claim(tasks, 8, &b, &e))
        for (int64_t i = b; i < e; ++i) {
            int32_t j = (int32_t)(i / J->Hq);
            if (!group_is_split(J, j)) continue;
            merge_global(J, j, (int32_t)(i % J->Hq), key_offset(&cur, J, j), S.o);
        }
}

static void run_partial_rowmax(kva_context *ctx, const decode_job *J, int split) {
    const int64_t tasks = task_count(J);
    const int threads = tasks > 1 ? ctx->num_threads : 1;
    decode_phase P = {ctx, J, TASK_ONLINE};
    kva__pool_run(&ctx->cpu_pool, threads, tasks, online_tasks, &P);
    const int64_t rows = (int64_t)J->batch * J->Hq;
    if (split) kva__pool_run(&ctx->cpu_pool, rows > 8 ? threads : 1, rows, online_merges, &P);
}

static void run_global_rowmax(kva_context *ctx, const decode_job *J, int split) {
    const int64_t tasks = task_count(J);
    const int threads = tasks > 1 ? ctx->num_threads : 1;
    decode_phase P = {ctx, J, TASK_GLOBAL_FIRST};
    kva__pool_run(&ctx->cpu_pool, threads, tasks, global_pass, &P);
    if (!split) return;
    P.kind = TASK_GLOBAL_SECOND;
    kva__pool_run(&ctx->cpu_pool, threads, tasks, global_pass, &P);
    const int64_t rows = (int64_t)J->batch * J->Hq;
    kva__pool_run(&ctx->cpu_pool, rows > 8 ? threads : 1, rows, global_merges, &P);
}

kva_status KVA__ISA_FN(decode_run)(kva_context *ctx, const kva_plan *plan,
                                   const kva_attn_params *params, kva_tensor q,
                                   const kva_kv_pages *pages, kva_tensor o, float *lse) {
    const kva__plan_header *h = kva__plan_header_of(plan->workspace.host);
    const int32_t *ints = kva__plan_ints(plan->workspace.host);
    if (ctx->cpu_scratch_per_thread < scratch_bytes_needed(params->head_dim))
        return kva__fail(KVA_ERR_UNSUPPORTED, "kva_decode_run: the context's CPU scratch of %zu bytes "
                         "per thread is too small for head_dim %d", ctx->cpu_scratch_per_thread, params->head_dim);
    if (h->batch_size == 0) return KVA_OK;

    decode_job J;
    memset(&J, 0, sizeof J);
    J.dtype = pages->dtype;
    J.Hq = params->num_qo_heads;
    J.Hk = params->num_kv_heads;
    J.G = J.Hq / J.Hk;
    J.D = params->head_dim;
    J.batch = h->batch_size;
    J.num_work = h->num_work;
    J.request = ints + h->off_request;
    J.work_indptr = ints + h->off_group_indptr;
    J.records = ints + h->off_unit_records;
    J.page_indptr = ints + h->off_kv_indptr;
    J.page_indices = ints + h->off_page_indices;
    J.kv_len = ints + h->off_kv_len;
    J.page_size = pages->page_size;
    size_t es = kva_dtype_size(pages->dtype);
    J.k_base = (const unsigned char *)pages->k_data;
    J.v_base = (const unsigned char *)pages->v_data;
    J.stride_page = pages->stride_page * (int64_t)es;
    J.stride_token = pages->stride_token * (int64_t)es;
    J.stride_head = pages->stride_head * (int64_t)es;
    J.row_bytes = (size_t)J.D * es;
    J.q = q;
    J.o = o;
    J.lse = lse;
    float sm_scale = params->sm_scale > 0 ? params->sm_scale : 1.0f / sqrtf((float)J.D);
    J.plain_scores = !(kva__soft_cap(params->logits_soft_cap) > 0) && !params->score_mod;
    J.q_scale = J.plain_scores ? sm_scale * KVA_LOG2E : sm_scale;
    J.soft_cap = kva__soft_cap(params->logits_soft_cap);
    J.window_left = params->window_left;
    J.score_mod = params->score_mod;
    J.score_mod_user = params->score_mod_user;
    J.rows_per_work = h->rows_per_work;
    unsigned char *dev = (unsigned char *)plan->workspace.device;
    J.partial_o = (float *)(void *)(dev + h->off_partial_o);
    J.partial_lse = (float *)(void *)(dev + h->off_partial_lse);
    J.scores = (float *)(void *)(dev + h->off_scores);
    for (int32_t b = 0; b < J.batch; ++b) J.total_keys += J.kv_len[b];
    choose_head_groups(&J, ctx->num_threads);

    if (h->algo == KVA_DECODE_GLOBAL_ROWMAX)
        run_global_rowmax(ctx, &J, h->split_kv);
    else
        run_partial_rowmax(ctx, &J, h->split_kv);
    return KVA_OK;
}
