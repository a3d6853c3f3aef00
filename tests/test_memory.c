/*
 * test_memory.c -- the memory helpers and object lifetimes: allocation sizes that cannot be
 * rounded up to the alignment, large blocks with huge-page advice (on exactly the whole 2 MB
 * frames of a block, as /proc/self/smaps records it; none with KVA_HUGE_PAGES=0), and a cache
 * destroyed after its context (run under ASan by `make test-asan`, where a use-after-free or a
 * leak fails the test).
 */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#include "harness.h"
#include "test_util.h"
#include "../src/common/internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

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
    kva_test_env knob;
    kva_test_env_set(&knob, "KVA_HUGE_PAGES", "0");
    CHECK_OK(kva_malloc(ctx, big, &p));
    if (p) {
        CHECK(((uintptr_t)p % 64) == 0);
        check_usable(p, big);
        kva_free(ctx, p);
    }
    kva_test_env_restore(&knob);
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

/* Whether the mapping that holds addr was advised MADV_HUGEPAGE ("hg" in its VmFlags line of
 * /proc/self/smaps): 1 or 0, -1 where smaps cannot tell. madvise splits mappings, so this is
 * the advice of addr's own 4 KB page. */
static int advised_huge(uintptr_t addr) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int inside = 0, result = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = addr >= lo && addr < hi;
            continue;
        }
        if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            result = strstr(line, " hg") != NULL;
            break;
        }
    }
    fclose(f);
    return result;
}

/* Bytes of the main heap ([heap] in /proc/self/maps), 0 where there is none or it cannot be read. */
static size_t heap_bytes(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return 0;
    char line[512];
    size_t n = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (strstr(line, "[heap]") && sscanf(line, "%lx-%lx", &lo, &hi) == 2) n += hi - lo;
    }
    fclose(f);
    return n;
}

/* kva__advise_huge_pages advises exactly the whole 2 MB frames inside [p, p + bytes) and reports
 * 0; with no whole frame inside it advises nothing and reports -1. Checked on fresh mappings
 * through the advice the kernel records (whether huge pages are then granted is the system's
 * business and is not asserted). */
KVA_TEST(memory_huge_page_advice_covers_whole_frames_only) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const size_t F = KVA__HUGE_PAGE_BYTES;
    unsigned char *map = mmap(NULL, 8 * F, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) {
        kva_test_fail(__FILE__, __LINE__, "mmap of 16 MB failed");
        return;
    }
    const uintptr_t B = kva__align_up((uintptr_t)map, F); /* frames B .. B + 6F lie inside */
    if (advised_huge(B) != 0 || madvise((void *)(B + 6 * F), F, MADV_HUGEPAGE) != 0 ||
        advised_huge(B + 6 * F) != 1) {
        kva_test_skip("no MADV_HUGEPAGE here, or /proc/self/smaps shows no VmFlags");
        munmap(map, 8 * F);
        return;
    }
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    /* a block from inside frame 0 to inside frame 3: frames 1 and 2 are whole */
    const size_t head = 4096 * (size_t)kva_rng_int(&rng, 1, 511), tail = 4096 * (size_t)kva_rng_int(&rng, 1, 511);
    CHECK(kva__advise_huge_pages((void *)(B + head), 3 * F - head + tail) == 0);
    CHECK_MSG(advised_huge(B + head) == 0 && advised_huge(B + F - 4096) == 0,
              "the partial first frame was advised");
    CHECK_MSG(advised_huge(B + F) == 1 && advised_huge(B + 2 * F) == 1 && advised_huge(B + 3 * F - 4096) == 1,
              "a whole frame inside the block was not advised");
    CHECK_MSG(advised_huge(B + 3 * F) == 0 && advised_huge(B + 3 * F + tail - 4096) == 0,
              "the partial last frame was advised");
    /* frame 4 to the very end of frame 4 (begin == end after rounding), and a block within it */
    CHECK(kva__advise_huge_pages((void *)(B + 4 * F + 64), F - 64) == -1);
    CHECK(kva__advise_huge_pages((void *)(B + 4 * F + head), 4096) == -1);
    CHECK(kva__advise_huge_pages((void *)(B + 4 * F), 0) == -1);
    CHECK_MSG(advised_huge(B + 4 * F) == 0 && advised_huge(B + 5 * F - 4096) == 0,
              "a block without a whole frame was advised");
    munmap(map, 8 * F);

    /* kva_malloc: blocks of 2 MB and more, 2 MB exactly included, are 2 MB aligned and advised,
     * unless KVA_HUGE_PAGES=0. The last block is larger than glibc's largest mmap threshold (32 MB)
     * and than the whole heap, so it is a fresh mapping: advice seen on it is its own, not advice
     * left on reused heap memory by an earlier block. */
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_test_env knob;
    kva_test_env_set(&knob, "KVA_HUGE_PAGES", NULL);
    const size_t heap = heap_bytes(), fresh = heap > ((size_t)33 << 20) ? heap : (size_t)33 << 20;
    const size_t sizes[4] = {F, F + 1, 3 * F - 100, fresh + F + 64 * (size_t)kva_rng_int(&rng, 1, 1000)};
    for (int off = 0; off < 2; ++off) {
        if (off) setenv("KVA_HUGE_PAGES", "0", 1);
        for (int i = 0; i < 4; ++i) {
            void *p = NULL;
            CHECK_OK(kva_malloc(ctx, sizes[i], &p));
            if (!p) continue;
            CHECK_MSG((uintptr_t)p % (off ? 64 : F) == 0, "kva_malloc(%zu) = %p%s: misaligned", sizes[i], p,
                      off ? " (KVA_HUGE_PAGES=0)" : "");
            if (!off) CHECK_MSG(advised_huge((uintptr_t)p) == 1, "kva_malloc(%zu): the block is not advised", sizes[i]);
            if (off && i == 3)
                CHECK_MSG(advised_huge((uintptr_t)p) == 0 && advised_huge((uintptr_t)p + sizes[i] - 1) == 0,
                          "kva_malloc(%zu) with KVA_HUGE_PAGES=0: the block is advised", sizes[i]);
            if (i < 3) check_usable(p, sizes[i]);
            kva_free(ctx, p);
        }
    }
    kva_test_env_restore(&knob);
    kva_context_destroy(ctx);
#else
    kva_test_skip("no MADV_HUGEPAGE on this platform");
#endif
}
