/*
 * fuzz_cache.c -- the paged cache manager against a shadow model. An input is a sequence of
 * operations (add, free, fork, reserve, append, page table, stats) with arguments that are often
 * wrong (dead or repeated ids, negative counts, bad layers, tiny capacities). After every call:
 *   - a failing call changed nothing: every byte of the pool, every page table, every length and
 *     the statistics are as before;
 *   - a successful one did what the shadow model says, and every token any live sequence holds
 *     still reads back the K/V last appended for it (so no write ever reached a shared page);
 *   - each page's reference count is the number of live sequences whose table holds it.
 */
#include "fuzz_input.h"
#include "kvattn.h"

#include <stdbool.h>
#include <string.h>

enum { LAYERS = 2, HK = 1, D = 16, MAX_SEQ = 5, MAX_PAGES = 12, MAX_PS = 5, MAX_APPEND = 8,
       MAX_TOK = MAX_PAGES * MAX_PS, MAX_OPS = 64 };

typedef struct shadow_seq {
    bool live;
    int32_t len;
    int32_t tok[LAYERS][MAX_TOK]; /* id of the K/V row appended at each position, -1 = none */
} shadow_seq;

static kva_context *ctx;

typedef struct world {
    kva_cache *cache;
    kva_cache_config cfg;
    shadow_seq seq[MAX_SEQ];
    unsigned char *pool;      /* layer 0's k_data: the whole pool, every layer */
    size_t pool_bytes;
    int32_t next_id;
} world;

static float value_of(int32_t id, int32_t layer, int kv, int32_t d) {
    return (float)(((id * LAYERS + layer) * 2 + kv) * D + d); /* exact in f32 for our ids */
}

/* The page list of one sequence (count returned), through the public page table call. */
static int32_t pages_of(world *w, int32_t s, int32_t *pages, int32_t *last) {
    int32_t indptr[2];
    kva_status st = kva_cache_page_table(w->cache, 1, &s, indptr, pages, MAX_PAGES, last, NULL);
    FZ_ASSERT(st == KVA_OK, "page table of live sequence %d: %s", s, kva_last_error());
    return indptr[1];
}

/* Everything observable, for "a failing call changes nothing". */
typedef struct snapshot {
    unsigned char pool[LAYERS * MAX_PAGES * 2 * MAX_PS * HK * D * 4];
    kva_cache_stats stats;
    int32_t len[MAX_SEQ], npages[MAX_SEQ], pages[MAX_SEQ][MAX_PAGES], last[MAX_SEQ];
    int32_t refcount[MAX_PAGES];
} snapshot;

static void take(world *w, snapshot *s) {
    memset(s, 0, sizeof *s);
    memcpy(s->pool, w->pool, w->pool_bytes);
    FZ_ASSERT(kva_cache_get_stats(w->cache, &s->stats) == KVA_OK, "stats");
    for (int32_t i = 0; i < w->cfg.max_sequences; ++i) {
        if (!w->seq[i].live) continue;
        FZ_ASSERT(kva_cache_seq_len(w->cache, i, &s->len[i]) == KVA_OK, "len");
        s->npages[i] = pages_of(w, i, s->pages[i], &s->last[i]);
    }
    for (int32_t p = 0; p < w->cfg.num_pages; ++p)
        FZ_ASSERT(kva_cache_page_refcount(w->cache, p, &s->refcount[p]) == KVA_OK, "refcount");
}

static void check_unchanged(world *w, const snapshot *before, const char *op) {
    static snapshot after;
    take(w, &after);
    for (size_t i = 0; i < w->pool_bytes; ++i)
        FZ_ASSERT(before->pool[i] == after.pool[i], "failed %s changed pool byte %zu", op, i);
    FZ_ASSERT(memcmp(&before->stats, &after.stats, sizeof after.stats) == 0, "failed %s changed stats", op);
    FZ_ASSERT(memcmp(before->len, after.len, sizeof after.len) == 0, "failed %s changed a length", op);
    FZ_ASSERT(memcmp(before->pages, after.pages, sizeof after.pages) == 0, "failed %s changed pages", op);
    FZ_ASSERT(memcmp(before->last, after.last, sizeof after.last) == 0, "failed %s changed last", op);
    FZ_ASSERT(memcmp(before->refcount, after.refcount, sizeof after.refcount) == 0,
              "failed %s changed a refcount", op);
}

/* Lengths, contents, refcounts and statistics against the shadow. */
static void check_model(world *w, const char *op) {
    int32_t holders[MAX_PAGES] = {0}, live = 0;
    int64_t tokens = 0;
    kva_kv_pages lp[LAYERS];
    for (int32_t l = 0; l < LAYERS; ++l)
        FZ_ASSERT(kva_cache_layer_pages(w->cache, l, &lp[l]) == KVA_OK, "layer pages");
    for (int32_t i = 0; i < w->cfg.max_sequences; ++i) {
        const shadow_seq *s = &w->seq[i];
        int32_t len = -1;
        kva_status st = kva_cache_seq_len(w->cache, i, &len);
        if (!s->live) {
            FZ_ASSERT(st == KVA_ERR_BAD_STATE, "after %s: dead sequence %d answers", op, i);
            continue;
        }
        ++live;
        tokens += s->len;
        FZ_ASSERT(st == KVA_OK && len == s->len, "after %s: seq %d len %d, model %d", op, i, len, s->len);
        int32_t pages[MAX_PAGES], last;
        int32_t np = pages_of(w, i, pages, &last);
        FZ_ASSERT(np == (s->len + w->cfg.page_size - 1) / w->cfg.page_size, "after %s: page count", op);
        for (int32_t j = 0; j < np; ++j) holders[pages[j]] += 1;
        for (int32_t l = 0; l < LAYERS; ++l)
            for (int32_t t = 0; t < s->len; ++t) {
                if (s->tok[l][t] < 0) continue;
                const float *k = (const float *)lp[l].k_data, *v = (const float *)lp[l].v_data;
                int64_t off = pages[t / w->cfg.page_size] * lp[l].stride_page +
                              (t % w->cfg.page_size) * lp[l].stride_token;
                for (int32_t d = 0; d < D; ++d) {
                    FZ_ASSERT(k[off + d] == value_of(s->tok[l][t], l, 0, d),
                              "after %s: seq %d layer %d token %d: K %g, model %g", op, i, l, t,
                              k[off + d], value_of(s->tok[l][t], l, 0, d));
                    FZ_ASSERT(v[off + d] == value_of(s->tok[l][t], l, 1, d), "after %s: V", op);
                }
            }
    }
    int32_t used = 0, shared = 0;
    for (int32_t p = 0; p < w->cfg.num_pages; ++p) {
        int32_t rc = -1;
        FZ_ASSERT(kva_cache_page_refcount(w->cache, p, &rc) == KVA_OK, "refcount");
        FZ_ASSERT(rc == holders[p], "after %s: page %d refcount %d, held by %d", op, p, rc, holders[p]);
        used += rc > 0;
        shared += rc > 1;
    }
    kva_cache_stats st;
    FZ_ASSERT(kva_cache_get_stats(w->cache, &st) == KVA_OK, "stats");
    FZ_ASSERT(st.num_sequences == live && st.num_tokens == tokens && st.used_pages == used &&
                  st.shared_pages == shared && st.free_pages == w->cfg.num_pages - used,
              "after %s: stats disagree", op);
}

/* A batch of ids for reserve / append: usually live and distinct, sometimes not. */
static int32_t pick_batch(fz_in *in, world *w, int32_t *ids, int32_t *counts, int32_t max_count) {
    int32_t n = fz_range(in, 0, MAX_SEQ);
    for (int32_t i = 0; i < n; ++i) {
        ids[i] = fz_range(in, 0, 15) == 0 ? fz_range(in, -1, MAX_SEQ + 1) : fz_range(in, 0, MAX_SEQ - 1);
        counts[i] = fz_range(in, 0, 15) == 0 ? -1 : fz_range(in, 0, max_count);
    }
    (void)w;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ctx) {
        if (kva_context_create(KVA_DEVICE_CPU, 0, &ctx) != KVA_OK) abort();
        kva_context_set_threads(ctx, 1);
    }
    fz_in in = {data, size, 0};
    static world w;
    memset(&w, 0, sizeof w);
    w.cfg = (kva_cache_config){.num_layers = LAYERS, .num_kv_heads = HK, .head_dim = D,
                               .page_size = fz_range(&in, 1, MAX_PS),
                               .num_pages = fz_range(&in, 1, MAX_PAGES), .dtype = KVA_F32,
                               .layout = (kva_layout)fz_range(&in, 0, 1),
                               .max_sequences = fz_range(&in, 1, MAX_SEQ),
                               .max_append_tokens = fz_range(&in, 1, MAX_APPEND)};
    if (kva_cache_create(ctx, &w.cfg, &w.cache) != KVA_OK) abort();
    kva_kv_pages l0, l1;
    kva_cache_layer_pages(w.cache, 0, &l0);
    kva_cache_layer_pages(w.cache, 1, &l1);
    w.pool = l0.k_data;
    w.pool_bytes = (size_t)((unsigned char *)l1.k_data - (unsigned char *)l0.k_data) * LAYERS;
    FZ_ASSERT(w.pool_bytes == (size_t)LAYERS * w.cfg.num_pages * 2 * w.cfg.page_size * HK * D * 4,
              "pool layout");
    memset(w.pool, 0, w.pool_bytes);
    w.next_id = 1;
    static snapshot before;
    static float kbuf[MAX_APPEND * 2 * HK * D] __attribute__((aligned(64)));
    static float vbuf[MAX_APPEND * 2 * HK * D] __attribute__((aligned(64)));

    for (int op = 0; op < MAX_OPS && !fz_done(&in); ++op) {
        take(&w, &before);
        int32_t ids[MAX_SEQ], counts[MAX_SEQ];
        kva_status st;
        const char *name;
        switch (fz_range(&in, 0, 6)) {
        case 0: {
            name = "add";
            int32_t id = -1;
            st = kva_cache_add_sequence(w.cache, &id);
            if (st == KVA_OK) {
                FZ_ASSERT(id >= 0 && id < w.cfg.max_sequences && !w.seq[id].live, "add gave %d", id);
                memset(&w.seq[id], 0, sizeof w.seq[id]);
                memset(w.seq[id].tok, 0xff, sizeof w.seq[id].tok);
                w.seq[id].live = true;
            }
            break;
        }
        case 1: {
            name = "free";
            int32_t id = fz_range(&in, -1, MAX_SEQ);
            st = kva_cache_free_sequence(w.cache, id);
            if (st == KVA_OK) {
                FZ_ASSERT(id >= 0 && id < MAX_SEQ && w.seq[id].live, "freed dead %d", id);
                w.seq[id].live = false;
            }
            break;
        }
        case 2: {
            name = "fork";
            int32_t parent = fz_range(&in, -1, MAX_SEQ), child = -1;
            st = kva_cache_fork(w.cache, parent, &child);
            if (st == KVA_OK) {
                FZ_ASSERT(parent >= 0 && parent < MAX_SEQ && w.seq[parent].live, "forked dead");
                FZ_ASSERT(child >= 0 && child < w.cfg.max_sequences && !w.seq[child].live, "child");
                w.seq[child] = w.seq[parent];
            }
            break;
        }
        case 3: {
            name = "reserve";
            int32_t n = pick_batch(&in, &w, ids, counts, 2 * MAX_PS);
            st = kva_cache_reserve(w.cache, n, ids, counts);
            if (st == KVA_OK)
                for (int32_t i = 0; i < n; ++i) {
                    FZ_ASSERT(w.seq[ids[i]].live && counts[i] >= 0, "reserve accepted a bad id/count");
                    w.seq[ids[i]].len += counts[i];
                }
            break;
        }
        case 4: {
            name = "append";
            int32_t layer = fz_range(&in, 0, 15) == 0 ? fz_range(&in, -1, LAYERS) : fz_range(&in, 0, LAYERS - 1);
            int32_t n = pick_batch(&in, &w, ids, counts, 3);
            int32_t rows = 0, first_id = w.next_id;
            for (int32_t i = 0; i < n; ++i) rows += counts[i] > 0 ? counts[i] : 0;
            if (rows > MAX_APPEND * 2) rows = MAX_APPEND * 2;
            for (int32_t r = 0; r < rows; ++r)
                for (int32_t d = 0; d < D; ++d) {
                    kbuf[r * D + d] = value_of(first_id + r, layer < 0 ? 0 : layer, 0, d);
                    vbuf[r * D + d] = value_of(first_id + r, layer < 0 ? 0 : layer, 1, d);
                }
            st = kva_cache_append(w.cache, layer, n, ids, counts, kva_tensor_nhd(kbuf, KVA_F32, HK, D),
                                  kva_tensor_nhd(vbuf, KVA_F32, HK, D));
            if (st == KVA_OK) {
                int32_t r = 0;
                for (int32_t i = 0; i < n; ++i) {
                    shadow_seq *s = &w.seq[ids[i]];
                    FZ_ASSERT(s->live && counts[i] >= 0 && counts[i] <= s->len, "append accepted bad");
                    for (int32_t t = s->len - counts[i]; t < s->len; ++t) s->tok[layer][t] = first_id + r++;
                }
                FZ_ASSERT(r <= w.cfg.max_append_tokens, "append beyond max_append_tokens");
                w.next_id += r;
            }
            break;
        }
        case 5: {
            name = "page_table";
            int32_t n = pick_batch(&in, &w, ids, counts, 0), cap = fz_range(&in, -1, MAX_PAGES * MAX_SEQ);
            int32_t indptr[MAX_SEQ + 1], idx[MAX_PAGES * MAX_SEQ], last[MAX_SEQ];
            kva_page_table t;
            st = kva_cache_page_table(w.cache, n, ids, indptr, idx, cap, last, &t);
            if (st == KVA_OK)
                for (int32_t i = 0; i < n; ++i) {
                    FZ_ASSERT(w.seq[ids[i]].live, "page table of a dead sequence");
                    int32_t len = indptr[i + 1] == indptr[i]
                                      ? 0 : (indptr[i + 1] - indptr[i] - 1) * w.cfg.page_size + last[i];
                    FZ_ASSERT(len == w.seq[ids[i]].len, "page table length");
                }
            break;
        }
        default: {
            name = "stats";
            kva_cache_stats s;
            st = kva_cache_get_stats(w.cache, &s);
            FZ_ASSERT(st == KVA_OK, "stats");
            break;
        }
        }
        if (st != KVA_OK) {
            FZ_ASSERT(strncmp(kva_last_error(), "kva_cache_", 10) == 0, "%s message: %s", name,
                      kva_last_error());
            check_unchanged(&w, &before, name);
        }
        check_model(&w, name);
    }
    kva_cache_destroy(w.cache);
    return 0;
}
