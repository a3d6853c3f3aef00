/*
 * test_serve_sharing.c -- the serving simulation of `kvattn run` with prefix sharing (system
 * prompts forked from prefilled roots, parallel samples forked from their prompt) under
 * preemption and verification, and its soak mode (--duration).
 */
#include "harness.h"
#include "test_util.h"
#include "../tools/serve_sim.h"

#include <stdlib.h>

static void sharing_sim(sim_config *cfg) {
    sim_config_default(cfg);
    cfg->num_requests = 15;
    cfg->seed = kva_test_seed();
    cfg->num_layers = 2;
    cfg->num_qo_heads = 4;
    cfg->num_kv_heads = 2;
    cfg->head_dim = 32;
    cfg->dtype = KVA_F32;
    cfg->page_size = 5;
    cfg->token_budget = 40;
    cfg->max_batch = 5;
    cfg->prompt_len[0] = 1;
    cfg->prompt_len[1] = 40;
    cfg->output_len[0] = 0;
    cfg->output_len[1] = 30;
    cfg->verify_every = 1;
    cfg->verify_requests = 3;
    cfg->shared_prefix_len = 23; /* not a multiple of the page: roots end in a shared partial page */
    cfg->prefix_groups = 2;
    cfg->parallel_samples = 3;
}

static void check_sharing_clean(const sim_result *r) {
    CHECK_MSG(r->verify_failures == 0 && r->cache_mismatches == 0, "%lld rows off, %lld K/V off",
              (long long)r->verify_failures, (long long)r->cache_mismatches);
    CHECK_MSG(r->leaked_pages == 0, "%d pages or sequences left", r->leaked_pages);
    CHECK_MSG(r->shared_page_writes == 0, "%lld shared pages were written",
              (long long)r->shared_page_writes);
    CHECK(r->forks > 0 && r->shared_tokens > 0 && r->shared_page_checks > 0);
    CHECK(r->peak_shared_pages > 0 && r->cow_copies > 0);
    /* Every position is computed once, obtained by a fork, or recomputed after preemption. */
    CHECK_MSG(r->prefill_tokens + r->decode_tokens + r->shared_tokens ==
                  r->prompt_tokens + r->output_tokens + r->recomputed_tokens,
              "prefill %lld + decode %lld + shared %lld != prompt %lld + output %lld + recomputed %lld",
              (long long)r->prefill_tokens, (long long)r->decode_tokens, (long long)r->shared_tokens,
              (long long)r->prompt_tokens, (long long)r->output_tokens,
              (long long)r->recomputed_tokens);
}

KVA_TEST(serve_sharing_forks_verify_clean) {
    sim_config cfg;
    sharing_sim(&cfg);
    cfg.num_pages = 200; /* roomy */
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    sim_result r;
    kva_status st = sim_run(ctx, &cfg, &r);
    CHECK_MSG(st == KVA_OK, "sim_run: %s (%s)", kva_status_str(st), r.error);
    if (st == KVA_OK) {
        check_sharing_clean(&r);
        CHECK(r.requests_finished == cfg.num_requests);
        CHECK(r.preemptions == 0 && r.recomputed_tokens == 0);
        /* 5 families of 3: each first member forks its root, the 2 others fork its prompt */
        CHECK_MSG(r.forks == 5 + 10, "%d forks", r.forks);
        CHECK(r.root_tokens == 2 * 23);
    }
    kva_context_destroy(ctx);
}

KVA_TEST(serve_sharing_under_preemption) {
    sim_config cfg;
    sharing_sim(&cfg);
    /* Requests of 68..93 tokens (14..19 pages of 5), roots 10 pages, pool 32: a family's
     * shared prompt (13 pages) and three samples' own decodes (4..6 pages each, plus COW) cannot
     * all stay, so running requests get preempted and recompute. */
    cfg.num_pages = 32;
    cfg.prompt_len[0] = 25;
    cfg.output_len[0] = 20;
    int32_t preemptions = 0;
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    for (int round = 0; round < 3; ++round) {
        cfg.seed = kva_test_seed() + (uint64_t)round;
        cfg.layout = round % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        sim_result r;
        kva_status st = sim_run(ctx, &cfg, &r);
        CHECK_MSG(st == KVA_OK, "sim_run: %s (%s)", kva_status_str(st), r.error);
        if (st != KVA_OK) break;
        check_sharing_clean(&r);
        CHECK(r.requests_finished == cfg.num_requests);
        preemptions += r.preemptions;
    }
    CHECK_MSG(preemptions > 0, "no preemption with a %d-page pool", cfg.num_pages);
    kva_context_destroy(ctx);
}

/* Soak: requests keep arriving until the duration has passed; every life is verified and the
 * pool is empty at the end. */
KVA_TEST(serve_soak_recycles_requests) {
    sim_config cfg;
    sharing_sim(&cfg);
    cfg.num_pages = 60;
    cfg.num_requests = 6;
    cfg.duration_seconds = 1.5;
    cfg.verify_every = 4;
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    sim_result r;
    kva_status st = sim_run(ctx, &cfg, &r);
    CHECK_MSG(st == KVA_OK, "sim_run: %s (%s)", kva_status_str(st), r.error);
    if (st == KVA_OK) {
        check_sharing_clean(&r);
        CHECK_MSG(r.requests_finished > cfg.num_requests, "%d lives of %d slots",
                  r.requests_finished, cfg.num_requests);
        CHECK(r.wall_seconds >= cfg.duration_seconds);
    }
    kva_context_destroy(ctx);
}
