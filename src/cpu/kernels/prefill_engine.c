/*
 * prefill_engine.c -- one prefill task (see prefill_engine.h): query tile x key range x KV head.
 * Compiled once per ISA variant (simd.h); exported as kva__<variant>_prefill_task_run.
 *
 * Work split inside a task: the tile's tokens x group heads are packed as rows, token-major
 * (row = token * heads_in_pass + head), in passes of at most MAX_ROWS rows; rows form row blocks
 * of KVA__PF_LANES lanes (prefill_kernels.h). Keys stream in blocks of KEY_BLOCK: each block's K
 * and V are converted to f32 once and then used by every row block of the pass. For every (key
 * block, row block) pair the engine computes S = QK^T with the micro-kernel, applies soft cap /
 * score_mod, masks, updates the online softmax (scores kept in log2 units, so exp2) and
 * accumulates PV.
 *
 * Skipping: a pass only visits keys some of its rows can see (causal: up to the last row's
 * position; window: from the first row's lower bound), and each row block narrows that to its
 * own rows, so the causal upper triangle and keys outside the window cost nothing except at
 * the QK_KEYS granularity of the micro-tiles on the diagonal.
 *
 * Memory per task: the pass's packed Q and O (MAX_ROWS x D f32 each, L2-resident), one f32 key
 * block of K and V, one S block of a row block (L1-resident); sources are read once per pass.
 */
#include "prefill_kernels.h"
#include "../cpu_isa.h"
#include "../prefill_engine.h"
#include "../../common/softmax_state.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

/* 256 rows = a 64-token tile times a GQA group of 4 in one pass; Q + O of a pass take 256 KB
 * at head_dim 128, which stays in a core's L2. */
#define MAX_ROWS KVA__PREFILL_MAX_ROWS
#define MAX_ROW_BLOCKS (MAX_ROWS / KVA__PF_LANES)
/* 48 keys: the f32 K and V blocks (48 KB at head_dim 128) plus one S block stay close to L1. */
#define KEY_BLOCK 48

_Static_assert(KEY_BLOCK % KVA__PF_QK_KEYS == 0, "key blocks hold whole QK micro-tiles");
_Static_assert(MAX_ROWS % KVA__PF_LANES == 0, "passes hold whole row blocks");

/* The thread's scratch, carved for one head_dim. */
typedef struct scratch_view {
    float *qt;          /* [MAX_ROW_BLOCKS][D][LANES] packed, transposed, pre-scaled queries */
    float *ot;          /* [MAX_ROW_BLOCKS][D][LANES] output accumulators */
    float *k, *v;       /* [KEY_BLOCK][D] */
    float *s;           /* [KEY_BLOCK][LANES] */
    float *m, *l;       /* [MAX_ROWS] running max (log2 units) and sum */
    int32_t *lane_lo;   /* [MAX_ROWS] first key a row may see */
    int32_t *lane_hi;   /* [MAX_ROWS] last key a row may see (INT32_MAX: no causal limit) */
    int32_t *lane_qpos; /* [MAX_ROWS] query position (score_mod) */
    int32_t *lane_head; /* [MAX_ROWS] query head (score_mod) */
} scratch_view;

static size_t region(size_t bytes) { return (bytes + 63) / 64 * 64; }

size_t KVA__ISA_FN(prefill_scratch_bytes)(int32_t head_dim) {
    size_t D = (size_t)head_dim;
    return 2 * region(sizeof(float) * MAX_ROWS * D) + 2 * region(sizeof(float) * KEY_BLOCK * D) +
           region(sizeof(float) * KEY_BLOCK * KVA__PF_LANES) +
           2 * region(sizeof(float) * MAX_ROWS) + 4 * region(sizeof(int32_t) * MAX_ROWS);
}

static scratch_view carve(void *scratch, int32_t head_dim) {
    size_t D = (size_t)head_dim;
    unsigned char *p = scratch;
    scratch_view sv;
    sv.qt = (float *)p;
    p += region(sizeof(float) * MAX_ROWS * D);
    sv.ot = (float *)p;
    p += region(sizeof(float) * MAX_ROWS * D);
    sv.k = (float *)p;
    p += region(sizeof(float) * KEY_BLOCK * D);
    sv.v = (float *)p;
    p += region(sizeof(float) * KEY_BLOCK * D);
    sv.s = (float *)p;
    p += region(sizeof(float) * KEY_BLOCK * KVA__PF_LANES);
    sv.m = (float *)p;
    p += region(sizeof(float) * MAX_ROWS);
    sv.l = (float *)p;
    p += region(sizeof(float) * MAX_ROWS);
    sv.lane_lo = (int32_t *)p;
    p += region(sizeof(int32_t) * MAX_ROWS);
    sv.lane_hi = (int32_t *)p;
    p += region(sizeof(int32_t) * MAX_ROWS);
    sv.lane_qpos = (int32_t *)p;
    p += region(sizeof(int32_t) * MAX_ROWS);
    sv.lane_head = (int32_t *)p;
    return sv;
}

/* One pass: tokens [t0, t0 + tt) of the task x group heads [g0, g0 + gn). */
typedef struct pass {
    int32_t t0, tt, g0, gn;
    int32_t rows, row_blocks;
} pass;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* ---- packing ------------------------------------------------------------------------------ */

static const unsigned char *q_row(const kva__prefill_config *cfg, const kva__prefill_task *task,
                                  const pass *ps, int32_t r) {
    int32_t t = ps->t0 + r / ps->gn;
    int32_t h = task->kv_head * cfg->group + ps->g0 + r % ps->gn;
    size_t es = kva_dtype_size(cfg->dtype);
    return (const unsigned char *)task->q +
           (size_t)(t * task->q_stride_token + h * task->q_stride_head) * es;
}

/* Transposes the pass's query rows into Qt (row blocks of [D][LANES]), scaled; padding lanes 0. */
static void pack_queries(const kva__prefill_config *cfg, const kva__prefill_task *task,
                         const pass *ps, float scale, const scratch_view *sv) {
    const int D = cfg->head_dim;
    const size_t es = kva_dtype_size(cfg->dtype);
    const kva__vf vscale = kva__splat(scale);
    for (int32_t rb = 0; rb < ps->row_blocks; ++rb) {
        float *qt = sv->qt + (size_t)rb * D * KVA__PF_LANES;
        for (int c = 0; c < 4 && rb * KVA__PF_LANES + KVA__VL * c < ps->rows; ++c) {
            const unsigned char *src[KVA__VL];
            for (int i = 0; i < KVA__VL; ++i) {
                int32_t r = rb * KVA__PF_LANES + KVA__VL * c + i;
                src[i] = r < ps->rows ? q_row(cfg, task, ps, r) : NULL;
            }
            for (int d0 = 0; d0 < D; d0 += KVA__VL) {
                kva__vf x[KVA__VL];
                for (int i = 0; i < KVA__VL; ++i)
                    x[i] = src[i] ? kva__loadv(src[i] + (size_t)d0 * es, cfg->dtype) * vscale
                                  : kva__splat(0.0f);
                kva__transpose(x);
                for (int i = 0; i < KVA__VL; ++i)
                    *(kva__vf *)(qt + (size_t)(d0 + i) * KVA__PF_LANES + KVA__VL * c) = x[i];
            }
        }
    }
}

/* Per-row visibility and identity, token-major, so lane_lo / lane_hi never decrease with the
 * row; padding lanes copy the last row. */
static void init_lanes(const kva__prefill_config *cfg, const kva__prefill_task *task,
                       const pass *ps, const scratch_view *sv) {
    for (int32_t r = 0; r < ps->row_blocks * KVA__PF_LANES; ++r) {
        int32_t rr = r < ps->rows ? r : ps->rows - 1;
        int64_t qpos = (int64_t)task->first_q_pos + ps->t0 + rr / ps->gn;
        int64_t lo = cfg->window_left >= 0 ? max64(0, qpos - cfg->window_left) : 0;
        int64_t hi = cfg->causal ? qpos : INT32_MAX;
        sv->lane_lo[r] = (int32_t)min64(lo, INT32_MAX);
        sv->lane_hi[r] = (int32_t)hi;
        sv->lane_qpos[r] = (int32_t)qpos;
        sv->lane_head[r] = task->kv_head * cfg->group + ps->g0 + rr % ps->gn;
        sv->m[r] = -INFINITY;
        sv->l[r] = 0.0f;
    }
    for (int32_t rb = 0; rb < ps->row_blocks; ++rb)
        memset(sv->ot + (size_t)rb * cfg->head_dim * KVA__PF_LANES, 0,
               sizeof(float) * (size_t)cfg->head_dim * KVA__PF_LANES);
}

/* Walks the element offsets (from k / v, for the task's KV head) of consecutive keys; paged
 * sources step through the page list without a division per key. */
typedef struct key_cursor {
    const kva__kv_source *src;
    int64_t head_off, v_head_off;
    int32_t key, page, slot;
} key_cursor;

static key_cursor key_cursor_at(const kva__prefill_task *task, int32_t key) {
    key_cursor c;
    c.src = &task->kv;
    c.head_off = (int64_t)task->kv_head * task->kv.stride_head;
    c.v_head_off = (int64_t)task->kv_head * task->kv.v_stride_head;
    c.key = key;
    c.page = c.src->pages ? key / c.src->page_size : 0;
    c.slot = c.src->pages ? key % c.src->page_size : 0;
    return c;
}

/* Returns the K offset of the next key and writes its V offset. */
static int64_t key_cursor_next(key_cursor *c, int64_t *v_off) {
    const kva__kv_source *src = c->src;
    int64_t off;
    if (src->pages) {
        off =
            (int64_t)src->pages[c->page] * src->stride_page + (int64_t)c->slot * src->stride_token;
        if (++c->slot == src->page_size) {
            c->slot = 0;
            ++c->page;
        }
        *v_off = off + c->head_off;
    } else {
        off = (src->first_row + c->key) * src->stride_token;
        *v_off = (src->first_row + c->key) * src->v_stride_token + c->v_head_off;
    }
    ++c->key;
    return off + c->head_off;
}

/* Converts keys [kb, kb + n) of the task's KV head to f32 rows; K rows are zero-padded to a
 * whole QK micro-tile. */
static void load_key_block(const kva__prefill_config *cfg, const kva__prefill_task *task,
                           int32_t kb, int32_t n, const scratch_view *sv) {
    const int D = cfg->head_dim;
    const size_t es = kva_dtype_size(cfg->dtype);
    key_cursor cur = key_cursor_at(task, kb);
    for (int32_t j = 0; j < n; ++j) {
        int64_t voff;
        const int64_t off = key_cursor_next(&cur, &voff);
        const unsigned char *kr = (const unsigned char *)task->kv.k + (size_t)off * es;
        const unsigned char *vr = (const unsigned char *)task->kv.v + (size_t)voff * es;
        float *kd = sv->k + (size_t)j * D, *vd = sv->v + (size_t)j * D;
        for (int d = 0; d < D; d += KVA__VL) {
            kva__storeu(kd + d, kva__loadv(kr + (size_t)d * es, cfg->dtype));
            kva__storeu(vd + d, kva__loadv(vr + (size_t)d * es, cfg->dtype));
        }
    }
    int32_t padded = (n + KVA__PF_QK_KEYS - 1) / KVA__PF_QK_KEYS * KVA__PF_QK_KEYS;
    if (padded > n) memset(sv->k + (size_t)n * D, 0, sizeof(float) * (size_t)(padded - n) * D);
}

/* Fetches the next key block's source rows ahead of time, spread evenly over the current
 * block's QK micro-tiles (of all row blocks), so the requests trickle out between FMAs instead
 * of filling the miss queue in one burst. Key rows are short (a few cache lines) and far apart
 * (other heads, other pages), which hardware prefetchers do not follow; a key block's compute
 * hides the latency. */
typedef struct key_prefetcher {
    key_cursor cur;
    int32_t left;     /* keys still to fetch */
    int32_t per_tile; /* keys to fetch after each QK micro-tile */
    const char *k, *v;
    size_t es, row_bytes;
} key_prefetcher;

static key_prefetcher key_prefetcher_at(const kva__prefill_config *cfg,
                                        const kva__prefill_task *task, int32_t kb, int32_t n,
                                        int32_t row_blocks) {
    key_prefetcher pf;
    pf.cur = key_cursor_at(task, kb);
    pf.left = n;
    pf.per_tile = (KVA__PF_QK_KEYS + row_blocks - 1) / row_blocks;
    pf.k = task->kv.k;
    pf.v = task->kv.v;
    pf.es = kva_dtype_size(cfg->dtype);
    pf.row_bytes = (size_t)cfg->head_dim * pf.es;
    return pf;
}

static inline void prefetch_next_keys(key_prefetcher *pf) {
    for (int32_t count = pf->per_tile; count > 0 && pf->left > 0; --count, --pf->left) {
        int64_t voff;
        const int64_t off = key_cursor_next(&pf->cur, &voff);
        const char *kr = pf->k + (size_t)off * pf->es, *vr = pf->v + (size_t)voff * pf->es;
        for (size_t b = 0; b < pf->row_bytes; b += 64) {
            __builtin_prefetch(kr + b);
            __builtin_prefetch(vr + b);
        }
    }
}

/* ---- micro-kernel drivers, specialised per number of row vectors ------------------------- */

/* Scores of keys [j0, j1) (j0 a multiple of QK_KEYS; rows up to the next multiple exist).
 * The row block's RC vectors go through the micro-tile QK_VECS at a time. Kept out of line so
 * the micro-tiles get the whole register file (inlined into the task loop, GCC spilled the
 * loop counters of the AVX2 tiles to the stack). */
#define QK_VECS KVA__PF_QK_VECS
#define PV_VECS KVA__PF_PV_VECS
#define PV_DIMS KVA__PF_PV_DIMS
#define DEFINE_ROW_KERNELS(RC)                                                                     \
    __attribute__((noinline)) static void qk_rows_##RC(const float *qt, const float *k, int D,    \
                                                       int j0, int j1, float *s,                 \
                                                       key_prefetcher *pf) {                     \
        for (int j = j0; j < j1; j += KVA__PF_QK_KEYS) {                                           \
            for (int c = 0; c < RC; c += QK_VECS)                                                  \
                kva__qk_tile(RC - c < QK_VECS ? RC - c : QK_VECS, KVA__PF_QK_KEYS,                 \
                             qt + KVA__VL * c, k + (size_t)j * D, D,                               \
                             s + (size_t)j * KVA__PF_LANES + KVA__VL * c);                         \
            prefetch_next_keys(pf);                                                                \
        }                                                                                          \
    }                                                                                              \
    __attribute__((noinline)) static void pv_rows_##RC(const float *p, int nk, const float *v,    \
                                                       int D, float *ot, const kva__vf *alpha) { \
        for (int c = 0; c < RC; c += PV_VECS) {                                                    \
            const int rc = RC - c < PV_VECS ? RC - c : PV_VECS;                                    \
            int d = 0;                                                                             \
            for (; d + PV_DIMS <= D; d += PV_DIMS)                                                 \
                kva__pv_tile(rc, PV_DIMS, p + KVA__VL * c, nk, v + d, D,                           \
                             ot + (size_t)d * KVA__PF_LANES + KVA__VL * c, alpha + c);             \
            for (; d + 4 <= D; d += 4)                                                             \
                kva__pv_tile(rc, 4, p + KVA__VL * c, nk, v + d, D,                                 \
                             ot + (size_t)d * KVA__PF_LANES + KVA__VL * c, alpha + c);             \
            for (; d < D; d += 2)                                                                  \
                kva__pv_tile(rc, 2, p + KVA__VL * c, nk, v + d, D,                                 \
                             ot + (size_t)d * KVA__PF_LANES + KVA__VL * c, alpha + c);             \
        }                                                                                          \
    }
DEFINE_ROW_KERNELS(1)
DEFINE_ROW_KERNELS(2)
DEFINE_ROW_KERNELS(3)
DEFINE_ROW_KERNELS(4)

static void qk_rows(int rc, const float *qt, const float *k, int D, int j0, int j1, float *s,
                    key_prefetcher *pf) {
    switch (rc) {
    case 1: qk_rows_1(qt, k, D, j0, j1, s, pf); break;
    case 2: qk_rows_2(qt, k, D, j0, j1, s, pf); break;
    case 3: qk_rows_3(qt, k, D, j0, j1, s, pf); break;
    default: qk_rows_4(qt, k, D, j0, j1, s, pf); break;
    }
}

static void pv_rows(int rc, const float *p, int nk, const float *v, int D, float *ot,
                    const kva__vf *alpha) {
    switch (rc) {
    case 1: pv_rows_1(p, nk, v, D, ot, alpha); break;
    case 2: pv_rows_2(p, nk, v, D, ot, alpha); break;
    case 3: pv_rows_3(p, nk, v, D, ot, alpha); break;
    default: pv_rows_4(p, nk, v, D, ot, alpha); break;
    }
}

/* ---- per (key block, row block) steps ----------------------------------------------------- */

/* Soft cap and score_mod on natural-log scores, then conversion to log2 units. score_mod sees
 * only real rows and keys inside their causal / window range. */
static void apply_variants(const kva__prefill_config *cfg, const scratch_view *sv, int rc,
                           int32_t rb_first, int32_t rb_last, int32_t kb, int j0, int j1,
                           kva__vi bad[4]) {
    const float cap = cfg->logits_soft_cap;
    for (int j = j0; j < j1; ++j) {
        const int32_t kpos = kb + j;
        for (int c = 0; c < rc; ++c) {
            float *sp = sv->s + (size_t)j * KVA__PF_LANES + KVA__VL * c;
            kva__vf x = *(kva__vf *)sp;
            if (cap > 0) x = kva__splat(cap) * kva__tanh(x / kva__splat(cap));
            if (cfg->score_mod) {
                for (int i = 0; i < KVA__VL; ++i) {
                    int32_t r = rb_first + KVA__VL * c + i;
                    if (r > rb_last) break;
                    if (kpos < sv->lane_lo[r] || kpos > sv->lane_hi[r]) continue;
                    x[i] = cfg->score_mod(x[i], sv->lane_qpos[r], kpos, sv->lane_head[r],
                                          cfg->score_mod_user);
                    /* a NaN or +inf score is out of range too (only -inf masks the key) */
                    if (x[i] != x[i] || x[i] == INFINITY) bad[c][i] = -1;
                }
            }
            const kva__vf y = x * kva__splat(KVA_LOG2E);
            /* finite in natural units but not in log2 units: out of range (a -inf mask is fine) */
            bad[c] |= (x - x == kva__splat(0.0f)) & ~(y - y == kva__splat(0.0f));
            *(kva__vf *)sp = y;
        }
    }
}

/* Marks lanes (rows) that see a score which is not finite before masking (an overflowed dot
 * product, or log2 units beyond f32 on the fast path): their result becomes NaN, never a
 * plausible wrong value (kvattn.h). Keys a lane cannot see do not count. */
static void flag_overflow(const scratch_view *sv, int rc, int32_t rb_first, int32_t kb, int j0,
                          int j1, kva__vi bad[4]) {
    for (int c = 0; c < rc; ++c) {
        const float *s = sv->s + KVA__VL * c;
        /* x - x is 0 for a finite score and NaN otherwise: one add per vector finds out whether
         * the block holds any non-finite score at all (it almost never does). */
        kva__vf z0 = kva__splat(0.0f), z1 = kva__splat(0.0f);
        int j = j0;
        for (; j + 1 < j1; j += 2) {
            kva__vf x0 = *(const kva__vf *)(s + (size_t)j * KVA__PF_LANES);
            kva__vf x1 = *(const kva__vf *)(s + (size_t)(j + 1) * KVA__PF_LANES);
            z0 += x0 - x0;
            z1 += x1 - x1;
        }
        if (j < j1) {
            kva__vf x0 = *(const kva__vf *)(s + (size_t)j * KVA__PF_LANES);
            z0 += x0 - x0;
        }
        if (kva__hsum(z0 + z1) == 0.0f) continue;
        const kva__vi lo = *(const kva__vi *)(sv->lane_lo + rb_first + KVA__VL * c);
        const kva__vi hi = *(const kva__vi *)(sv->lane_hi + rb_first + KVA__VL * c);
        kva__vi b = kva__splat_i(0);
        for (j = j0; j < j1; ++j) {
            const kva__vi vk = kva__splat_i(kb + j);
            kva__vf x = *(const kva__vf *)(s + (size_t)j * KVA__PF_LANES);
            b |= ~((vk < lo) | (vk > hi)) & ~(x - x == kva__splat(0.0f));
        }
        bad[c] |= b;
    }
}

/* Sets scores of keys outside a row's [lane_lo, lane_hi] to -inf, for the key rows that some
 * lane of the block cannot see. */
static void apply_masks(const scratch_view *sv, int rc, int32_t rb_first, int32_t rb_last,
                        int32_t kb, int j0, int j1) {
    const int32_t lo_max = sv->lane_lo[rb_last], hi_min = sv->lane_hi[rb_first];
    const kva__vf neg_inf = kva__splat(-INFINITY);
    for (int j = j0; j < j1; ++j) {
        const int32_t kpos = kb + j;
        if (kpos >= lo_max && kpos <= hi_min) continue;
        const kva__vi vk = kva__splat_i(kpos);
        for (int c = 0; c < rc; ++c) {
            kva__vi lo = *(const kva__vi *)(sv->lane_lo + rb_first + KVA__VL * c);
            kva__vi hi = *(const kva__vi *)(sv->lane_hi + rb_first + KVA__VL * c);
            float *sp = sv->s + (size_t)j * KVA__PF_LANES + KVA__VL * c;
            *(kva__vf *)sp = kva__select((vk < lo) | (vk > hi), neg_inf, *(kva__vf *)sp);
        }
    }
}

/* Online softmax over key rows [j0, j1) of S (log2 units): new max, rescale factor alpha for
 * the old state, S <- 2^(S - max), running sum. A lane that has seen nothing keeps m = -inf and
 * uses 0 as its reference, so no inf - inf appears. */
static void softmax_update(const scratch_view *sv, int rc, int32_t rb_first, int j0, int j1,
                           kva__vf alpha[4]) {
    for (int c = 0; c < rc; ++c) {
        float *s = sv->s + KVA__VL * c;
        kva__vf mx = kva__splat(-INFINITY);
        for (int j = j0; j < j1; ++j)
            mx = kva__max(mx, *(kva__vf *)(s + (size_t)j * KVA__PF_LANES));
        kva__vf *m = (kva__vf *)(sv->m + rb_first + KVA__VL * c);
        kva__vf *l = (kva__vf *)(sv->l + rb_first + KVA__VL * c);
        kva__vf m_new = kva__max(*m, mx);
        kva__vf m_ref = kva__select(m_new == kva__splat(-INFINITY), kva__splat(0.0f), m_new);
        alpha[c] = kva__exp2(*m - m_ref);
        kva__vf sum = kva__splat(0.0f);
        for (int j = j0; j < j1; ++j) {
            kva__vf *sj = (kva__vf *)(s + (size_t)j * KVA__PF_LANES);
            kva__vf p = kva__exp2(*sj - m_ref);
            *sj = p;
            sum += p;
        }
        *l = kva__fma(*l, alpha[c], sum);
        *m = m_new;
    }
}

/* ---- results ------------------------------------------------------------------------------ */

/* Normalises and writes every row of the pass (transposing Ot back), and its LSE. */
static void write_rows(const kva__prefill_config *cfg, const kva__prefill_task *task,
                       const pass *ps, const scratch_view *sv) {
    const int D = cfg->head_dim;
    const size_t es = kva_dtype_size(task->out_dtype);
    for (int32_t rb = 0; rb < ps->row_blocks; ++rb) {
        const float *ot = sv->ot + (size_t)rb * D * KVA__PF_LANES;
        for (int c = 0; c < 4 && rb * KVA__PF_LANES + KVA__VL * c < ps->rows; ++c) {
            unsigned char *dst[KVA__VL];
            float inv_l[KVA__VL];
            for (int i = 0; i < KVA__VL; ++i) {
                int32_t r = rb * KVA__PF_LANES + KVA__VL * c + i;
                dst[i] = NULL;
                if (r >= ps->rows) continue;
                int32_t t = ps->t0 + r / ps->gn;
                int32_t h = task->kv_head * cfg->group + ps->g0 + r % ps->gn;
                dst[i] = (unsigned char *)task->out +
                         (size_t)(t * task->out_stride_token + h * task->out_stride_head) * es;
                float l = sv->l[r];
                inv_l[i] = l > 0.0f ? 1.0f / l : l == 0.0f ? 0.0f : NAN; /* NaN: overflow */
                if (task->lse)
                    task->lse[(int64_t)t * task->lse_stride_token + h] =
                        kva__state_lse(sv->m[r], l);
            }
            for (int d0 = 0; d0 < D; d0 += KVA__VL) {
                kva__vf x[KVA__VL];
                for (int i = 0; i < KVA__VL; ++i)
                    x[i] = *(const kva__vf *)(ot + (size_t)(d0 + i) * KVA__PF_LANES + KVA__VL * c);
                kva__transpose(x);
                for (int i = 0; i < KVA__VL; ++i)
                    if (dst[i])
                        kva__storev(dst[i] + (size_t)d0 * es, task->out_dtype,
                                    x[i] * kva__splat(inv_l[i]));
            }
        }
    }
}

/* ---- the task ----------------------------------------------------------------------------- */

static void run_pass(const kva__prefill_config *cfg, const kva__prefill_task *task, const pass *ps,
                     const scratch_view *sv) {
    const int D = cfg->head_dim;
    const bool variants = cfg->logits_soft_cap > 0 || cfg->score_mod != NULL;
    /* Fast path: fold log2(e) into Q so scores come out in log2 units. */
    const float scale = variants ? cfg->sm_scale : cfg->sm_scale * KVA_LOG2E;
    init_lanes(cfg, task, ps, sv);
    pack_queries(cfg, task, ps, scale, sv);

    const int64_t lo = max64(task->kv_begin, sv->lane_lo[0]);
    const int64_t hi = min64(task->kv_end, (int64_t)sv->lane_hi[ps->rows - 1] + 1);
    for (int64_t kb64 = lo; kb64 < hi; kb64 += KEY_BLOCK) {
        const int32_t kb = (int32_t)kb64;
        const int32_t n = (int32_t)min64(KEY_BLOCK, hi - kb64);
        load_key_block(cfg, task, kb, n, sv);
        key_prefetcher pf =
            key_prefetcher_at(cfg, task, kb + n, (int32_t)min64(KEY_BLOCK, hi - kb64 - n),
                              ps->row_blocks);
        for (int32_t rb = 0; rb < ps->row_blocks; ++rb) {
            const int32_t first = rb * KVA__PF_LANES;
            const int32_t last = (int32_t)min64(ps->rows, first + KVA__PF_LANES) - 1;
            const int rc = (last - first) / KVA__VL + 1;
            /* keys of this block some row of the row block can see */
            const int j0 = (int)max64(0, (int64_t)sv->lane_lo[first] - kb);
            const int j1 = (int)min64(n, (int64_t)sv->lane_hi[last] - kb + 1);
            if (j0 >= j1) continue;
            const float *qt = sv->qt + (size_t)rb * D * KVA__PF_LANES;
            float *ot = sv->ot + (size_t)rb * D * KVA__PF_LANES;
            qk_rows(rc, qt, sv->k, D, j0 - j0 % KVA__PF_QK_KEYS, j1, sv->s, &pf);
            kva__vi bad[4] = {kva__splat_i(0), kva__splat_i(0), kva__splat_i(0), kva__splat_i(0)};
            flag_overflow(sv, rc, first, kb, j0, j1, bad);
            if (variants) apply_variants(cfg, sv, rc, first, last, kb, j0, j1, bad);
            apply_masks(sv, rc, first, last, kb, j0, j1);
            kva__vf alpha[4];
            softmax_update(sv, rc, first, j0, j1, alpha);
            for (int c = 0; c < rc; ++c) { /* NaN sums stay NaN through later rescales */
                kva__vf *l = (kva__vf *)(sv->l + first + KVA__VL * c);
                *l = kva__select(bad[c], kva__splat(NAN), *l);
            }
            pv_rows(rc, sv->s + (size_t)j0 * KVA__PF_LANES, j1 - j0, sv->v + (size_t)j0 * D, D, ot,
                    alpha);
        }
    }
    write_rows(cfg, task, ps, sv);
}

void KVA__ISA_FN(prefill_task_run)(const kva__prefill_config *cfg, const kva__prefill_task *task,
                                   void *scratch) {
    const scratch_view sv = carve(scratch, cfg->head_dim);
    const int32_t G = cfg->group;
    /* Tokens per pass, then as many group heads as fit beside them. */
    const int32_t tt_max = task->num_tokens < MAX_ROWS ? task->num_tokens : MAX_ROWS;
    int32_t gp = MAX_ROWS / tt_max;
    if (gp > G) gp = G;
    for (int32_t t0 = 0; t0 < task->num_tokens; t0 += tt_max) {
        for (int32_t g0 = 0; g0 < G; g0 += gp) {
            pass ps;
            ps.t0 = t0;
            ps.tt = (int32_t)min64(tt_max, task->num_tokens - t0);
            ps.g0 = g0;
            ps.gn = (int32_t)min64(gp, G - g0);
            ps.rows = ps.tt * ps.gn;
            ps.row_blocks = (ps.rows + KVA__PF_LANES - 1) / KVA__PF_LANES;
            run_pass(cfg, task, &ps, &sv);
        }
    }
}
