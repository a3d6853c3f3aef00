/*
 * test_variant_compile.c -- CUDA variants without a GPU: NVRTC compiles for an explicit
 * architecture (kva__variant_build), so CI checks that every kernel compiles with a score
 * modifier inlined (sm_90a with the wgmma prefill, sm_80), that compile errors come back as
 * KVA_ERR_INVALID_ARG with NVRTC's log and leave nothing behind, and the disk cache: miss then
 * hit, keys that change with source and architecture, and corrupt, truncated, stale or garbage
 * entries rebuilt rather than trusted. Also the public API's answers on a CPU context and the
 * ALiBi helpers (any build), and that a decode kernel reads no caller data before its PDL wait
 * (PTX). The GPU runs are tests/test_cuda_variant.c.
 */
#include "harness.h"
#include "../src/cuda/variant.h"
#include "../examples/variant_sources.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dirent.h>

static const char *k_mod_src =
    "/* a T5-style bias from a table in caller data */\n"
    "float bias_mod(float s, int32_t q, int32_t k, int32_t h, const void *user) {\n"
    "    const float *t = (const float *)user;\n"
    "    int32_t d = q - k; if (d > 31) d = 31; if (d < 0) d = 0;\n"
    "    return s + t[h * 32 + d];\n"
    "}\n";

static float identity_mod(float s, int32_t q, int32_t k, int32_t h, void *u) {
    (void)q; (void)k; (void)h; (void)u;
    return s;
}

KVA_TEST(variant_api_cpu_context) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_variant *v = (kva_variant *)0x1;
    CHECK_STATUS(kva_variant_create(ctx, k_mod_src, "bias_mod", NULL, &v), KVA_ERR_UNSUPPORTED);
    CHECK(v == NULL);
    CHECK(strstr(kva_last_error(), "score_mod") != NULL);
    CHECK_STATUS(kva_variant_create_alibi(ctx, NULL, &v), KVA_ERR_UNSUPPORTED);
    CHECK_STATUS(kva_variant_create(ctx, NULL, "f", NULL, &v), KVA_ERR_INVALID_ARG);
    CHECK_STATUS(kva_variant_create(ctx, k_mod_src, "1bad", NULL, &v), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "'1bad'") != NULL);
    CHECK_STATUS(kva_variant_create(ctx, k_mod_src, "a b", NULL, &v), KVA_ERR_INVALID_ARG);
    CHECK_STATUS(kva_variant_create(ctx, k_mod_src, NULL, NULL, &v), KVA_ERR_INVALID_ARG);
    CHECK_STATUS(kva_variant_create(ctx, k_mod_src, "f", NULL, NULL), KVA_ERR_INVALID_ARG);
    kva_variant_options bad = {.kinds = 4};
    CHECK_STATUS(kva_variant_create(ctx, k_mod_src, "f", &bad, &v), KVA_ERR_INVALID_ARG);
    kva_variant_destroy(NULL);

    /* params: a variant on a CPU context, or both ways set, are refused before anything runs */
    float q[64], k[64], vv[64], o[64];
    for (int i = 0; i < 64; ++i) q[i] = k[i] = vv[i] = 0.01f * i;
    const kva_tensor tq = kva_tensor_nhd(q, KVA_F32, 1, 64), tk = kva_tensor_nhd(k, KVA_F32, 1, 64);
    const kva_tensor tv = kva_tensor_nhd(vv, KVA_F32, 1, 64), to = kva_tensor_nhd(o, KVA_F32, 1, 64);
    kva_attn_params p = kva_attn_params_default(1, 1, 64);
    CHECK(p.variant == NULL);
    int fake;
    p.variant = (const kva_variant *)&fake;
    CHECK_STATUS(kva_attention(ctx, &p, 1, 1, tq, tk, tv, to, NULL), KVA_ERR_UNSUPPORTED);
    CHECK(strstr(kva_last_error(), "params.variant") != NULL);
    kva_attn_params both = p;
    both.score_mod = identity_mod;
    CHECK_STATUS(kva_attention(ctx, &both, 1, 1, tq, tk, tv, to, NULL), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "both") != NULL);
    kva_context_destroy(ctx);
}

KVA_TEST(variant_alibi_helpers) {
    const char *src = kva_variant_alibi_source();
    CHECK(src && strstr(src, "kva_alibi(") != NULL);
    float s[12];
    kva_alibi_slopes(8, s);
    for (int h = 0; h < 8; ++h) CHECK_MSG(fabsf(s[h] - powf(2.f, -(float)(h + 1))) < 1e-7f, "slope %d = %g", h, s[h]);
    /* 12 heads: the 8 slopes of 8 heads, then every other slope of 16 heads (2^-0.5, 2^-1.5, ...) */
    kva_alibi_slopes(12, s);
    for (int h = 0; h < 8; ++h) CHECK(fabsf(s[h] - powf(2.f, -(float)(h + 1))) < 1e-7f);
    for (int i = 0; i < 4; ++i) CHECK(fabsf(s[8 + i] - powf(2.f, -0.5f * (float)(2 * i + 1))) < 1e-6f);
}

#ifdef KVA_HAVE_CUDA
#include "../src/cuda/nvrtc_loader.h"

KVA_TEST(variant_module_selection) {
    kva__vmod_id ids[32];
    CHECK(kva__variant_modules(NULL, ids, 32) == 18);
    kva_variant_options o = {.kinds = KVA_VARIANT_DECODE, .dtypes = 1u << KVA_BF16, .head_dim = 96};
    CHECK(kva__variant_modules(&o, ids, 32) == 1);
    CHECK(ids[0].kind == KVA__VMOD_DECODE && ids[0].dtype == KVA_BF16 && ids[0].dim == 128);
    o.kinds = KVA_VARIANT_PREFILL; /* prefill serves head dim 96 on the d128 build too */
    CHECK(kva__variant_modules(&o, ids, 32) == 1);
    CHECK(ids[0].kind == KVA__VMOD_PREFILL && ids[0].dtype == KVA_BF16 && ids[0].dim == 128);
    o.head_dim = 24; /* no build serves it */
    CHECK(kva__variant_modules(&o, ids, 32) == 0);
    o.head_dim = 96;
    o.kinds = 0;
    o.head_dim = 128;
    o.dtypes = 0;
    CHECK(kva__variant_modules(&o, ids, 32) == 6);
}


/* A fresh empty directory under /tmp (the test's disk cache). */
static bool temp_dir(char *buf, size_t n) {
    snprintf(buf, n, "/tmp/kvattn-variant-test-XXXXXX");
    return mkdtemp(buf) != NULL;
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') ++n;
    closedir(d);
    return n;
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4200];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        remove(path);
    }
    closedir(d);
    rmdir(dir);
}

static bool same_image(const kva__vmod_image *a, const kva__vmod_image *b) {
    if (a->code_size != b->code_size || a->is_ptx != b->is_ptx || memcmp(a->code, b->code, a->code_size) != 0)
        return false;
    for (int i = 0; i < KVA__VMOD_MAX_KERNELS; ++i) {
        if (!a->names[i] != !b->names[i]) return false;
        if (a->names[i] && strcmp(a->names[i], b->names[i]) != 0) return false;
    }
    return true;
}

/* Every kind of kernel compiles with a modifier inlined: decode (both algorithms, 1 and 2 head
 * tiles), mma.sync prefill (64 and 128 rows), the wgmma prefill at sm_90a, f32 prefill. */
KVA_TEST(variant_compile_every_kernel) {
    const kva__vmod_id ids[] = {
        {KVA__VMOD_DECODE, KVA_BF16, 128}, {KVA__VMOD_DECODE, KVA_F32, 256}, {KVA__VMOD_DECODE, KVA_F16, 64},
        {KVA__VMOD_PREFILL, KVA_BF16, 128}, {KVA__VMOD_PREFILL, KVA_F16, 256}, {KVA__VMOD_PREFILL, KVA_F32, 64}};
    const int n = (int)(sizeof ids / sizeof ids[0]);
    kva__vmod_image img[6];
    kva_variant_stats st = {0};
    REQUIRE_OK(kva__variant_build("test", k_mod_src, "bias_mod", ids, n, 90, NULL, img, &st));
    CHECK(st.compiled == n && st.disk_hits == 0);
    printf("    %d modules for sm_90a in %.0f ms (NVRTC, parallel)\n", n, st.compile_ms);
    for (int m = 0; m < n; ++m) {
        CHECK(img[m].code_size > 0 && !img[m].is_ptx);
        /* prefill f16/bf16: mma 128 and 64 rows, wgmma, and the TMA kernel once it has the hook
         * (at d128 twice: the source's choice of the turns and with them) */
        const int tma = kva__variant_hopper_hooked() ? (ids[m].dim == 128 ? 2 : 1) : 0;
        const int want = ids[m].kind == KVA__VMOD_DECODE ? 4 : ids[m].dtype == KVA_F32 ? 1 : 3 + tma;
        int have = 0;
        for (int i = 0; i < KVA__VMOD_MAX_KERNELS; ++i) have += img[m].names[i] != NULL;
        CHECK_MSG(have == want, "module %d: %d kernels, expected %d", m, have, want);
    }
    CHECK(img[3].names[KVA__VMOD_PF_HOPPER] && strstr(img[3].names[KVA__VMOD_PF_HOPPER], "Lb1E"));
    /* (the d128 TMA kernel's two builds: the default's TURNS = -1 and 1, both uncapped -- CAP = 0,
     * the template's last argument: a module takes the soft cap at run time) */
    if (kva__variant_hopper_hooked())
        CHECK(img[3].names[KVA__VMOD_PF_TMA_TURNS] && strstr(img[3].names[KVA__VMOD_PF_TMA_TURNS], "ELi1ELi0EEv") &&
              strstr(img[3].names[KVA__VMOD_PF_TMA], "ELin1ELi0EEv") && !img[4].names[KVA__VMOD_PF_TMA_TURNS]);
    kva__vmod_images_free(img, n);
    /* a source whose own build takes the turns (KVA_VARIANT_PINGPONG): no second d128 TMA build */
    if (kva__variant_hopper_hooked()) {
        char src[512];
        snprintf(src, sizeof src, "#define KVA_VARIANT_PINGPONG 1\n%s", k_mod_src);
        REQUIRE_OK(kva__variant_build("test", src, "bias_mod", &ids[3], 1, 90, NULL, img, NULL));
        CHECK(img[0].names[KVA__VMOD_PF_TMA] && !img[0].names[KVA__VMOD_PF_TMA_TURNS]);
        kva__vmod_images_free(img, 1);
    }
    /* sm_80: no wgmma kernel in the prefill module */
    REQUIRE_OK(kva__variant_build("test", kva_variant_alibi_source(), "kva_alibi", &ids[3], 1, 80, NULL, img, NULL));
    CHECK(img[0].names[KVA__VMOD_PF_LARGE] && img[0].names[KVA__VMOD_PF_SMALL] && !img[0].names[KVA__VMOD_PF_HOPPER] &&
          !img[0].names[KVA__VMOD_PF_TMA] && !img[0].names[KVA__VMOD_PF_TMA_TURNS]);
    kva__vmod_images_free(img, 1);
}

KVA_TEST(variant_compile_errors) {
    char dir[64];
    if (!temp_dir(dir, sizeof dir)) {
        kva_test_fail(__FILE__, __LINE__, "mkdtemp failed");
        return;
    }
    const kva__vmod_id id = {KVA__VMOD_PREFILL, KVA_F32, 64};
    kva__vmod_image img[1];
    /* a syntax error: the status, NVRTC's log with the caller's line, no cache entry */
    const char *bad = "float m(float s, int32_t q, int32_t k, int32_t h, const void *u) {\n"
                      "    return s + undefined_name;\n}\n";
    CHECK_STATUS(kva__variant_build("kva_variant_create", bad, "m", &id, 1, 90, dir, img, NULL), KVA_ERR_INVALID_ARG);
    CHECK(strstr(kva_last_error(), "kva_variant_create") != NULL);
    CHECK(strstr(kva_last_error(), "NVRTC") != NULL);
    CHECK_MSG(strstr(kva_last_error(), "variant.cu(2)") != NULL, "log: %s", kva_last_error());
    CHECK(strstr(kva_last_error(), "undefined_name") != NULL);
    /* another signature than the score_mod one */
    const char *sig = "float m(float s, int q, int k) { return s; }\n";
    CHECK_STATUS(kva__variant_build("kva_variant_create", sig, "m", &id, 1, 90, dir, img, NULL), KVA_ERR_INVALID_ARG);
    /* the function is not in the source */
    CHECK_STATUS(kva__variant_build("kva_variant_create", k_mod_src, "not_there", &id, 1, 90, dir, img, NULL),
                 KVA_ERR_INVALID_ARG);
    CHECK(count_files(dir) == 0);
    remove_dir(dir);
}

KVA_TEST(variant_cache_hit_miss) {
    char dir[64];
    if (!temp_dir(dir, sizeof dir)) {
        kva_test_fail(__FILE__, __LINE__, "mkdtemp failed");
        return;
    }
    const kva__vmod_id id = {KVA__VMOD_PREFILL, KVA_F32, 64};
    kva__vmod_image a[1], b[1], c[1], d[1];
    kva_variant_stats st = {0};
    REQUIRE_OK(kva__variant_build("test", k_mod_src, "bias_mod", &id, 1, 90, dir, a, &st));
    CHECK(st.compiled == 1 && st.disk_hits == 0 && !a[0].from_disk);
    CHECK(count_files(dir) == 1);
    char path[4200];
    kva__vcache_path(dir, a[0].key, path, sizeof path);
    CHECK(access(path, R_OK) == 0);
    /* the same again: a hit, byte for byte */
    REQUIRE_OK(kva__variant_build("test", k_mod_src, "bias_mod", &id, 1, 90, dir, b, &st));
    CHECK(st.compiled == 0 && st.disk_hits == 1 && b[0].from_disk);
    CHECK(same_image(&a[0], &b[0]));
    /* another source, another architecture: misses with their own keys */
    char src2[1024];
    snprintf(src2, sizeof src2, "%s/* edited */\n", k_mod_src);
    REQUIRE_OK(kva__variant_build("test", src2, "bias_mod", &id, 1, 90, dir, c, &st));
    CHECK(st.compiled == 1 && (c[0].key[0] != a[0].key[0] || c[0].key[1] != a[0].key[1]));
    REQUIRE_OK(kva__variant_build("test", k_mod_src, "bias_mod", &id, 1, 80, dir, d, &st));
    CHECK(st.compiled == 1 && (d[0].key[0] != a[0].key[0] || d[0].key[1] != a[0].key[1]));
    CHECK(count_files(dir) == 3);
    kva__vmod_images_free(a, 1);
    kva__vmod_images_free(b, 1);
    kva__vmod_images_free(c, 1);
    kva__vmod_images_free(d, 1);
    remove_dir(dir);
}

/* Damages the cache file at path: 0 a flipped bit, 1 truncated, 2 garbage, 3 another module's
 * valid file (a stale entry), 4 empty. */
static bool rewrite(const char *path, int mode, const char *other_path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    static unsigned char buf[1 << 22];
    const size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t m = n;
    if (mode == 0) buf[n / 2] ^= 0x40;       /* one flipped bit in the code */
    if (mode == 1) m = n - 100;              /* truncated */
    if (mode == 2) memset(buf, 'x', m = 37); /* garbage */
    if (mode == 3) {                         /* a valid file of another module under this name */
        FILE *g = fopen(other_path, "rb");
        if (!g) return false;
        m = fread(buf, 1, sizeof buf, g);
        fclose(g);
    }
    if (mode == 4) m = 0; /* empty */
    if (mode == 5) memcpy(buf, "KVAVAR01", 8); /* an older format's magic (four kernel slots), all else intact */
    f = fopen(path, "wb");
    if (!f) return false;
    const bool ok = fwrite(buf, 1, m, f) == m;
    return fclose(f) == 0 && ok;
}

/* The cache key sees the whole function name: two names of the longest length
 * kva_variant_create takes (200) that differ only in their last character get different keys
 * (the key's text once cut names off after ~140 characters). */
KVA_TEST(variant_key_long_function_names) {
    char a[201], b[201];
    memset(a, 'f', 200);
    a[200] = '\0';
    memcpy(b, a, sizeof b);
    b[199] = 'g';
    const kva__vmod_id id = {KVA__VMOD_PREFILL, KVA_F32, 64};
    uint64_t ka[2], kb[2];
    kva__variant_key(k_mod_src, a, &id, 90, ka);
    kva__variant_key(k_mod_src, b, &id, 90, kb);
    CHECK(ka[0] != kb[0] || ka[1] != kb[1]);
}

KVA_TEST(variant_cache_corruption) {
    char dir[64];
    if (!temp_dir(dir, sizeof dir)) {
        kva_test_fail(__FILE__, __LINE__, "mkdtemp failed");
        return;
    }
    const kva__vmod_id id = {KVA__VMOD_PREFILL, KVA_F32, 64};
    kva__vmod_image good[1], other[1], img[1];
    kva_variant_stats st = {0};
    REQUIRE_OK(kva__variant_build("test", k_mod_src, "bias_mod", &id, 1, 90, dir, good, NULL));
    REQUIRE_OK(kva__variant_build("test", kva_variant_alibi_source(), "kva_alibi", &id, 1, 90, dir, other, NULL));
    char path[4200], other_path[4200];
    kva__vcache_path(dir, good[0].key, path, sizeof path);
    kva__vcache_path(dir, other[0].key, other_path, sizeof other_path);
    static const char *what[] = {"flipped bit", "truncated", "garbage", "stale (another key)", "empty",
                                 "older format"};
    for (int mode = 0; mode < 6; ++mode) {
        CHECK_MSG(rewrite(path, mode, other_path), "rewriting the cache file (%s)", what[mode]);
        /* the bad entry is a miss: recompiled, identical to the first build, and rewritten */
        REQUIRE_OK(kva__variant_build("test", k_mod_src, "bias_mod", &id, 1, 90, dir, img, &st));
        CHECK_MSG(st.compiled == 1 && st.disk_hits == 0 && !img[0].from_disk, "%s entry trusted", what[mode]);
        CHECK_MSG(same_image(&good[0], &img[0]), "%s: rebuilt module differs", what[mode]);
        kva__vmod_images_free(img, 1);
        REQUIRE_OK(kva__variant_build("test", k_mod_src, "bias_mod", &id, 1, 90, dir, img, &st));
        CHECK_MSG(st.disk_hits == 1 && same_image(&good[0], &img[0]), "%s: not rewritten", what[mode]);
        kva__vmod_images_free(img, 1);
    }
    kva__vmod_images_free(good, 1);
    kva__vmod_images_free(other, 1);
    remove_dir(dir);
}

/* A function named like the kernels' locals (x, p, s: shadowed at a direct call) compiles. */
KVA_TEST(variant_compile_name_like_a_local) {
    const char *src = "float x(float s, int32_t q, int32_t k, int32_t h, const void *u) { return s + 0.5f * (k - q); }\n";
    const kva__vmod_id ids[3] = {{KVA__VMOD_DECODE, KVA_F32, 64}, {KVA__VMOD_PREFILL, KVA_F16, 64},
                                 {KVA__VMOD_PREFILL, KVA_F32, 64}};
    const char *names[3] = {"x", "p", "s"};
    for (int i = 0; i < 3; ++i) {
        char buf[256];
        snprintf(buf, sizeof buf, "float %s(float s_, int32_t q, int32_t k, int32_t h, const void *u) { return s_ + 0.5f * (k - q); }\n",
                 names[i]);
        kva__vmod_image img[3];
        kva_status st = kva__variant_build("test", i == 0 ? src : buf, names[i], ids, 3, 90, NULL, img, NULL);
        CHECK_MSG(st == KVA_OK, "function '%s': %s", names[i], kva_last_error());
        if (st == KVA_OK) kva__vmod_images_free(img, 3);
    }
}

/* The examples' sources (examples/variant_sources.h: one text for the CPU callback and the GPU)
 * compile into decode and prefill kernels; so does the built-in ALiBi (its native paths). */
KVA_TEST(variant_compile_examples) {
    const struct { const char *src, *fn; } ex[] = {{KVA_EX_SOURCE_T5, "t5_bias"},
                                                   {KVA_EX_SOURCE_DOC_MASK, "doc_mask"},
                                                   {KVA_EX_SOURCE_SOFTCAP, "softcap"},
                                                   {kva_variant_alibi_source(), "kva_alibi"}};
    const kva__vmod_id ids[2] = {{KVA__VMOD_DECODE, KVA_BF16, 128}, {KVA__VMOD_PREFILL, KVA_BF16, 128}};
    for (int i = 0; i < 4; ++i) {
        kva__vmod_image img[2];
        kva_status st = kva__variant_build("test", ex[i].src, ex[i].fn, ids, 2, 90, NULL, img, NULL);
        CHECK_MSG(st == KVA_OK, "%s: %s", ex[i].fn, kva_last_error());
        if (st == KVA_OK) kva__vmod_images_free(img, 2);
    }
}

/* What a PTX kernel does before its main path's griddepcontrol.wait (blocks without work wait in
 * a branch that returns: that wait is the one followed by ret within a few instructions). */
typedef struct {
    int waits;      /* main-path waits found (1 expected); the fields below are valid when 1 */
    int loads;      /* ld.*.global* instructions before it */
    int non_plan;   /* ... of them not a 32-bit integer load (plan data -- records, the work
                       count, page ids -- is int32; q is u32 vectors, ALiBi's slopes f32) */
    int copies;     /* cp.async* before it (K/V or q tiles) */
} pre_wait;

static const char *next_line(const char *p) {
    const char *n = strchr(p, '\n');
    return n ? n + 1 : NULL;
}

static bool line_has(const char *line, const char *what) {
    const char *eol = strchr(line, '\n'), *f = strstr(line, what);
    return f && (!eol || f < eol);
}

static pre_wait scan_before_wait(const char *ptx, const char *name) {
    pre_wait r = {0, 0, 0, 0};
    char head[600];
    snprintf(head, sizeof head, ".entry %s(", name);
    const char *e = strstr(ptx, head);
    if (!e) return r;
    const char *end = strstr(e + 1, ".entry ");
    const char *w = NULL;
    for (const char *p = strstr(e, "griddepcontrol.wait"); p && (!end || p < end);
         p = strstr(p + 1, "griddepcontrol.wait")) {
        bool returns = false; /* ret; among the next 4 lines */
        const char *l = next_line(p);
        for (int i = 0; i < 4 && l; ++i, l = next_line(l)) returns = returns || line_has(l, "ret;");
        if (!returns) {
            ++r.waits;
            w = p;
        }
    }
    if (r.waits != 1) return r;
    for (const char *p = e; p && p < w; p = next_line(p)) {
        while (*p == '\t' || *p == ' ') ++p;
        if (strncmp(p, "ld.", 3) == 0 && line_has(p, ".global")) {
            ++r.loads;
            r.non_plan += !line_has(p, ".s32");
        }
        r.copies += strncmp(p, "cp.async", 8) == 0;
    }
    return r;
}

/* A decode kernel may launch as a programmatic dependent (decode_launch.cu): before its
 * griddepcontrol.wait it reads only plan data, never what a previous kernel may be writing: q,
 * K / V, and caller data. The built-in ALiBi keeps per-lane slopes (caller data) in registers;
 * its kernels and those of a modifier that reads caller data only inside the score must load
 * plan data alone before the wait, as many loads each. PTX (text order) for the newest virtual
 * architecture NVRTC has (the wait exists from sm_90); bf16 and f32 (the two decode code paths). */
KVA_TEST(variant_decode_reads_caller_data_after_the_pdl_wait) {
    const kva__vmod_id ids[2] = {{KVA__VMOD_DECODE, KVA_BF16, 128}, {KVA__VMOD_DECODE, KVA_F32, 128}};
    kva__vmod_image alibi[2], bias[2];
    REQUIRE_OK(kva__variant_build("test", kva_variant_alibi_source(), "kva_alibi", ids, 2, 9999, NULL, alibi, NULL));
    REQUIRE_OK(kva__variant_build("test", k_mod_src, "bias_mod", ids, 2, 9999, NULL, bias, NULL));
    int kernels = 0;
    for (int m = 0; m < 2; ++m) {
        CHECK(alibi[m].is_ptx && bias[m].is_ptx);
        char *pa = (char *)calloc(1, alibi[m].code_size + 1), *pb = (char *)calloc(1, bias[m].code_size + 1);
        if (pa && pb) {
            memcpy(pa, alibi[m].code, alibi[m].code_size);
            memcpy(pb, bias[m].code, bias[m].code_size);
            for (int s = 0; s < KVA__VMOD_MAX_KERNELS; ++s) {
                if (!alibi[m].names[s] || !bias[m].names[s]) continue;
                ++kernels;
                const pre_wait ra = scan_before_wait(pa, alibi[m].names[s]), rb = scan_before_wait(pb, bias[m].names[s]);
                CHECK_MSG(ra.waits == 1 && rb.waits == 1, "%s decode kernel %d: %d / %d main-path waits, expected 1",
                          kva_dtype_name(ids[m].dtype), s, ra.waits, rb.waits);
                CHECK_MSG(rb.loads > 0 && ra.loads == rb.loads && ra.non_plan == 0 && rb.non_plan == 0 &&
                              ra.copies == 0 && rb.copies == 0,
                          "%s decode kernel %d before the wait: ALiBi %d loads (%d not plan data), %d copies; "
                          "generic modifier %d loads (%d not plan data), %d copies",
                          kva_dtype_name(ids[m].dtype), s, ra.loads, ra.non_plan, ra.copies, rb.loads, rb.non_plan,
                          rb.copies);
                if (s == 0)
                    printf("    %s: %d global loads before griddepcontrol.wait, all int32 plan data\n",
                           kva_dtype_name(ids[m].dtype), rb.loads);
            }
        } else {
            CHECK(!"out of memory");
        }
        free(pa);
        free(pb);
    }
    CHECK(kernels == 8);
    kva__vmod_images_free(alibi, 2);
    kva__vmod_images_free(bias, 2);
}

/* libnvrtc is opened on first use: a missing file or one without NVRTC's functions is refused
 * with a reason (kva_variant_create then returns KVA_ERR_UNSUPPORTED with it), the real one opens. */
KVA_TEST(variant_compile_nvrtc_loader) {
    kva__nvrtc_api api;
    char why[1024] = "";
    CHECK(!kva__nvrtc_open("/nonexistent/libnvrtc.so", &api, why, sizeof why));
    CHECK(strstr(why, "could not be loaded") != NULL);
    CHECK(!kva__nvrtc_open("libm.so.6", &api, why, sizeof why));
    CHECK(strstr(why, "lacks an NVRTC function") != NULL);
    CHECK(kva__nvrtc_missing() == NULL); /* this build's libnvrtc */
    int maj = 0, mn = 0;
    CHECK(kva__nvrtc()->Version(&maj, &mn) == NVRTC_SUCCESS && maj > 0);
}

#endif /* KVA_HAVE_CUDA */
