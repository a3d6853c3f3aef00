/*
 * serve_sim.h -- a serving simulation over the paged KV cache: the core of `kvattn run`, kept
 * free of printing so tests can drive it with small sizes.
 *
 * N requests with seeded random prompt and output lengths arrive at once. Each step:
 *   1. schedule under a token budget: one decode token for every running request past its
 *      prefill (oldest first), then prefill chunks for running requests still prefilling, then
 *      admit waiting requests (up to max_batch running) with chunks of what budget is left;
 *   2. reserve every scheduled request's slots (kva_cache_reserve). When the pool is out of
 *      pages (KVA_ERR_NO_SPACE) the youngest running request is preempted: its sequence is freed
 *      and it goes back to the queue to recompute its prefill (prompt + tokens generated so
 *      far) later -- the vLLM "recompute" policy. A new admission that does not fit just waits;
 *   3. plan once: one kva_decode_plan for the decode batch and one kva_prefill_plan (paged, over
 *      each request's cached prefix + chunk) for the prefill batch, both reused by every layer;
 *   4. per layer: append the step's new K/V rows (kva_cache_append), run decode and prefill;
 *   5. finished requests free their sequence.
 *
 * Prefix sharing (optional): with shared_prefix_len > 0, every request's prompt starts with one of
 * prefix_groups system prompts. Each system prompt is prefilled once into a root sequence at
 * setup; a request is admitted by kva_cache_fork of its root and prefills only its own part.
 * With parallel_samples = n > 1, requests come in families of n that share their whole prompt:
 * the first prefills it, and the moment it has, the n - 1 others are forked from it and only
 * decode (parked until a batch slot frees). Preemption frees a forked sequence like any other;
 * it comes back by forking its root again (or, for a sample, by prefilling the shared prompt
 * itself). Pages shared between sequences are checksummed when they become shared and checked
 * at every verified step: no call may write into a shared page (copy-on-write must intervene).
 *
 * Q/K/V are synthetic (synth.h): a verifier regenerates them. Every verify_every-th step, one
 * layer of a sample of the step's requests is checked: K/V read back from the cache (device ->
 * host copies of the sequence's pages) must equal the regenerated rows bit for bit (no request
 * ever corrupts another's pages), and the outputs must match the float64 reference
 * (kva_ref_attention) within the dtype's tolerance.
 */
#ifndef KVA_TOOLS_SERVE_SIM_H
#define KVA_TOOLS_SERVE_SIM_H

#include "kvattn.h"

#include <stdint.h>

typedef struct sim_progress {
    int32_t step;
    int32_t finished, total_requests;
    int32_t running, waiting;
    int32_t used_pages, num_pages;
    int32_t preemptions;
    int64_t verify_failures;
} sim_progress;

typedef void (*sim_progress_fn)(const sim_progress *progress, void *user);

typedef struct sim_config {
    int32_t num_requests;
    uint64_t seed;
    int32_t num_layers;
    int32_t num_qo_heads, num_kv_heads, head_dim;
    kva_dtype dtype;
    kva_layout layout;         /* of pages inside the cache pool */
    int32_t page_size;
    int32_t num_pages;         /* pages per layer; 0 = 9/10 of max_batch average requests */
    int32_t token_budget;      /* tokens (decode + prefill chunks) processed per step */
    int32_t max_batch;         /* running requests at once */
    int32_t prompt_len[2];     /* inclusive range of prompt lengths */
    int32_t output_len[2];     /* inclusive range of decode steps per request */
    int32_t verify_every;      /* verify every Nth step (0 = never) */
    int32_t verify_requests;   /* requests sampled per verified step (decode and prefill each) */
    kva_decode_algo decode_algo;
    int32_t shared_prefix_len; /* system-prompt tokens shared by requests (0 = none) */
    int32_t prefix_groups;     /* distinct system prompts (>= 1 when shared_prefix_len > 0) */
    int32_t parallel_samples;  /* continuations forked from each prompt (1 = none) */
    double duration_seconds;   /* > 0: soak; keep serving new requests until this much time has
                                  passed (num_requests become a rolling window) */
    sim_progress_fn soak_report; /* optional, soak: called about every soak_report_every s */
    double soak_report_every;
    sim_progress_fn progress;  /* optional, called after every step */
    void *progress_user;
} sim_config;

typedef struct sim_result {
    int32_t requests_finished;
    int32_t steps;
    int64_t prompt_tokens;      /* summed prompt lengths of all requests */
    int64_t output_tokens;      /* summed output lengths (decode steps asked for) */
    int64_t prefill_tokens;     /* tokens through prefill attention, recomputation included */
    int64_t recomputed_tokens;  /* of which re-prefilled after preemption */
    int64_t decode_tokens;      /* prefill + decode = prompt + output + recomputed, exactly */
    int32_t preemptions;
    int32_t num_pages, peak_pages;
    int32_t max_running;
    /* Attention work and time, summed over all layers (plan and append time excluded). */
    double prefill_seconds, decode_seconds;
    double plan_seconds, append_seconds, wall_seconds;
    double prefill_flops;       /* 4 * D * qo heads * visible (query, key) pairs */
    double decode_bytes;        /* K + V bytes the decode kernels had to read */
    int prefill_unsupported;    /* the device could not run paged prefill (noted, not fatal) */
    /* Verification. */
    int32_t verified_steps;
    int64_t verified_rows;      /* (request, query token) rows compared */
    int64_t verify_failures;    /* rows whose output missed the tolerance */
    int64_t cache_mismatches;   /* K/V values read back that differ from what was appended */
    double max_abs_err;         /* over all verified outputs */
    int leaked_pages;           /* pages still in use after every request finished */
    /* Prefix sharing. */
    int32_t forks;              /* sequences made by kva_cache_fork */
    int64_t shared_tokens;      /* tokens a request got by fork instead of prefill */
    int64_t root_tokens;        /* system-prompt tokens prefilled once into the roots */
    int32_t peak_shared_pages;  /* most pages with refcount > 1 at the end of a step */
    int64_t cow_copies;         /* partial pages copied on write */
    int64_t shared_page_checks; /* shared pages re-checksummed at verified steps */
    int64_t shared_page_writes; /* of which changed while shared (must be 0) */
    char error[512];            /* why sim_run failed, or "" */
} sim_result;

/* The defaults of `kvattn run` (about a minute on two cores). */
void sim_config_default(sim_config *cfg);

/* Bytes of the cache pool sim_run will allocate for cfg (all layers), after auto-sizing. */
int64_t sim_pool_bytes(const sim_config *cfg);

/* Runs the simulation to completion on ctx. KVA_OK means it ran (verification failures are
 * counted in *result, not returned); anything else is a setup or library failure described in
 * result->error. */
kva_status sim_run(kva_context *ctx, const sim_config *cfg, sim_result *result);

#endif
