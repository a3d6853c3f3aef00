/*
 * serve_sim.c -- continuous batching with chunked prefill over the paged KV cache; see
 * serve_sim.h for what one step does. Organised as: setup (buffers, cache, workspaces), the
 * scheduler (reserve / preempt / admit), the step's compute (plan, append, run per layer) and
 * verification against the float64 reference.
 */
#include "serve_sim.h"

#include "synth.h"
#include "verify.h"
#include "../src/reference/reference.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------------------------ */
/* Small helpers                                                                               */
/* ------------------------------------------------------------------------------------------ */

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int32_t ceil_div(int64_t a, int64_t b) { return (int32_t)((a + b - 1) / b); }

/* A host buffer and its device twin (the same memory on the CPU). */
typedef struct staging {
    void *host;
    void *dev;
    size_t bytes;
} staging;

/* ------------------------------------------------------------------------------------------ */
/* State                                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* BLOCKED: a parallel sample waiting for its family's first member to finish the shared
 * prompt; PARKED: forked from it, holding a sequence, waiting for a batch slot. */
typedef enum req_state { REQ_WAITING, REQ_RUNNING, REQ_FINISHED, REQ_BLOCKED, REQ_PARKED } req_state;

typedef struct request {
    int32_t prompt_len, output_len;
    int32_t prefill_target; /* tokens to prefill before decoding (grows after a preemption) */
    int32_t cached;         /* tokens in its cache sequence */
    int32_t high_water;     /* most tokens it ever had cached (recompute accounting) */
    int32_t seq;            /* cache sequence id, -1 when not running */
    int64_t admitted_at;    /* admission stamp: larger = younger */
    req_state state;
    int32_t group;          /* system prompt (root) it starts with, -1 = none */
    int32_t leader;         /* family member whose prompt it shares (itself if none) */
} request;

/* One request's work in the current step: num_new tokens at positions start .. start+num_new-1.
 * Decode items come first in the step's list, prefill items after, matching the row order of
 * the append and of the Q tensors. */
typedef struct step_item {
    int32_t req;
    int32_t seq;
    int32_t start;
    int32_t num_new;
    bool decode;
} step_item;

typedef struct sim {
    kva_context *ctx;
    const sim_config *cfg;
    sim_result *res;
    kva_attn_params params;
    size_t es;                /* bytes per element */
    int32_t num_pages;
    int32_t max_entries;      /* page-table entries a batch can hold: shared pages count once
                                 per sequence, so with forks this exceeds the pool */
    int32_t max_len;          /* longest request, tokens */
    kva_cache *cache;
    request *reqs;
    int32_t running, finished;
    int64_t admit_clock;
    bool preempted_this_step;

    step_item *items;
    int32_t num_items, num_decode;
    int32_t budget;

    /* step arrays */
    int32_t *order;           /* running requests by age */
    int32_t *seq_ids, *num_new;
    int32_t *qo_indptr;
    int32_t *dec_indptr, *dec_indices, *dec_last;
    int32_t *pre_indptr, *pre_indices, *pre_last;
    kva_page_table dec_table, pre_table;

    kva_plan_limits dec_limits, pre_limits;
    kva_workspace dec_ws, pre_ws;
    kva_plan dec_plan, pre_plan;

    staging k_rows, v_rows, q_dec, o_dec, q_pre, o_pre;
    float *row;               /* one token's row of synthetic floats */

    /* verification scratch */
    synth_rng verify_rng;
    void *mirror_k, *mirror_v; /* host copies of one sequence's pages */
    int32_t *mirror_ids;       /* 0, 1, 2, ...: the mirror's page table */
    int64_t page_extent;       /* elements of one page's K (or V) span */
    double *ref_k, *ref_v, *ref_q, *ref_o;
    float *expect;             /* regenerated, dtype-rounded values */
    float *got;                /* an output row in f32 */

    /* prefix sharing */
    int32_t *roots;            /* [prefix_groups] sequences holding the system prompts */
    uint64_t *page_sum;        /* [num_pages] checksum taken when the page became shared */
    bool *page_guarded;        /* [num_pages] page_sum is set */
    unsigned char *page_buf;   /* one page's K or V span, host */
    int32_t *fork_pages;       /* [num_pages] page table scratch */
    double start_time;
} sim;

static kva_status sim_fail(sim *s, kva_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static kva_status sim_fail(sim *s, kva_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->res->error, sizeof s->res->error, fmt, ap);
    va_end(ap);
    return st;
}

/* Wraps a library call: on failure records "what: library message". */
#define SIM_TRY(s, expr, ...)                                                                  \
    do {                                                                                       \
        kva_status st__ = (expr);                                                              \
        if (st__ != KVA_OK) {                                                                  \
            char what__[160];                                                                  \
            snprintf(what__, sizeof what__, __VA_ARGS__);                                      \
            return sim_fail(s, st__, "%s: %s (%s)", what__, kva_last_error(),                  \
                            kva_status_str(st__));                                             \
        }                                                                                      \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* Configuration                                                                               */
/* ------------------------------------------------------------------------------------------ */

void sim_config_default(sim_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->num_requests = 24;
    cfg->seed = 1;
    cfg->num_layers = 4;
    cfg->num_qo_heads = 32;
    cfg->num_kv_heads = 8;
    cfg->head_dim = 128;
    cfg->dtype = KVA_BF16;
    cfg->layout = KVA_LAYOUT_NHD;
    cfg->page_size = 16;
    cfg->num_pages = 0;
    cfg->token_budget = 512;
    cfg->max_batch = 16;
    cfg->prompt_len[0] = 64;
    cfg->prompt_len[1] = 1536;
    cfg->output_len[0] = 16;
    cfg->output_len[1] = 256;
    cfg->verify_every = 16;
    cfg->verify_requests = 2;
    cfg->decode_algo = KVA_DECODE_PARTIAL_ROWMAX;
    cfg->shared_prefix_len = 0;
    cfg->prefix_groups = 1;
    cfg->parallel_samples = 1;
}

/* Auto pool: 9/10 of what max_batch requests of average final length need, so a batch that
 * happens to hold long requests runs out and preempts now and then (the default run shows the
 * path without spending most of its time recomputing); never less than the longest request
 * plus one page per running request. */
static int32_t auto_pages(const sim_config *cfg) {
    int64_t avg = (cfg->prompt_len[0] + cfg->prompt_len[1]) / 2 + cfg->shared_prefix_len +
                  (cfg->output_len[0] + cfg->output_len[1]) / 2;
    int64_t pages = (int64_t)ceil_div((int64_t)cfg->max_batch * avg * 9 / 10, cfg->page_size);
    int64_t floor_pages =
        ceil_div(cfg->prompt_len[1] + cfg->output_len[1], cfg->page_size) + cfg->max_batch;
    return (int32_t)(pages > floor_pages ? pages : floor_pages);
}

/* Pages the system-prompt roots hold for the whole run. */
static int32_t root_pages(const sim_config *cfg) {
    return cfg->shared_prefix_len > 0 ? cfg->prefix_groups * ceil_div(cfg->shared_prefix_len, cfg->page_size)
                                      : 0;
}

static int32_t pool_pages(const sim_config *cfg) {
    return cfg->num_pages > 0 ? cfg->num_pages : auto_pages(cfg) + root_pages(cfg);
}

int64_t sim_pool_bytes(const sim_config *cfg) {
    return (int64_t)pool_pages(cfg) * cfg->num_layers * 2 * cfg->page_size * cfg->num_kv_heads *
           cfg->head_dim * (int64_t)kva_dtype_size(cfg->dtype);
}

static kva_status check_config(sim *s) {
    const sim_config *c = s->cfg;
    if (c->num_requests < 1 || c->num_layers < 1 || c->max_batch < 1 || c->token_budget < 1 ||
        c->page_size < 1)
        return sim_fail(s, KVA_ERR_INVALID_ARG,
                        "requests, layers, max-batch, token-budget and page-size must be >= 1");
    if (c->num_qo_heads < 1 || c->num_kv_heads < 1 || c->num_qo_heads % c->num_kv_heads)
        return sim_fail(s, KVA_ERR_BAD_SHAPE, "kv-heads (%d) must divide heads (%d)",
                        c->num_kv_heads, c->num_qo_heads);
    if (c->prompt_len[0] < 1 || c->prompt_len[0] > c->prompt_len[1] || c->output_len[0] < 0 ||
        c->output_len[0] > c->output_len[1])
        return sim_fail(s, KVA_ERR_INVALID_ARG,
                        "prompt lengths must be >= 1 and output lengths >= 0, with lo <= hi");
    if (kva_dtype_size(c->dtype) == 0) return sim_fail(s, KVA_ERR_INVALID_ARG, "unknown dtype");
    if (c->shared_prefix_len < 0 || c->parallel_samples < 0 ||
        (c->shared_prefix_len > 0 && c->prefix_groups < 1))
        return sim_fail(s, KVA_ERR_INVALID_ARG,
                        "shared-prefix must be >= 0 (with prefix-groups >= 1) and samples >= 1");
    int64_t longest = (int64_t)c->prompt_len[1] + c->output_len[1] + c->shared_prefix_len;
    if (longest > INT32_MAX / 2) return sim_fail(s, KVA_ERR_INVALID_ARG, "requests too long");
    s->max_len = (int32_t)longest;
    s->num_pages = pool_pages(c);
    s->max_entries = s->num_pages;
    if (c->shared_prefix_len > 0 || c->parallel_samples > 1) {
        int64_t most = (int64_t)c->max_batch * ceil_div(longest, c->page_size);
        if (most > s->max_entries) s->max_entries = (int32_t)(most < INT32_MAX / 2 ? most : INT32_MAX / 2);
    }
    int32_t need = ceil_div(longest, c->page_size) + root_pages(c);
    if (s->num_pages < need)
        return sim_fail(s, KVA_ERR_INVALID_ARG,
                        "--pages %d is too small: the longest request (%lld tokens) needs %d pages",
                        s->num_pages, (long long)longest, need);
    return KVA_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Setup and teardown                                                                          */
/* ------------------------------------------------------------------------------------------ */

static kva_status staging_alloc(sim *s, staging *b, size_t bytes) {
    b->bytes = bytes;
    SIM_TRY(s, kva_host_alloc(s->ctx, bytes, &b->host), "allocating %zu host bytes", bytes);
    if (kva_context_device(s->ctx) == KVA_DEVICE_CPU) {
        b->dev = b->host;
    } else {
        SIM_TRY(s, kva_malloc(s->ctx, bytes, &b->dev), "allocating %zu device bytes", bytes);
    }
    return KVA_OK;
}

static void staging_free(sim *s, staging *b) {
    if (b->dev && b->dev != b->host) kva_free(s->ctx, b->dev);
    kva_host_free(s->ctx, b->host);
    b->dev = b->host = NULL;
}

static kva_status upload(sim *s, staging *b, size_t bytes) {
    if (b->dev == b->host || bytes == 0) return KVA_OK;
    SIM_TRY(s, kva_memcpy(s->ctx, b->dev, b->host, bytes, KVA_COPY_HOST_TO_DEVICE), "upload");
    return KVA_OK;
}

static kva_status download(sim *s, staging *b, size_t bytes) {
    if (b->dev == b->host || bytes == 0) return KVA_OK;
    SIM_TRY(s, kva_memcpy(s->ctx, b->host, b->dev, bytes, KVA_COPY_DEVICE_TO_HOST), "download");
    return KVA_OK;
}

static kva_status workspace_alloc(sim *s, kva_workspace *ws, size_t dev_bytes, size_t host_bytes) {
    ws->device_bytes = dev_bytes;
    ws->host_bytes = host_bytes;
    SIM_TRY(s, kva_malloc(s->ctx, dev_bytes, &ws->device), "workspace (%zu bytes)", dev_bytes);
    SIM_TRY(s, kva_host_alloc(s->ctx, host_bytes, &ws->host), "workspace (%zu bytes)", host_bytes);
    return KVA_OK;
}

static void *xcalloc(sim *s, size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) sim_fail(s, KVA_ERR_OUT_OF_MEMORY, "out of host memory");
    return p;
}

/* A new life for request i: fresh lengths (a family's members share the leader's prompt). */
static void new_request(sim *s, int32_t i) {
    request *r = &s->reqs[i];
    const sim_config *c = s->cfg;
    const int32_t n = c->parallel_samples > 1 ? c->parallel_samples : 1;
    r->group = c->shared_prefix_len > 0 ? i / n % c->prefix_groups : -1;
    r->leader = i - i % n;
    if (r->leader == i) {
        r->prompt_len = (r->group >= 0 ? c->shared_prefix_len : 0) +
                        synth_rng_int(&s->verify_rng, c->prompt_len[0], c->prompt_len[1]);
    } else {
        r->prompt_len = s->reqs[r->leader].prompt_len;
    }
    r->output_len = synth_rng_int(&s->verify_rng, c->output_len[0], c->output_len[1]);
    r->prefill_target = r->prompt_len;
    r->cached = r->high_water = 0;
    s->res->prompt_tokens += r->prompt_len;
    s->res->output_tokens += r->output_len;
    r->seq = -1;
    r->state = r->leader == i ? REQ_WAITING : REQ_BLOCKED;
}

static void make_requests(sim *s) {
    synth_rng_seed(&s->verify_rng, s->cfg->seed);
    for (int32_t i = 0; i < s->cfg->num_requests; ++i) new_request(s, i);
}

static kva_status setup(sim *s) {
    const sim_config *c = s->cfg;
    s->params = kva_attn_params_default(c->num_qo_heads, c->num_kv_heads, c->head_dim);
    s->params.causal = 1;
    s->es = kva_dtype_size(c->dtype);
    const int32_t Hq = c->num_qo_heads, Hk = c->num_kv_heads, D = c->head_dim, B = c->max_batch;

    kva_cache_config cc = {0};
    cc.num_layers = c->num_layers;
    cc.num_kv_heads = Hk;
    cc.head_dim = D;
    cc.page_size = c->page_size;
    cc.num_pages = s->num_pages;
    cc.dtype = c->dtype;
    cc.layout = c->layout;
    /* running requests, parked samples and the roots each hold a sequence */
    cc.max_sequences = B * (c->parallel_samples > 1 ? c->parallel_samples : 1) +
                       (c->shared_prefix_len > 0 ? c->prefix_groups : 0);
    cc.max_append_tokens = c->token_budget;
    SIM_TRY(s, kva_cache_create(s->ctx, &cc, &s->cache), "kva_cache_create (%d pages x %d layers)",
            s->num_pages, c->num_layers);
    /* A server's pool: made resident before the first step, so no append waits for the first
     * touch of its pages (and a soak's resident set is not the pool filling up). */
    SIM_TRY(s, kva_cache_prefault(s->cache), "kva_cache_prefault");

    if (!(s->reqs = xcalloc(s, (size_t)c->num_requests, sizeof *s->reqs)) ||
        !(s->items = xcalloc(s, (size_t)B, sizeof *s->items)) ||
        !(s->order = xcalloc(s, (size_t)B, sizeof(int32_t))) ||
        !(s->seq_ids = xcalloc(s, (size_t)B, sizeof(int32_t))) ||
        !(s->num_new = xcalloc(s, (size_t)B, sizeof(int32_t))) ||
        !(s->qo_indptr = xcalloc(s, (size_t)B + 1, sizeof(int32_t))) ||
        !(s->dec_indptr = xcalloc(s, (size_t)B + 1, sizeof(int32_t))) ||
        !(s->dec_indices = xcalloc(s, (size_t)s->max_entries, sizeof(int32_t))) ||
        !(s->dec_last = xcalloc(s, (size_t)B, sizeof(int32_t))) ||
        !(s->pre_indptr = xcalloc(s, (size_t)B + 1, sizeof(int32_t))) ||
        !(s->pre_indices = xcalloc(s, (size_t)s->max_entries, sizeof(int32_t))) ||
        !(s->pre_last = xcalloc(s, (size_t)B, sizeof(int32_t))) ||
        !(s->roots = xcalloc(s, (size_t)(c->prefix_groups > 0 ? c->prefix_groups : 1), sizeof(int32_t))) ||
        !(s->page_sum = xcalloc(s, (size_t)s->num_pages, sizeof(uint64_t))) ||
        !(s->page_guarded = xcalloc(s, (size_t)s->num_pages, sizeof(bool))) ||
        !(s->fork_pages = xcalloc(s, (size_t)s->num_pages, sizeof(int32_t))))
        return KVA_ERR_OUT_OF_MEMORY;
    make_requests(s);

    /* Every plan of the run stays within these: the whole pool is the most any batch holds. */
    kva_plan_limits l = {0};
    l.max_batch = B;
    l.max_total_pages = s->max_entries;
    l.max_total_kv = (int64_t)s->max_entries * c->page_size;
    l.max_total_qo = c->token_budget;
    l.num_qo_heads = Hq;
    l.num_kv_heads = Hk;
    l.head_dim = D;
    l.page_size = c->page_size;
    s->dec_limits = s->pre_limits = l;
    size_t dev_bytes, host_bytes;
    SIM_TRY(s, kva_decode_workspace_size(s->ctx, &s->dec_limits, &dev_bytes, &host_bytes),
            "kva_decode_workspace_size");
    kva_status st = workspace_alloc(s, &s->dec_ws, dev_bytes, host_bytes);
    if (st != KVA_OK) return st;
    SIM_TRY(s, kva_prefill_workspace_size(s->ctx, &s->pre_limits, &dev_bytes, &host_bytes),
            "kva_prefill_workspace_size");
    if ((st = workspace_alloc(s, &s->pre_ws, dev_bytes, host_bytes)) != KVA_OK) return st;

    size_t budget_rows = (size_t)c->token_budget;
    if ((st = staging_alloc(s, &s->k_rows, budget_rows * Hk * D * s->es)) != KVA_OK ||
        (st = staging_alloc(s, &s->v_rows, budget_rows * Hk * D * s->es)) != KVA_OK ||
        (st = staging_alloc(s, &s->q_dec, (size_t)B * Hq * D * s->es)) != KVA_OK ||
        (st = staging_alloc(s, &s->o_dec, (size_t)B * Hq * D * s->es)) != KVA_OK ||
        (st = staging_alloc(s, &s->q_pre, budget_rows * Hq * D * s->es)) != KVA_OK ||
        (st = staging_alloc(s, &s->o_pre, budget_rows * Hq * D * s->es)) != KVA_OK)
        return st;
    int32_t heads = Hq > Hk ? Hq : Hk;
    if (!(s->row = xcalloc(s, (size_t)heads * D, sizeof(float))))
        return KVA_ERR_OUT_OF_MEMORY;

    /* Verification scratch, sized for the longest sequence. */
    kva_kv_pages pages;
    SIM_TRY(s, kva_cache_layer_pages(s->cache, 0, &pages), "kva_cache_layer_pages");
    s->page_extent = (int64_t)(pages.page_size - 1) * pages.stride_token +
                     (int64_t)(pages.num_kv_heads - 1) * pages.stride_head + pages.head_dim;
    s->page_extent = (s->page_extent + 7) / 8 * 8;
    int32_t max_pages_seq = ceil_div(s->max_len, c->page_size);
    size_t max_kv = (size_t)s->max_len * Hk * D;
    if (!(s->mirror_k = xcalloc(s, (size_t)max_pages_seq * s->page_extent, s->es)) ||
        !(s->mirror_v = xcalloc(s, (size_t)max_pages_seq * s->page_extent, s->es)) ||
        !(s->ref_k = xcalloc(s, max_kv, sizeof(double))) ||
        !(s->ref_v = xcalloc(s, max_kv, sizeof(double))) ||
        !(s->ref_q = xcalloc(s, (size_t)Hq * D, sizeof(double))) ||
        !(s->ref_o = xcalloc(s, (size_t)Hq * D, sizeof(double))) ||
        !(s->expect = xcalloc(s, (size_t)heads * D, sizeof(float))) ||
        !(s->got = xcalloc(s, (size_t)Hq * D, sizeof(float))) ||
        !(s->mirror_ids = xcalloc(s, (size_t)max_pages_seq, sizeof(int32_t))) ||
        !(s->page_buf = xcalloc(s, (size_t)s->page_extent, s->es)))
        return KVA_ERR_OUT_OF_MEMORY;
    for (int32_t i = 0; i < max_pages_seq; ++i) s->mirror_ids[i] = i;
    synth_rng_seed(&s->verify_rng, c->seed ^ 0x5eed5eed5eedull);
    return KVA_OK;
}

static void teardown(sim *s) {
    staging *bufs[] = {&s->k_rows, &s->v_rows, &s->q_dec, &s->o_dec, &s->q_pre, &s->o_pre};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i)
        if (bufs[i]->host) staging_free(s, bufs[i]);
    kva_free(s->ctx, s->dec_ws.device);
    kva_host_free(s->ctx, s->dec_ws.host);
    kva_free(s->ctx, s->pre_ws.device);
    kva_host_free(s->ctx, s->pre_ws.host);
    kva_cache_destroy(s->cache);
    void *host[] = {s->reqs, s->items, s->order, s->seq_ids, s->num_new, s->qo_indptr,
                    s->dec_indptr, s->dec_indices, s->dec_last, s->pre_indptr, s->pre_indices,
                    s->pre_last, s->row, s->mirror_k, s->mirror_v, s->ref_k, s->ref_v,
                    s->ref_q, s->ref_o, s->expect, s->got, s->mirror_ids, s->roots,
                    s->page_sum, s->page_guarded, s->page_buf, s->fork_pages};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; ++i) free(host[i]);
}

/* ------------------------------------------------------------------------------------------ */
/* Prefix sharing: forks, roots and the shared-page guard                                       */
/* ------------------------------------------------------------------------------------------ */

static kva_status gen_row(sim *s, synth_tensor t, int32_t req, int32_t pos, int32_t layer,
                          int32_t heads, void *buf, int64_t row);

/* FNV-1a of page p's K and V spans in every layer (device -> host copies). */
static kva_status page_checksum(sim *s, int32_t p, uint64_t *sum) {
    uint64_t h = 1469598103934665603ull;
    const size_t span = (size_t)s->page_extent * s->es;
    for (int32_t layer = 0; layer < s->cfg->num_layers; ++layer) {
        kva_kv_pages pages;
        SIM_TRY(s, kva_cache_layer_pages(s->cache, layer, &pages), "kva_cache_layer_pages");
        const size_t off = (size_t)p * (size_t)pages.stride_page * s->es;
        const void *src[2] = {(const char *)pages.k_data + off, (const char *)pages.v_data + off};
        for (int kv = 0; kv < 2; ++kv) {
            SIM_TRY(s, kva_memcpy(s->ctx, s->page_buf, src[kv], span, KVA_COPY_DEVICE_TO_HOST),
                    "reading a shared page");
            for (size_t i = 0; i < span; ++i) h = (h ^ s->page_buf[i]) * 1099511628211ull;
        }
    }
    *sum = h;
    return KVA_OK;
}

/* After a fork: checksum every page the new sequence shares, so later checks can prove that
 * nothing wrote into it while it stayed shared. */
static kva_status guard_shared_pages(sim *s, int32_t seq) {
    int32_t indptr[2], last;
    SIM_TRY(s, kva_cache_page_table(s->cache, 1, &seq, indptr, s->fork_pages, s->num_pages, &last,
                                    NULL), "kva_cache_page_table (fork)");
    for (int32_t i = 0; i < indptr[1]; ++i) {
        int32_t p = s->fork_pages[i], rc;
        SIM_TRY(s, kva_cache_page_refcount(s->cache, p, &rc), "kva_cache_page_refcount");
        if (rc < 2) continue;
        kva_status st = page_checksum(s, p, &s->page_sum[p]);
        if (st != KVA_OK) return st;
        s->page_guarded[p] = true;
    }
    return KVA_OK;
}

/* Every guarded page still shared must hold what it held when it became shared. */
static kva_status check_shared_pages(sim *s) {
    for (int32_t p = 0; p < s->num_pages; ++p) {
        if (!s->page_guarded[p]) continue;
        int32_t rc;
        SIM_TRY(s, kva_cache_page_refcount(s->cache, p, &rc), "kva_cache_page_refcount");
        if (rc < 2) { /* one owner again: it may write from now on */
            s->page_guarded[p] = false;
            continue;
        }
        uint64_t sum;
        kva_status st = page_checksum(s, p, &sum);
        if (st != KVA_OK) return st;
        ++s->res->shared_page_checks;
        if (sum != s->page_sum[p]) {
            ++s->res->shared_page_writes;
            s->page_sum[p] = sum; /* count each write once */
        }
    }
    return KVA_OK;
}

/* Request req now holds sequence seq, just forked with `len` tokens of its content: account
 * them as obtained, not prefilled, and guard the pages it shares. */
static kva_status forked(sim *s, int32_t req, int32_t len, int32_t seq) {
    ++s->res->forks;
    request *r = &s->reqs[req];
    s->res->shared_tokens += len;
    /* tokens it had cached before (a preempted life) count as recomputed, like a re-prefill */
    s->res->recomputed_tokens += r->high_water < len ? r->high_water : len;
    r->cached = len;
    if (len > r->high_water) r->high_water = len;
    return guard_shared_pages(s, seq);
}

/* Prefills each system prompt once: a root sequence per group whose K/V every request of the
 * group shares by fork. Appended in chunks of the token budget, every layer. */
static kva_status make_roots(sim *s) {
    const sim_config *c = s->cfg;
    const int32_t Hk = c->num_kv_heads, D = c->head_dim;
    for (int32_t g = 0; c->shared_prefix_len > 0 && g < c->prefix_groups; ++g) {
        SIM_TRY(s, kva_cache_add_sequence(s->cache, &s->roots[g]), "kva_cache_add_sequence (root)");
        for (int32_t at = 0; at < c->shared_prefix_len; at += c->token_budget) {
            int32_t n = c->shared_prefix_len - at < c->token_budget ? c->shared_prefix_len - at
                                                                     : c->token_budget;
            SIM_TRY(s, kva_cache_reserve(s->cache, 1, &s->roots[g], &n), "kva_cache_reserve (root)");
            for (int32_t layer = 0; layer < c->num_layers; ++layer) {
                kva_status st;
                for (int32_t i = 0; i < n; ++i)
                    if ((st = gen_row(s, SYNTH_K, c->num_requests + g, at + i, layer, Hk,
                                      s->k_rows.host, i)) != KVA_OK ||
                        (st = gen_row(s, SYNTH_V, c->num_requests + g, at + i, layer, Hk,
                                      s->v_rows.host, i)) != KVA_OK)
                        return st;
                size_t bytes = (size_t)n * Hk * D * s->es;
                if ((st = upload(s, &s->k_rows, bytes)) != KVA_OK ||
                    (st = upload(s, &s->v_rows, bytes)) != KVA_OK)
                    return st;
                SIM_TRY(s, kva_cache_append(s->cache, layer, 1, &s->roots[g], &n,
                                            kva_tensor_nhd(s->k_rows.dev, c->dtype, Hk, D),
                                            kva_tensor_nhd(s->v_rows.dev, c->dtype, Hk, D)),
                        "kva_cache_append (root %d)", g);
            }
        }
        s->res->root_tokens += c->shared_prefix_len;
    }
    return KVA_OK;
}

static kva_status free_roots(sim *s) {
    for (int32_t g = 0; s->cfg->shared_prefix_len > 0 && g < s->cfg->prefix_groups; ++g)
        SIM_TRY(s, kva_cache_free_sequence(s->cache, s->roots[g]), "kva_cache_free_sequence (root)");
    return KVA_OK;
}

/* True while req leads a family whose other members still wait for its prompt. */
static bool has_blocked_samples(const sim *s, int32_t req) {
    const int32_t n = s->cfg->parallel_samples;
    if (n <= 1 || s->reqs[req].leader != req) return false;
    for (int32_t j = req + 1; j < req + n && j < s->cfg->num_requests; ++j)
        if (s->reqs[j].state == REQ_BLOCKED) return true;
    return false;
}

/* The leader has exactly its prompt cached: fork the waiting samples from it (parked until a
 * batch slot frees). If it went past its prompt (a recompute chunk crossed it), the samples
 * prefill the shared prompt themselves. */
static kva_status release_samples(sim *s, int32_t leader) {
    const request *l = &s->reqs[leader];
    for (int32_t j = leader + 1; j < leader + s->cfg->parallel_samples && j < s->cfg->num_requests; ++j) {
        request *r = &s->reqs[j];
        if (r->state != REQ_BLOCKED) continue;
        r->state = REQ_WAITING;
        if (l->state != REQ_RUNNING || l->cached != l->prompt_len) continue;
        kva_status st = kva_cache_fork(s->cache, l->seq, &r->seq);
        if (st == KVA_ERR_NO_SPACE) { /* no sequence slot: it prefills the prompt later */
            r->seq = -1;
            continue;
        }
        SIM_TRY(s, st, "kva_cache_fork (sample %d)", j);
        if ((st = forked(s, j, l->prompt_len, r->seq)) != KVA_OK) return st;
        r->state = REQ_PARKED;
        if (r->output_len == 0) { /* nothing to decode: the prompt was all it asked for */
            SIM_TRY(s, kva_cache_free_sequence(s->cache, r->seq), "kva_cache_free_sequence");
            r->seq = -1;
            r->state = REQ_FINISHED;
            ++s->finished;
            ++s->res->requests_finished;
        }
    }
    return KVA_OK;
}

/* Frees a parked sample's sequence (its pages are mostly shared); it prefills later instead. */
static kva_status unpark_one(sim *s, bool *freed) {
    *freed = false;
    for (int32_t i = s->cfg->num_requests - 1; i >= 0; --i) {
        request *r = &s->reqs[i];
        if (r->state != REQ_PARKED) continue;
        SIM_TRY(s, kva_cache_free_sequence(s->cache, r->seq), "kva_cache_free_sequence (unpark)");
        r->seq = -1;
        r->cached = 0;
        r->state = REQ_WAITING;
        *freed = true;
        return KVA_OK;
    }
    return KVA_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Scheduler                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static bool in_decode_phase(const request *r) { return r->cached >= r->prefill_target; }

static void remove_item_of(sim *s, int32_t req) {
    for (int32_t i = 0; i < s->num_items; ++i) {
        if (s->items[i].req != req) continue;
        s->budget += s->items[i].num_new;
        if (s->items[i].decode) --s->num_decode;
        memmove(&s->items[i], &s->items[i + 1], sizeof(step_item) * (size_t)(s->num_items - i - 1));
        --s->num_items;
        return;
    }
}

/* Frees the request's pages and sends it back to the queue; its next prefill recomputes every
 * token it had (the K/V it rewrites are bit-identical: synthetic values depend on position). */
static kva_status preempt(sim *s, int32_t req) {
    request *r = &s->reqs[req];
    SIM_TRY(s, kva_cache_free_sequence(s->cache, r->seq), "kva_cache_free_sequence (preempt)");
    remove_item_of(s, req);
    /* Never lower the target: a request preempted again while re-prefilling must still
     * recompute up to everything it had ever cached, or it would decode positions twice. */
    if (r->cached > r->prefill_target) r->prefill_target = r->cached;
    r->cached = 0;
    r->seq = -1;
    r->state = REQ_WAITING;
    --s->running;
    ++s->res->preemptions;
    s->preempted_this_step = true;
    return KVA_OK;
}

static int32_t youngest_running(const sim *s) {
    int32_t best = -1;
    for (int32_t i = 0; i < s->cfg->num_requests; ++i)
        if (s->reqs[i].state == REQ_RUNNING &&
            (best < 0 || s->reqs[i].admitted_at > s->reqs[best].admitted_at))
            best = i;
    return best;
}

static void push_item(sim *s, int32_t req, int32_t n, bool decode) {
    const request *r = &s->reqs[req];
    step_item *it = &s->items[s->num_items++];
    it->req = req;
    it->seq = r->seq;
    it->start = r->cached;
    it->num_new = n;
    it->decode = decode;
    if (decode) ++s->num_decode;
    s->budget -= n;
}

/* Reserves n slots for a running request, preempting the youngest running requests until they
 * fit (possibly the request itself, which then sits this step out). */
static kva_status reserve_running(sim *s, int32_t req, int32_t n, bool decode) {
    for (;;) {
        request *r = &s->reqs[req];
        kva_status st = kva_cache_reserve(s->cache, 1, &r->seq, &n);
        if (st == KVA_OK) {
            push_item(s, req, n, decode);
            return KVA_OK;
        }
        if (st != KVA_ERR_NO_SPACE)
            SIM_TRY(s, st, "kva_cache_reserve (request %d, %d tokens)", req, n);
        bool freed; /* parked samples give their pages back before anyone running is preempted */
        if ((st = unpark_one(s, &freed)) != KVA_OK) return st;
        if (freed) continue;
        int32_t victim = youngest_running(s);
        kva_status pst = preempt(s, victim);
        if (pst != KVA_OK) return pst;
        if (victim == req) return KVA_OK;
    }
}

/* Admits one waiting request with a first chunk, if the pool can take it and still leave every
 * running request room for one more page (so admission does not force a preemption next step).
 * *admitted says whether it did; the scheduler stops admitting at the first refusal. */
static kva_status try_admit(sim *s, int32_t req, bool *admitted) {
    request *r = &s->reqs[req];
    *admitted = false;
    int32_t seq, base = 0;
    const int32_t S = s->cfg->shared_prefix_len;
    kva_status st;
    if (r->group >= 0 && r->prefill_target > S) { /* starts from its system prompt's root */
        st = kva_cache_fork(s->cache, s->roots[r->group], &seq);
        base = S;
    } else {
        st = kva_cache_add_sequence(s->cache, &seq);
    }
    if (st == KVA_ERR_NO_SPACE) return KVA_OK; /* no sequence slot now */
    SIM_TRY(s, st, "kva_cache_add_sequence / kva_cache_fork (admitting request %d)", req);
    int32_t n = r->prefill_target - base < s->budget ? r->prefill_target - base : s->budget;
    if (has_blocked_samples(s, req) && n > r->prompt_len - base) n = r->prompt_len - base;
    st = kva_cache_reserve(s->cache, 1, &seq, &n);
    kva_cache_stats stats;
    if (st == KVA_OK) {
        SIM_TRY(s, kva_cache_get_stats(s->cache, &stats), "kva_cache_get_stats");
        if (s->running == 0 || stats.free_pages >= s->running + 1) {
            if (base > 0 && (st = forked(s, req, base, seq)) != KVA_OK) return st;
            r->seq = seq;
            r->state = REQ_RUNNING;
            r->admitted_at = ++s->admit_clock;
            ++s->running;
            push_item(s, req, n, false);
            *admitted = true;
            return KVA_OK;
        }
    } else if (st != KVA_ERR_NO_SPACE) {
        SIM_TRY(s, st, "kva_cache_reserve (admitting request %d)", req);
    }
    SIM_TRY(s, kva_cache_free_sequence(s->cache, seq), "kva_cache_free_sequence (admission undo)");
    return KVA_OK;
}

/* Running requests, oldest first. */
static int32_t running_by_age(sim *s) {
    int32_t n = 0;
    for (int32_t i = 0; i < s->cfg->num_requests; ++i)
        if (s->reqs[i].state == REQ_RUNNING) {
            int32_t j = n++;
            while (j > 0 && s->reqs[s->order[j - 1]].admitted_at > s->reqs[i].admitted_at) {
                s->order[j] = s->order[j - 1];
                --j;
            }
            s->order[j] = i;
        }
    return n;
}

static kva_status schedule(sim *s) {
    s->num_items = s->num_decode = 0;
    s->budget = s->cfg->token_budget;
    s->preempted_this_step = false;
    kva_status st;
    /* Parked samples join first while there is room: their prompt is cached, they decode now. */
    for (int32_t i = 0; i < s->cfg->num_requests && s->running < s->cfg->max_batch; ++i) {
        request *r = &s->reqs[i];
        if (r->state != REQ_PARKED) continue;
        r->state = REQ_RUNNING;
        r->admitted_at = ++s->admit_clock;
        ++s->running;
    }
    int32_t n = running_by_age(s);
    /* Decodes first: they are latency-critical and cost one token each. */
    for (int32_t i = 0; i < n && s->budget > 0; ++i) {
        const request *r = &s->reqs[s->order[i]];
        if (r->state == REQ_RUNNING && in_decode_phase(r))
            if ((st = reserve_running(s, s->order[i], 1, true)) != KVA_OK) return st;
    }
    /* Then the prefill chunks of requests already running. */
    for (int32_t i = 0; i < n && s->budget > 0; ++i) {
        const request *r = &s->reqs[s->order[i]];
        if (r->state != REQ_RUNNING || in_decode_phase(r)) continue;
        int32_t chunk = r->prefill_target - r->cached;
        if (chunk > s->budget) chunk = s->budget;
        /* a family's prompt ends on a chunk boundary, so its samples can fork right there */
        if (has_blocked_samples(s, s->order[i]) && r->cached < r->prompt_len &&
            chunk > r->prompt_len - r->cached)
            chunk = r->prompt_len - r->cached;
        if ((st = reserve_running(s, s->order[i], chunk, false)) != KVA_OK) return st;
    }
    /* Then new (or preempted, which have lower ids) requests, in arrival order. */
    if (s->preempted_this_step) return KVA_OK;
    for (int32_t i = 0; i < s->cfg->num_requests; ++i) {
        if (s->budget <= 0 || s->running >= s->cfg->max_batch) break;
        if (s->reqs[i].state != REQ_WAITING) continue;
        bool admitted;
        if ((st = try_admit(s, i, &admitted)) != KVA_OK) return st;
        if (!admitted) break;
    }
    return KVA_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Synthetic rows                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* Whose synthetic values position pos of request req holds: its system prompt's (a pseudo
 * request after the real ones), its family's shared prompt (the leader's), or its own. Shared
 * positions must hold identical K/V in every sequence that shares them. */
static int32_t content_of(const sim *s, int32_t req, int32_t pos) {
    if (req >= s->cfg->num_requests) return req; /* a root */
    const request *r = &s->reqs[req];
    if (r->group >= 0 && pos < s->cfg->shared_prefix_len) return s->cfg->num_requests + r->group;
    if (pos < r->prompt_len) return r->leader;
    return req;
}

/* Writes token `pos` of request `req` (tensor t, layer) as row `row` of a dtype buffer. */
static kva_status gen_row(sim *s, synth_tensor t, int32_t req, int32_t pos, int32_t layer,
                          int32_t heads, void *buf, int64_t row) {
    const int32_t D = s->cfg->head_dim;
    synth_token(s->cfg->seed, t, content_of(s, req, pos), pos, layer, heads, D, s->row);
    unsigned char *dst = (unsigned char *)buf + (size_t)row * heads * D * s->es;
    SIM_TRY(s, kva_convert(s->row, KVA_F32, dst, s->cfg->dtype, (size_t)heads * D), "kva_convert");
    return KVA_OK;
}

/* The value a kernel saw for a synthetic row: generated, then rounded to the dtype. */
static kva_status expected_row(sim *s, synth_tensor t, int32_t req, int32_t pos, int32_t layer,
                               int32_t heads) {
    const size_t n = (size_t)heads * s->cfg->head_dim;
    synth_token(s->cfg->seed, t, content_of(s, req, pos), pos, layer, heads, s->cfg->head_dim,
                s->row);
    /* f32 -> dtype -> f32: a dtype row is never larger than the f32 one, so `expect` can hold
     * the narrow copy before it receives the rounded floats. */
    SIM_TRY(s, kva_convert(s->row, KVA_F32, s->expect, s->cfg->dtype, n), "kva_convert");
    SIM_TRY(s, kva_convert(s->expect, s->cfg->dtype, s->row, KVA_F32, n), "kva_convert");
    memcpy(s->expect, s->row, n * sizeof(float));
    return KVA_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Verification                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Copies the pages of request b of `table` from the layer's pool into the host mirror and reads
 * them as doubles into ref_k / ref_v; then checks them against the regenerated K/V. Returns the
 * sequence length in *len. */
static kva_status read_back_kv(sim *s, const kva_page_table *table, int32_t b, int32_t req,
                               int32_t layer, int32_t *len) {
    kva_kv_pages pages;
    SIM_TRY(s, kva_cache_layer_pages(s->cache, layer, &pages), "kva_cache_layer_pages");
    const int32_t first = table->indptr[b], np = table->indptr[b + 1] - first;
    const size_t span = (size_t)s->page_extent * s->es;
    const size_t page_bytes = (size_t)pages.stride_page * s->es;
    for (int32_t i = 0; i < np; ++i) {
        size_t src = (size_t)table->indices[first + i] * page_bytes;
        size_t dst = (size_t)i * span;
        size_t bytes = (size_t)((pages.page_size - 1) * pages.stride_token +
                                (pages.num_kv_heads - 1) * pages.stride_head + pages.head_dim) *
                       s->es;
        SIM_TRY(s, kva_memcpy(s->ctx, (char *)s->mirror_k + dst, (const char *)pages.k_data + src,
                              bytes, KVA_COPY_DEVICE_TO_HOST), "reading K pages back");
        SIM_TRY(s, kva_memcpy(s->ctx, (char *)s->mirror_v + dst, (const char *)pages.v_data + src,
                              bytes, KVA_COPY_DEVICE_TO_HOST), "reading V pages back");
    }
    /* The mirror: the same in-page strides, pages renumbered 0 .. np-1. */
    kva_kv_pages mirror = pages;
    mirror.k_data = s->mirror_k;
    mirror.v_data = s->mirror_v;
    mirror.num_pages = np;
    mirror.stride_page = s->page_extent;
    int32_t indptr[2] = {0, np};
    kva_page_table one = {1, indptr, s->mirror_ids, &table->last_page_len[b]};
    *len = kva_ref_read_paged(&mirror, &one, 0, s->ref_k, s->ref_v);

    /* Every K and V value must be exactly what was appended at that position. */
    const int32_t Hk = s->cfg->num_kv_heads, D = s->cfg->head_dim;
    const size_t row = (size_t)Hk * D;
    for (int32_t pos = 0; pos < *len; ++pos)
        for (int t = SYNTH_K; t <= SYNTH_V; ++t) {
            kva_status st = expected_row(s, (synth_tensor)t, req, pos, layer, Hk);
            if (st != KVA_OK) return st;
            const double *got = (t == SYNTH_K ? s->ref_k : s->ref_v) + (size_t)pos * row;
            for (size_t i = 0; i < row; ++i)
                if (got[i] != (double)s->expect[i]) ++s->res->cache_mismatches;
        }
    return KVA_OK;
}

/* Compares output row `orow` (Hq x D, dtype, host) of request req's query at position pos with
 * the reference over the first pos+1 keys in ref_k / ref_v. */
static kva_status check_row(sim *s, const void *orow, int32_t req, int32_t pos, int32_t layer) {
    const int32_t Hq = s->cfg->num_qo_heads, D = s->cfg->head_dim;
    const size_t n = (size_t)Hq * D;
    kva_status st = expected_row(s, SYNTH_Q, req, pos, layer, Hq);
    if (st != KVA_OK) return st;
    for (size_t i = 0; i < n; ++i) s->ref_q[i] = s->expect[i];
    kva_ref_attention(&s->params, 1, pos + 1, s->ref_q, s->ref_k, s->ref_v, s->ref_o, NULL);
    SIM_TRY(s, kva_convert(orow, s->cfg->dtype, s->got, KVA_F32, n), "kva_convert");
    const verify_tol tol = verify_tol_for(s->cfg->dtype);
    bool bad = false;
    for (size_t i = 0; i < n; ++i)
        bad |= !verify_value(s->got[i], s->ref_o[i], tol, &s->res->max_abs_err);
    ++s->res->verified_rows;
    if (bad) ++s->res->verify_failures;
    return KVA_OK;
}

/* Picks up to k distinct indices of [lo, hi) into out (k small). */
static int32_t sample(sim *s, int32_t lo, int32_t hi, int32_t k, int32_t *out) {
    int32_t n = 0, range = hi - lo;
    if (range <= 0) return 0;
    if (k >= range) {
        for (int32_t i = lo; i < hi; ++i) out[n++] = i;
        return n;
    }
    while (n < k) {
        int32_t v = synth_rng_int(&s->verify_rng, lo, hi - 1);
        bool dup = false;
        for (int32_t j = 0; j < n; ++j) dup |= out[j] == v;
        if (!dup) out[n++] = v;
    }
    return n;
}

static kva_status verify_layer(sim *s, int32_t layer, bool prefill_ran) {
    const int32_t Hq = s->cfg->num_qo_heads, D = s->cfg->head_dim;
    const size_t row_bytes = (size_t)Hq * D * s->es;
    int32_t picks[64];
    int32_t k = s->cfg->verify_requests < 64 ? s->cfg->verify_requests : 64;
    kva_status st;
    if (s->num_decode > 0) {
        if ((st = download(s, &s->o_dec, (size_t)s->num_decode * row_bytes)) != KVA_OK) return st;
        int32_t n = sample(s, 0, s->num_decode, k, picks);
        for (int32_t i = 0; i < n; ++i) {
            const step_item *it = &s->items[picks[i]];
            int32_t len;
            if ((st = read_back_kv(s, &s->dec_table, picks[i], it->req, layer, &len)) != KVA_OK)
                return st;
            if (len != it->start + 1)
                return sim_fail(s, KVA_ERR_BAD_STATE, "request %d: cache holds %d tokens, expected %d",
                                it->req, len, it->start + 1);
            const char *orow = (const char *)s->o_dec.host + (size_t)picks[i] * row_bytes;
            if ((st = check_row(s, orow, it->req, it->start, layer)) != KVA_OK) return st;
        }
    }
    int32_t num_prefill = s->num_items - s->num_decode;
    if (num_prefill > 0 && prefill_ran) {
        if ((st = download(s, &s->o_pre, (size_t)s->qo_indptr[num_prefill] * row_bytes)) != KVA_OK)
            return st;
        int32_t n = sample(s, 0, num_prefill, k, picks);
        for (int32_t i = 0; i < n; ++i) {
            const step_item *it = &s->items[s->num_decode + picks[i]];
            int32_t len;
            if ((st = read_back_kv(s, &s->pre_table, picks[i], it->req, layer, &len)) != KVA_OK)
                return st;
            if (len != it->start + it->num_new)
                return sim_fail(s, KVA_ERR_BAD_STATE, "request %d: cache holds %d tokens, expected %d",
                                it->req, len, it->start + it->num_new);
            /* The chunk's first and last query rows, and one in between. */
            int32_t rows[3] = {0, it->num_new - 1, 0};
            int32_t nrows = it->num_new > 1 ? 2 : 1;
            if (it->num_new > 2)
                rows[nrows++] = synth_rng_int(&s->verify_rng, 1, it->num_new - 2);
            for (int32_t r = 0; r < nrows; ++r) {
                const char *orow = (const char *)s->o_pre.host +
                                   (size_t)(s->qo_indptr[picks[i]] + rows[r]) * row_bytes;
                if ((st = check_row(s, orow, it->req, it->start + rows[r], layer)) != KVA_OK)
                    return st;
            }
        }
    }
    return KVA_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* One step's compute                                                                          */
/* ------------------------------------------------------------------------------------------ */

static kva_status plan_step(sim *s) {
    const int32_t nd = s->num_decode, np = s->num_items - nd;
    for (int32_t i = 0; i < s->num_items; ++i) {
        s->seq_ids[i] = s->items[i].seq;
        s->num_new[i] = s->items[i].num_new;
    }
    double t0 = now_seconds();
    if (nd > 0) {
        SIM_TRY(s, kva_cache_page_table(s->cache, nd, s->seq_ids, s->dec_indptr, s->dec_indices,
                                        s->max_entries, s->dec_last, &s->dec_table),
                "kva_cache_page_table (decode)");
        kva_plan_options opt = {0, 0, s->cfg->decode_algo};
        SIM_TRY(s, kva_decode_plan(s->ctx, &s->dec_limits, &s->dec_table, s->num_pages, &opt,
                                   s->dec_ws, &s->dec_plan),
                "kva_decode_plan (batch %d)", nd);
    }
    if (np > 0) {
        SIM_TRY(s, kva_cache_page_table(s->cache, np, s->seq_ids + nd, s->pre_indptr,
                                        s->pre_indices, s->max_entries, s->pre_last, &s->pre_table),
                "kva_cache_page_table (prefill)");
        s->qo_indptr[0] = 0;
        for (int32_t i = 0; i < np; ++i) s->qo_indptr[i + 1] = s->qo_indptr[i] + s->num_new[nd + i];
        SIM_TRY(s, kva_prefill_plan(s->ctx, &s->pre_limits, np, s->qo_indptr, NULL, &s->pre_table,
                                    s->num_pages, NULL, s->pre_ws, &s->pre_plan),
                "kva_prefill_plan (batch %d, %d tokens)", np, s->qo_indptr[np]);
    }
    s->res->plan_seconds += now_seconds() - t0;
    return KVA_OK;
}

static kva_status append_layer(sim *s, int32_t layer) {
    const int32_t Hk = s->cfg->num_kv_heads, D = s->cfg->head_dim;
    int64_t row = 0;
    kva_status st;
    for (int32_t i = 0; i < s->num_items; ++i) {
        const step_item *it = &s->items[i];
        for (int32_t p = it->start; p < it->start + it->num_new; ++p, ++row) {
            if ((st = gen_row(s, SYNTH_K, it->req, p, layer, Hk, s->k_rows.host, row)) != KVA_OK ||
                (st = gen_row(s, SYNTH_V, it->req, p, layer, Hk, s->v_rows.host, row)) != KVA_OK)
                return st;
        }
    }
    size_t bytes = (size_t)row * Hk * D * s->es;
    if ((st = upload(s, &s->k_rows, bytes)) != KVA_OK || (st = upload(s, &s->v_rows, bytes)) != KVA_OK)
        return st;
    double t0 = now_seconds();
    SIM_TRY(s, kva_cache_append(s->cache, layer, s->num_items, s->seq_ids, s->num_new,
                                kva_tensor_nhd(s->k_rows.dev, s->cfg->dtype, Hk, D),
                                kva_tensor_nhd(s->v_rows.dev, s->cfg->dtype, Hk, D)),
            "kva_cache_append (layer %d, %d sequences)", layer, s->num_items);
    SIM_TRY(s, kva_synchronize(s->ctx), "kva_synchronize");
    s->res->append_seconds += now_seconds() - t0;
    return KVA_OK;
}

static kva_status decode_layer(sim *s, int32_t layer, const kva_kv_pages *pages) {
    const int32_t Hq = s->cfg->num_qo_heads, Hk = s->cfg->num_kv_heads, D = s->cfg->head_dim;
    kva_status st;
    for (int32_t i = 0; i < s->num_decode; ++i)
        if ((st = gen_row(s, SYNTH_Q, s->items[i].req, s->items[i].start, layer, Hq, s->q_dec.host,
                          i)) != KVA_OK)
            return st;
    if ((st = upload(s, &s->q_dec, (size_t)s->num_decode * Hq * D * s->es)) != KVA_OK) return st;
    double t0 = now_seconds();
    SIM_TRY(s, kva_decode_run(s->ctx, &s->dec_plan, &s->params,
                              kva_tensor_nhd(s->q_dec.dev, s->cfg->dtype, Hq, D), pages,
                              kva_tensor_nhd(s->o_dec.dev, s->cfg->dtype, Hq, D), NULL),
            "kva_decode_run (layer %d, batch %d)", layer, s->num_decode);
    SIM_TRY(s, kva_synchronize(s->ctx), "kva_synchronize");
    s->res->decode_seconds += now_seconds() - t0;
    for (int32_t i = 0; i < s->num_decode; ++i)
        s->res->decode_bytes += 2.0 * (s->items[i].start + 1) * Hk * D * (double)s->es;
    return KVA_OK;
}

/* Returns KVA_OK with *ran = false when the device has no paged prefill (noted once). */
static kva_status prefill_layer(sim *s, int32_t layer, const kva_kv_pages *pages, bool *ran) {
    const int32_t Hq = s->cfg->num_qo_heads, D = s->cfg->head_dim;
    const int32_t nd = s->num_decode, np = s->num_items - nd;
    *ran = false;
    if (s->res->prefill_unsupported) return KVA_OK;
    kva_status st;
    for (int32_t i = 0; i < np; ++i) {
        const step_item *it = &s->items[nd + i];
        for (int32_t r = 0; r < it->num_new; ++r)
            if ((st = gen_row(s, SYNTH_Q, it->req, it->start + r, layer, Hq, s->q_pre.host,
                              s->qo_indptr[i] + r)) != KVA_OK)
                return st;
    }
    if ((st = upload(s, &s->q_pre, (size_t)s->qo_indptr[np] * Hq * D * s->es)) != KVA_OK) return st;
    double t0 = now_seconds();
    st = kva_prefill_run_paged(s->ctx, &s->pre_plan, &s->params,
                               kva_tensor_nhd(s->q_pre.dev, s->cfg->dtype, Hq, D), pages,
                               kva_tensor_nhd(s->o_pre.dev, s->cfg->dtype, Hq, D), NULL);
    if (st == KVA_ERR_UNSUPPORTED && kva_context_device(s->ctx) != KVA_DEVICE_CPU) {
        s->res->prefill_unsupported = 1;
        return KVA_OK;
    }
    SIM_TRY(s, st, "kva_prefill_run_paged (layer %d, batch %d, %d tokens)", layer, np,
            s->qo_indptr[np]);
    SIM_TRY(s, kva_synchronize(s->ctx), "kva_synchronize");
    s->res->prefill_seconds += now_seconds() - t0;
    for (int32_t i = 0; i < np; ++i) {
        const step_item *it = &s->items[nd + i];
        double c = it->num_new, L = it->start + it->num_new;
        double pairs = c * L - c * (c - 1) / 2; /* causal: query j sees L - c + j + 1 keys */
        s->res->prefill_flops += 4.0 * D * Hq * pairs;
    }
    *ran = true;
    return KVA_OK;
}

static kva_status run_step(sim *s, int32_t step) {
    kva_status st;
    if ((st = plan_step(s)) != KVA_OK) return st;
    const sim_config *c = s->cfg;
    /* Every sequence holds what its request thinks it holds (never more than the request). */
    for (int32_t i = 0; i < c->num_requests; ++i) {
        const request *r = &s->reqs[i];
        if (r->state != REQ_RUNNING && r->state != REQ_PARKED) continue;
        int32_t len = -1;
        SIM_TRY(s, kva_cache_seq_len(s->cache, r->seq, &len), "kva_cache_seq_len");
        int32_t want = r->cached;
        for (int32_t j = 0; j < s->num_items; ++j)
            if (s->items[j].req == i) want += s->items[j].num_new;
        if (len != want || want > r->prompt_len + r->output_len)
            return sim_fail(s, KVA_ERR_BAD_STATE,
                            "request %d (state %d, leader %d, group %d): sequence %d holds %d tokens, "
                            "expected %d (prompt %d + output %d)",
                            i, (int)r->state, r->leader, r->group, r->seq, len, want, r->prompt_len,
                            r->output_len);
    }

    bool verify = c->verify_every > 0 && step % c->verify_every == 0;
    int32_t check_layer = step / (c->verify_every > 0 ? c->verify_every : 1) % c->num_layers;
    for (int32_t layer = 0; layer < c->num_layers; ++layer) {
        kva_kv_pages pages;
        SIM_TRY(s, kva_cache_layer_pages(s->cache, layer, &pages), "kva_cache_layer_pages");
        if ((st = append_layer(s, layer)) != KVA_OK) return st;
        if (s->num_decode > 0 && (st = decode_layer(s, layer, &pages)) != KVA_OK) return st;
        bool prefill_ran = false;
        if (s->num_items > s->num_decode && (st = prefill_layer(s, layer, &pages, &prefill_ran)) != KVA_OK)
            return st;
        if (verify && layer == check_layer) {
            if ((st = verify_layer(s, layer, prefill_ran)) != KVA_OK) return st;
        }
    }
    if (verify) {
        ++s->res->verified_steps;
        if ((st = check_shared_pages(s)) != KVA_OK) return st;
    }

    /* Account the step and retire finished requests. */
    for (int32_t i = 0; i < s->num_items; ++i) {
        const step_item *it = &s->items[i];
        request *r = &s->reqs[it->req];
        if (it->decode) {
            s->res->decode_tokens += it->num_new;
        } else {
            s->res->prefill_tokens += it->num_new;
            int32_t redo = r->high_water - it->start;
            if (redo > it->num_new) redo = it->num_new;
            if (redo > 0) s->res->recomputed_tokens += redo;
        }
        r->cached += it->num_new;
        if (r->cached > r->high_water) r->high_water = r->cached;
        kva_status rst;
        if (has_blocked_samples(s, it->req) && r->cached >= r->prompt_len &&
            (rst = release_samples(s, it->req)) != KVA_OK)
            return rst;
        if (r->cached == r->prompt_len + r->output_len) {
            SIM_TRY(s, kva_cache_free_sequence(s->cache, r->seq), "kva_cache_free_sequence");
            r->seq = -1;
            r->state = REQ_FINISHED;
            --s->running;
            ++s->finished;
            ++s->res->requests_finished;
        }
    }
    return KVA_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The loop                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Soak: while time remains, a finished request (a whole finished family with parallel
 * samples) starts a new life with fresh lengths, so the run keeps its window of requests busy. */
static void recycle_finished(sim *s) {
    const sim_config *c = s->cfg;
    if (c->duration_seconds <= 0 || now_seconds() - s->start_time >= c->duration_seconds) return;
    const int32_t n = c->parallel_samples > 1 ? c->parallel_samples : 1;
    for (int32_t lead = 0; lead < c->num_requests; lead += n) {
        int32_t end = lead + n < c->num_requests ? lead + n : c->num_requests;
        bool done = true;
        for (int32_t j = lead; j < end; ++j) done = done && s->reqs[j].state == REQ_FINISHED;
        if (!done) continue;
        for (int32_t j = lead; j < end; ++j) {
            new_request(s, j);
            --s->finished;
        }
    }
}

static kva_status simulate(sim *s) {
    const sim_config *c = s->cfg;
    kva_status st;
    s->start_time = now_seconds();
    double last_report = s->start_time;
    if ((st = make_roots(s)) != KVA_OK) return st;
    /* Each step with unfinished requests schedules something: the oldest running request
     * always fits once younger ones are preempted (check_config made the pool hold the longest
     * request), and with nothing running the first waiting request is admitted. */
    for (int32_t step = 0; s->finished < c->num_requests; ++step) {
        if ((st = schedule(s)) != KVA_OK) return st;
        if (s->num_items == 0)
            return sim_fail(s, KVA_ERR_BAD_STATE, "step %d: scheduler found nothing to run "
                            "(%d running, %d finished)", step, s->running, s->finished);
        if (s->running > s->res->max_running) s->res->max_running = s->running;
        if ((st = run_step(s, step)) != KVA_OK) {
            /* Prefix the step number (truncating the tail of a very long message). */
            char msg[sizeof s->res->error];
            int head = snprintf(msg, sizeof msg, "step %d: ", step);
            snprintf(msg + head, sizeof msg - (size_t)head, "%.*s", (int)(sizeof msg) - head - 1,
                     s->res->error);
            memcpy(s->res->error, msg, sizeof msg);
            return st;
        }
        s->res->steps = step + 1;
        kva_cache_stats stats;
        SIM_TRY(s, kva_cache_get_stats(s->cache, &stats), "kva_cache_get_stats");
        if (stats.shared_pages > s->res->peak_shared_pages)
            s->res->peak_shared_pages = stats.shared_pages;
        s->res->cow_copies = stats.cow_copies;
        sim_progress p = {step + 1, s->finished, c->num_requests, s->running,
                          c->num_requests - s->finished - s->running, stats.used_pages,
                          stats.num_pages, s->res->preemptions, s->res->verify_failures};
        if (c->progress) c->progress(&p, c->progress_user);
        double now = now_seconds();
        if (c->soak_report && now - last_report >= c->soak_report_every) {
            last_report = now;
            c->soak_report(&p, c->progress_user);
        }
        recycle_finished(s);
    }
    if ((st = check_shared_pages(s)) != KVA_OK) return st;
    if ((st = free_roots(s)) != KVA_OK) return st;
    kva_cache_stats stats;
    SIM_TRY(s, kva_cache_get_stats(s->cache, &stats), "kva_cache_get_stats");
    s->res->peak_pages = stats.peak_used_pages;
    s->res->leaked_pages = stats.used_pages + stats.num_sequences;
    return KVA_OK;
}

kva_status sim_run(kva_context *ctx, const sim_config *cfg, sim_result *result) {
    memset(result, 0, sizeof *result);
    sim s;
    memset(&s, 0, sizeof s);
    s.ctx = ctx;
    s.cfg = cfg;
    s.res = result;
    double t0 = now_seconds();
    kva_status st = check_config(&s);
    if (st == KVA_OK) {
        result->num_pages = s.num_pages;
        st = setup(&s);
    }
    if (st == KVA_OK) st = simulate(&s);
    teardown(&s);
    result->wall_seconds = now_seconds() - t0;
    return st;
}
