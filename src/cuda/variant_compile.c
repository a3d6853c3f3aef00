/*
 * variant_compile.c -- the NVRTC build of a variant's modules (variant.h): which modules an
 * options struct asks for, the program each is compiled from, its cache key, and
 * kva__variant_build (disk cache, else NVRTC, modules compiled in parallel). Host code only: it
 * needs libnvrtc but no GPU, so tests compile for an explicit architecture in CI.
 *
 * A module's program is the caller's source between the kernel sources' hook and the kernel
 * file, all from the sources embedded in the library at build time (cmake/embed_sources.cmake):
 *     #define KVA_SCORE_MOD_FN <function>
 *     #include "cuda_common.cuh"        (rtc_shim.cuh instead of the toolkit headers)
 *     #include "variant_prelude.cuh"    (kva_tanhf, ...)
 *     <source>
 *     #include "decode_kernel.cuh" | "prefill_kernel.cuh" | "prefill_f32.cu"
 * and the kernels are named by NVRTC name expressions (the templates the library's .cu files
 * instantiate), so their lowered names come from the compiler, never from guessing a mangling.
 * Options match the library's nvcc flags for the kernels (--use_fast_math, C++17), so a variant
 * kernel is the library's kernel plus the modifier.
 */
#include "variant.h"
#include "../common/internal.h"

#include "nvrtc_loader.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const int k_dims[3] = {64, 128, 256};
static const kva_dtype k_dtypes[3] = {KVA_BF16, KVA_F16, KVA_F32};

int kva__variant_modules(const kva_variant_options *o, kva__vmod_id *ids, int capacity) {
    const uint32_t kinds = o && o->kinds ? o->kinds : (KVA_VARIANT_DECODE | KVA_VARIANT_PREFILL);
    const uint32_t dtypes = o && o->dtypes ? o->dtypes : 7u;
    const int hd = o ? o->head_dim : 0;
    int n = 0;
    for (int kind = KVA__VMOD_DECODE; kind <= KVA__VMOD_PREFILL; ++kind) {
        if (!(kinds & (kind == KVA__VMOD_DECODE ? KVA_VARIANT_DECODE : KVA_VARIANT_PREFILL))) continue;
        for (int t = 0; t < 3; ++t) {
            if (!(dtypes & (1u << k_dtypes[t]))) continue;
            for (int d = 0; d < 3; ++d) {
                if (hd != 0 && kva__built_head_dim(hd) != k_dims[d]) continue;
                if (n < capacity) {
                    ids[n].kind = kind;
                    ids[n].dtype = k_dtypes[t];
                    ids[n].dim = k_dims[d];
                }
                ++n;
            }
        }
    }
    return n;
}

bool kva__variant_hopper_hooked(void) {
    for (int i = 0; i < kva__embedded_file_count; ++i)
        if (strcmp(kva__embedded_files[i].name, "prefill_hopper.cuh") == 0)
            return strstr(kva__embedded_files[i].text, "KVA__HAS_SCORE_MOD") != NULL;
    return false;
}

static const char *type_name(kva_dtype t) {
    return t == KVA_BF16 ? "__nv_bfloat16" : t == KVA_F16 ? "__half" : "float";
}

/* The name expressions of a module's kernel slots (variant.h); NULL where the slot has none on
 * `arch`. Prefill tiles mirror KVA__PREFILL_INSTANTIATE (prefill_kernel.cuh): (MT, warps) =
 * (2, 4) for 128 rows at d <= 128, (1, 8) at d = 256, (1, 4) for 64 rows, (1, 8) on wgmma ((1, 12)
 * at d64: kva__prefill_wg_warps). */
static void kernel_exprs(const kva__vmod_id *id, int arch, bool own_turns, char exprs[KVA__VMOD_MAX_KERNELS][160]) {
    const char *T = type_name(id->dtype);
    const int D = id->dim;
    for (int i = 0; i < KVA__VMOD_MAX_KERNELS; ++i) exprs[i][0] = '\0';
    if (id->kind == KVA__VMOD_DECODE) {
        for (int i = 0; i < 4; ++i)
            snprintf(exprs[i], 160, "&kva__decode_kernel<%s, %d, %d, %s>", T, D, 1 + (i & 1),
                     i >= 2 ? "true" : "false");
    } else if (id->dtype == KVA_F32) {
        snprintf(exprs[0], 160, "&kva__prefill_f32_kernel<%d>", D);
    } else {
        snprintf(exprs[KVA__VMOD_PF_LARGE], 160, "&kva__prefill_kernel<%s, %d, %d, %d, 64, false>", T, D,
                 D <= 128 ? 2 : 1, D <= 128 ? 4 : 8);
        snprintf(exprs[KVA__VMOD_PF_SMALL], 160, "&kva__prefill_kernel<%s, %d, 1, 4, 64, false>", T, D);
        if (arch == 90)
            snprintf(exprs[KVA__VMOD_PF_HOPPER], 160, "&kva__prefill_kernel<%s, %d, 1, %d, 64, true>", T, D,
                     kva__prefill_wg_warps(D));
        if (arch == 90 && kva__variant_hopper_hooked())
            snprintf(exprs[KVA__VMOD_PF_TMA], 160, "&kva__prefill_hopper_kernel<%s, %d>", T, D);
        /* (the d128 layout's build with the turns, where the library's own calls take them --
         * unless the source's build has them already: the second would be the same kernel) */
        if (arch == 90 && kva__variant_hopper_hooked() && D == 128 && !own_turns)
            snprintf(exprs[KVA__VMOD_PF_TMA_TURNS], 160, "&kva__prefill_hopper_kernel<%s, %d, %d, 1>", T, D, D);
    }
}

static const char *kernel_file(const kva__vmod_id *id, int arch) {
    if (id->kind == KVA__VMOD_DECODE) return "decode_kernel.cuh";
    if (id->dtype == KVA_F32) return "prefill_f32.cu";
    /* prefill_hopper.cuh includes prefill_kernel.cuh: one program holds all four kernels */
    return arch == 90 && kva__variant_hopper_hooked() ? "prefill_hopper.cuh" : "prefill_kernel.cuh";
}

/* NVRTC options for an architecture; *ptx set when NVRTC cannot make SASS for it (then the
 * newest virtual architecture below it, JIT-compiled by the driver at load). */
static void nvrtc_options(int arch, char arch_opt[64], int *ptx) {
    int n = 0, found = 0, best = 0;
    *ptx = 0;
    if (nvrtcGetNumSupportedArchs(&n) == NVRTC_SUCCESS && n > 0 && n < 256) {
        int archs[256];
        if (nvrtcGetSupportedArchs(archs) == NVRTC_SUCCESS)
            for (int i = 0; i < n; ++i) {
                if (archs[i] == arch) found = 1;
                else if (archs[i] < arch && archs[i] > best) best = archs[i];
            }
    }
    if (found || best == 0) {
        snprintf(arch_opt, 64, "-arch=sm_%d%s", arch, arch == 90 ? "a" : "");
    } else {
        snprintf(arch_opt, 64, "-arch=compute_%d", best);
        *ptx = 1;
    }
}

static const char *const k_fixed_options[] = {"-std=c++17", "--use_fast_math", "-default-device"};
#define NUM_FIXED_OPTIONS 3

/* What the library contributes to every key: its version and the kernel sources it embeds.
 * Hashed once per process (~180 KB; a cached load should not pay it per module); threads that
 * race here compute the same value. */
static uint64_t library_hash(void) {
    static uint64_t cached;
    const uint64_t c = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
    if (c) return c;
    uint64_t h = 0xcbf29ce484222325ull;
    char v[64];
    snprintf(v, sizeof v, "kvattn %d.%d.%d", KVA_VERSION_MAJOR, KVA_VERSION_MINOR, KVA_VERSION_PATCH);
    h = kva__fnv1a64(h, v, strlen(v) + 1);
    for (int i = 0; i < kva__embedded_file_count; ++i) {
        h = kva__fnv1a64(h, kva__embedded_files[i].name, strlen(kva__embedded_files[i].name) + 1);
        h = kva__fnv1a64(h, kva__embedded_files[i].text, kva__embedded_files[i].size);
    }
    __atomic_store_n(&cached, h ? h : 1, __ATOMIC_RELEASE);
    return h ? h : 1;
}

/* The NVRTC program of a module: the build's settings, the modifier's source, the kernel header
 * (compile_module). Its text is part of the disk cache's key, so that editing a constant here
 * (as KVA__HP_LANE_RECORDS) cannot reuse a module compiled before. (The header shims and the
 * kernels' name expressions in compile_module are not hashed: a change there needs a new
 * library version, as a kernel header's does not -- those are hashed, library_hash.) */
#define KVA__PROGRAM_HEAD                                                                          \
    "#define KVA_SCORE_MOD_FN %s\n#define KVA__HP_CWG_D64 %d\n#define KVA__HP_QBUFS %d\n"             \
    "#define KVA__HP_ORING %d\n#define KVA__HP_ALIBI_TURNS %d\n#define KVA__HP_SMEM_RECORDS %d\n"      \
    "#define KVA__HP_LANE_RECORDS 0\n#define KVA__DECODE_PDL 1\n%s%s%s"                              \
    "#include \"cuda_common.cuh\"\n"                                                                 \
    "#include \"variant_prelude.cuh\"\n"                                                             \
    "#line 1 \"variant.cu\"\n%s\n#line 1 \"kvattn-kernels.cu\"\n#include \"%s\"\n"

void kva__variant_key(const char *source, const char *function, const kva__vmod_id *id, int arch,
                      uint64_t key[2]) {
    int maj = 0, min = 0;
    (void)nvrtcVersion(&maj, &min);
    char arch_opt[64];
    int ptx = 0;
    nvrtc_options(arch, arch_opt, &ptx);
    char head[512]; /* (room for the longest function name kva_variant_create takes, 200) */
    snprintf(head, sizeof head,
             "lib %016llx nvrtc %d.%d %s ptx %d kind %d dtype %d dim %d wg %d qb %d or %d at %d sr %d fn %s\n",
             (unsigned long long)library_hash(), maj, min, arch_opt, ptx, id->kind, (int)id->dtype, id->dim,
             kva__prefill_wg_warps(id->dim), kva__prefill_hp_qbufs(), kva__prefill_hp_oring(),
             kva__prefill_hp_alibi_turns(), kva__prefill_hp_smem_records(), function);
    /* two FNV-1a streams from different offset bases: 128 bits against accidental collisions
     * (the file also stores the key, so a colliding file name is a miss, not a wrong hit) */
    uint64_t h0 = 0xcbf29ce484222325ull, h1 = 0x84222325cbf29ce4ull;
    for (int i = 0; i < NUM_FIXED_OPTIONS; ++i) {
        h0 = kva__fnv1a64(h0, k_fixed_options[i], strlen(k_fixed_options[i]) + 1);
        h1 = kva__fnv1a64(h1, k_fixed_options[i], strlen(k_fixed_options[i]) + 1);
    }
    h0 = kva__fnv1a64(h0, head, strlen(head));
    h1 = kva__fnv1a64(h1, head, strlen(head));
    h0 = kva__fnv1a64(h0, KVA__PROGRAM_HEAD, sizeof KVA__PROGRAM_HEAD - 1);
    h1 = kva__fnv1a64(h1, KVA__PROGRAM_HEAD, sizeof KVA__PROGRAM_HEAD - 1);
    h0 = kva__fnv1a64(h0, source, strlen(source));
    h1 = kva__fnv1a64(h1 ^ 0x5bd1e995u, source, strlen(source));
    key[0] = h0;
    key[1] = h1;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* Compiles one module. On failure returns a status and a malloc'd message in *err (NVRTC's log
 * for a compile error); the thread-local error is not touched (this runs on worker threads). */
static kva_status compile_module(const char *source, const char *function, int arch, kva__vmod_image *img,
                                 char **err) {
    static const char stdint_shim[] = "#include \"rtc_shim.cuh\"\n";
    static const char stddef_shim[] = "/* NVRTC declares size_t itself */\n";
    /* prefill_kernels.h names CUtensorMap (the Hopper TMA kernel's argument block): the type,
     * as the driver header defines it, without the driver header */
    static const char cuda_h_shim[] = "#ifndef KVA__RTC_CUDA_H\n#define KVA__RTC_CUDA_H\n"
                                      "typedef struct CUtensorMap_st { alignas(128) unsigned long long "
                                      "opaque[16]; } CUtensorMap;\n#endif\n";
    const int nh = kva__embedded_file_count + 3;
    const char **hdr = (const char **)malloc(sizeof(char *) * (size_t)nh);
    const char **names = (const char **)malloc(sizeof(char *) * (size_t)nh);
    /* (the format's text, plus the defines it inserts and the kernel header's name: < 256 bytes) */
    const size_t prog_size = strlen(source) + strlen(function) + sizeof KVA__PROGRAM_HEAD + 256;
    char *prog = (char *)malloc(prog_size);
    kva_status st = KVA_OK;
    nvrtcProgram p = NULL;
    *err = NULL;
    if (!hdr || !names || !prog) {
        st = KVA_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (int i = 0; i < kva__embedded_file_count; ++i) {
        hdr[i] = kva__embedded_files[i].text;
        names[i] = kva__embedded_files[i].name;
    }
    hdr[nh - 3] = stdint_shim;
    names[nh - 3] = "stdint.h";
    hdr[nh - 2] = stddef_shim;
    names[nh - 2] = "stddef.h";
    hdr[nh - 1] = cuda_h_shim;
    names[nh - 1] = "cuda.h";
    /* KVA__FN_IS_KVA_ALIBI: the modifier is the built-in ALiBi function itself, which the kernels
     * may then compute natively (with its KVA_VARIANT_ALIBI_SLOPES: see variant_alibi.cuh) */
    /* KVA__VARIANT_FAST_TANH: kva_tanhf is the hardware tanh of the built-in soft cap in the
     * 16-bit prefill kernels (variant_prelude.cuh) */
    /* KVA__HP_LANE_RECORDS 0: variant builds fetch the record after next as four loads whatever the
     * library's kernels do (prefill_kernels.h): paired on the H200 (2026-11-30, bench/NOTES.md
     * v6.41), lane records made the soft-cap snippet 2-3% and ALiBi ~1% slower at 16k causal for
     * under 1% at 32 x 512 causal (the records' place in the workspace is the same either way) */
    /* KVA__DECODE_PDL 1: decode kernels always hold the programmatic-launch wait (harmless when
     * launched without the attribute), whatever the header's default: variant_load.cu lets them
     * launch as dependents on sm_90+ */
    const int fast_tanh = img->id.kind == KVA__VMOD_PREFILL && img->id.dtype != KVA_F32;
    /* (a measurement build's modules record the Hopper kernel's trace as its own kernels do:
     * bench/hopper_trace --variant; such a library keeps no disk cache, variant_load.cu) */
#ifdef KVA__HP_TRACE
    const char *trace = "#define KVA__HP_TRACE 1\n";
#else
    const char *trace = "";
#endif
    const int written = snprintf(prog, prog_size, KVA__PROGRAM_HEAD, function, kva__prefill_wg_warps(64) / 4,
                                 kva__prefill_hp_qbufs(), kva__prefill_hp_oring(), kva__prefill_hp_alibi_turns(),
                                 kva__prefill_hp_smem_records(),
                                 strcmp(function, "kva_alibi") == 0 ? "#define KVA__FN_IS_KVA_ALIBI 1\n" : "",
                                 fast_tanh ? "#define KVA__VARIANT_FAST_TANH 1\n" : "", trace, source,
                                 kernel_file(&img->id, arch));
    if (written < 0 || (size_t)written >= prog_size) { /* (prog_size's margin outgrown: a bug here) */
        *err = strdup("the NVRTC program did not fit its buffer (variant_compile.c)");
        st = KVA_ERR_BAD_STATE;
        goto done;
    }
    if (nvrtcCreateProgram(&p, prog, "variant.cu", nh, hdr, names) != NVRTC_SUCCESS) {
        st = KVA_ERR_OUT_OF_MEMORY;
        goto done;
    }
    char exprs[KVA__VMOD_MAX_KERNELS][160];
    /* (a source that names KVA_VARIANT_PINGPONG in a #define -- or mentions it in a comment, which
     * then only costs its short calls the turns -- or native ALiBi built with them) */
    const bool own_turns = strstr(source, "KVA_VARIANT_PINGPONG") != NULL ||
                           (strcmp(function, "kva_alibi") == 0 && kva__prefill_hp_alibi_turns());
    kernel_exprs(&img->id, arch, own_turns, exprs);
    for (int i = 0; i < KVA__VMOD_MAX_KERNELS; ++i)
        if (exprs[i][0]) nvrtcAddNameExpression(p, exprs[i]);
    char arch_opt[64];
    int ptx = 0;
    nvrtc_options(arch, arch_opt, &ptx);
    const char *opts[NUM_FIXED_OPTIONS + 1];
    for (int i = 0; i < NUM_FIXED_OPTIONS; ++i) opts[i] = k_fixed_options[i];
    opts[NUM_FIXED_OPTIONS] = arch_opt;
    const nvrtcResult r = nvrtcCompileProgram(p, NUM_FIXED_OPTIONS + 1, opts);
    if (r != NVRTC_SUCCESS) {
        size_t n = 0;
        char *log = NULL;
        if (nvrtcGetProgramLogSize(p, &n) == NVRTC_SUCCESS && (log = (char *)malloc(n + 1)) != NULL &&
            nvrtcGetProgramLog(p, log) == NVRTC_SUCCESS)
            log[n] = '\0';
        *err = log;
        st = r == NVRTC_ERROR_COMPILATION ? KVA_ERR_INVALID_ARG : KVA_ERR_DEVICE;
        if (!log) *err = NULL;
        if (r != NVRTC_ERROR_COMPILATION && !*err) {
            *err = (char *)malloc(128);
            if (*err) snprintf(*err, 128, "nvrtcCompileProgram: %s", nvrtcGetErrorString(r));
        }
        goto done;
    }
    for (int i = 0; i < KVA__VMOD_MAX_KERNELS; ++i) {
        if (!exprs[i][0]) continue;
        const char *lowered = NULL;
        if (nvrtcGetLoweredName(p, exprs[i], &lowered) != NVRTC_SUCCESS || !lowered ||
            !(img->names[i] = strdup(lowered))) {
            st = KVA_ERR_OUT_OF_MEMORY;
            goto done;
        }
    }
    size_t size = 0;
    nvrtcResult gr = ptx ? nvrtcGetPTXSize(p, &size) : nvrtcGetCUBINSize(p, &size);
    if (gr != NVRTC_SUCCESS || size == 0 || !(img->code = (unsigned char *)malloc(size + 1))) {
        st = KVA_ERR_OUT_OF_MEMORY;
        goto done;
    }
    gr = ptx ? nvrtcGetPTX(p, (char *)img->code) : nvrtcGetCUBIN(p, (char *)img->code);
    if (gr != NVRTC_SUCCESS) {
        st = KVA_ERR_DEVICE;
        goto done;
    }
    img->code[size] = 0;
    /* PTX is NUL-terminated by NVRTC; its size counts the NUL, the cache stores the text */
    img->code_size = ptx ? strlen((const char *)img->code) : size;
    img->is_ptx = ptx;
done:
    if (p) nvrtcDestroyProgram(&p);
    free(hdr);
    free(names);
    free(prog);
    return st;
}

void kva__vmod_images_free(kva__vmod_image *images, int n) {
    for (int m = 0; m < n; ++m) {
        free(images[m].code);
        images[m].code = NULL;
        for (int i = 0; i < KVA__VMOD_MAX_KERNELS; ++i) {
            free(images[m].names[i]);
            images[m].names[i] = NULL;
        }
    }
}

typedef struct compile_job {
    const char *source, *function;
    int arch;
    const char *cache_dir;
    kva__vmod_image *images;
    kva_status *st;
    char **errs;
} compile_job;

/* Module m: compiled (and stored on disk) unless the disk cache held it. */
static void compile_one(void *arg, int64_t m, int thread) {
    (void)thread;
    const compile_job *J = (const compile_job *)arg;
    if (J->images[m].from_disk) return;
    J->st[m] = compile_module(J->source, J->function, J->arch, &J->images[m], &J->errs[m]);
    if (J->st[m] == KVA_OK && J->cache_dir) (void)kva__vcache_store(J->cache_dir, &J->images[m]);
}

kva_status kva__variant_build(const char *api, const char *source, const char *function,
                              const kva__vmod_id *ids, int n, int arch, const char *cache_dir,
                              kva__vmod_image *images, kva_variant_stats *stats) {
    const char *missing = kva__nvrtc_missing();
    if (missing)
        return kva__fail(KVA_ERR_UNSUPPORTED, "%s: variants are compiled with NVRTC, and %s", api, missing);
    const double t0 = now_ms();
    kva_status *st = (kva_status *)calloc((size_t)(n > 0 ? n : 1), sizeof *st);
    char **errs = (char **)calloc((size_t)(n > 0 ? n : 1), sizeof *errs);
    if (!st || !errs) {
        free(st);
        free(errs);
        return kva__fail(KVA_ERR_OUT_OF_MEMORY, "%s: out of memory", api);
    }
    int hits = 0, compiled = 0;
    for (int m = 0; m < n; ++m) {
        memset(&images[m], 0, sizeof images[m]);
        images[m].id = ids[m];
        kva__variant_key(source, function, &ids[m], arch, images[m].key);
        if (cache_dir && kva__vcache_load(cache_dir, &images[m])) ++hits;
    }
    /* NVRTC is thread-safe across programs: the misses compile on the process's cores. */
    compile_job J = {source, function, arch, cache_dir, images, st, errs};
    kva__pool *pool = NULL;
    kva__pool_for(&pool, kva__cpu_count(), n, 1, compile_one, &J);
    kva__pool_destroy(pool);
    for (int m = 0; m < n; ++m) compiled += !images[m].from_disk && st[m] == KVA_OK;
    const double t1 = now_ms();
    kva_status result = KVA_OK;
    for (int m = 0; m < n && result == KVA_OK; ++m) {
        if (st[m] == KVA_OK) continue;
        result = st[m];
        if (st[m] == KVA_ERR_INVALID_ARG)
            kva__fail(st[m], "%s: compiling variant function '%s' failed (NVRTC log):\n%s", api, function,
                      errs[m] ? errs[m] : "(no log)");
        else
            kva__fail(st[m], "%s: building variant function '%s' for %s d%d %s failed: %s", api, function,
                      kva_dtype_name(ids[m].dtype), ids[m].dim, ids[m].kind ? "prefill" : "decode",
                      errs[m] ? errs[m] : "out of memory");
    }
    for (int m = 0; m < n; ++m) free(errs[m]);
    free(errs);
    free(st);
    if (result != KVA_OK) {
        kva__vmod_images_free(images, n);
        return result;
    }
    if (stats) {
        stats->modules = n;
        stats->compiled = compiled;
        stats->disk_hits = hits;
        stats->compile_ms = compiled ? t1 - t0 : 0.0;
    }
    return KVA_OK;
}
