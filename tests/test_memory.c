/*
 * test_memory.c -- the memory helpers and object lifetimes: allocation sizes that cannot be
 * rounded up to the alignment, large blocks with huge-page advice, and a cache destroyed after
 * its context (run under ASan by `make test-asan`, where a use-after-free fails the test).
 */
#include "harness.h"
#include "test_util.h"
#include "../src/common/internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sizes near SIZE_MAX used to wrap to a 64-byte block when rounded up, and return KVA_OK. */
KVA_TEST(memory_alloc_near_size_max_is_refused) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    const size_t sizes[] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 63, (size_t)PTRDIFF_MAX + 1};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        void *p = (void *)1;
        CHECK_STATUS(kva_malloc(ctx, sizes[i], &p), KVA_ERR_OUT_OF_MEMORY);
        CHECK(p == NULL);
        if (p) kva_free(ctx, p);
        p = (void *)1;
        CHECK_STATUS(kva_host_alloc(ctx, sizes[i], &p), KVA_ERR_OUT_OF_MEMORY);
        CHECK(p == NULL);
        if (p) kva_host_free(ctx, p);
        CHECK(strstr(kva_last_error(), "kva_host_alloc") != NULL);
    }
    /* ordinary sizes still work, including 0 */
    void *p = NULL;
    CHECK_OK(kva_malloc(ctx, 0, &p));
    kva_free(ctx, p);
    CHECK_OK(kva_malloc(ctx, 100, &p));
    CHECK(((uintptr_t)p % 64) == 0);
    kva_free(ctx, p);
    kva_context_destroy(ctx);
}

/* Writes every byte of a block, reads back its ends: the whole block is usable memory. */
static void check_usable(unsigned char *p, size_t bytes) {
    memset(p, 0x5a, bytes);
    CHECK(p[0] == 0x5a && p[bytes / 2] == 0x5a && p[bytes - 1] == 0x5a);
}

/* A CPU block of 2 MB or more is 2 MB aligned (Linux: with huge pages advised); advice that
 * fails -- no whole 2 MB frame in the range -- changes nothing, and KVA_HUGE_PAGES=0 gives a
 * plain 64-byte aligned block. Whether huge pages are granted is the system's choice (THP
 * mode, free memory), so it is not asserted. */
KVA_TEST(memory_large_blocks_get_huge_page_advice) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    const size_t big = ((size_t)5 << 20) + 100, small = (size_t)1 << 20;
    const char *env = getenv("KVA_HUGE_PAGES");
    const size_t align = env && strcmp(env, "0") == 0 ? 64 : KVA__HUGE_PAGE_BYTES;
    void *p = NULL;
    CHECK_OK(kva_malloc(ctx, big, &p));
    if (p) {
        CHECK(((uintptr_t)p % align) == 0);
        check_usable(p, big);
        kva_free(ctx, p);
    }
    CHECK_OK(kva_malloc(ctx, small, &p));
    if (p) {
        CHECK(((uintptr_t)p % 64) == 0);
        CHECK(kva__advise_huge_pages(p, small) == -1); /* no whole frame: nothing advised */
        check_usable(p, small);
        kva_free(ctx, p);
    }
    char saved[16] = "";
    if (env) snprintf(saved, sizeof saved, "%s", env);
    setenv("KVA_HUGE_PAGES", "0", 1);
    CHECK_OK(kva_malloc(ctx, big, &p));
    if (p) {
        CHECK(((uintptr_t)p % 64) == 0);
        check_usable(p, big);
        kva_free(ctx, p);
    }
    if (env)
        setenv("KVA_HUGE_PAGES", saved, 1);
    else
        unsetenv("KVA_HUGE_PAGES");
    kva_context_destroy(ctx);
}

static kva_cache *small_cache(kva_context *ctx) {
    kva_cache_config cc = {.num_layers = 2, .num_kv_heads = 1, .head_dim = 16, .page_size = 4,
                           .num_pages = 8, .dtype = KVA_F32, .layout = KVA_LAYOUT_NHD,
                           .max_sequences = 4, .max_append_tokens = 8};
    kva_cache *c = NULL;
    kva_status st = kva_cache_create(ctx, &cc, &c);
    CHECK_MSG(st == KVA_OK, "kva_cache_create: %s (%s)", kva_status_str(st), kva_last_error());
    return c;
}

/* kva_cache_destroy frees its pool through the context: destroying the context first must not
 * leave the cache pointing at freed memory. The context is released with its last cache. */
KVA_TEST(memory_cache_destroyed_after_its_context) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_cache *a = small_cache(ctx), *b = small_cache(ctx);
    if (!a || !b) return;
    int32_t seq;
    CHECK_OK(kva_cache_add_sequence(a, &seq));
    int32_t one = 3;
    CHECK_OK(kva_cache_reserve(a, 1, &seq, &one));
    kva_context_destroy(ctx);
    kva_cache_destroy(b);
    kva_cache_destroy(a); /* the context is freed here (ASan: no leak, no use-after-free) */

    /* the usual order still works, and a context without caches is freed at once */
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_cache *c = small_cache(ctx);
    kva_cache_destroy(c);
    kva_context_destroy(ctx);
}
