/*
 * variant.h -- internal side of kva_variant (kvattn.h): a variant is a set of modules, one per
 * (kind, dtype, built head dim), each the decode or prefill kernels of that shape compiled by
 * NVRTC with the caller's score modifier inlined (cuda_common.cuh, KVA_SCORE_MOD).
 *
 * Three layers, so the compiler and the cache are testable without a GPU:
 *   variant_compile.c  module list, NVRTC program from the embedded kernel sources, cache keys,
 *                      kva__variant_build (cache or compile, for an explicit architecture);
 *   variant_cache.c    the disk cache: one checksummed file per module, written atomically;
 *   variant_load.cu    kva__cuda_variant_create: loads the modules into the context
 *                      (cudaLibraryLoadData, no libcuda link), the context's module cache,
 *                      and the lookups the launchers use.
 * C and C++ (included by .c and .cu files).
 */
#ifndef KVA_CUDA_VARIANT_H
#define KVA_CUDA_VARIANT_H

#include "kvattn.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { KVA__VMOD_DECODE = 0, KVA__VMOD_PREFILL = 1 };

/* The head dim the CUDA kernels (built-in and variant modules, decode and prefill) are built
 * for that serves `head_dim`: the next of 64, 128, 256 for a multiple of 16 in 32..256, else 0.
 * Dims in between run with zero-filled loads past the real dim and stores only inside it; the
 * scale uses the real dim (bench/NOTES.md, "CUDA decode: head dims, groups, global rowmax"). */
static inline int kva__built_head_dim(int head_dim) {
    if (head_dim < 32 || head_dim > 256 || head_dim % 16 != 0) return 0;
    return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}

/* Warps of the wgmma prefill kernel built for `built_dim` (prefill_launch.cu,
 * KVA__PREFILL_WG_WARPS): 4 per consumer warpgroup of the warp-specialised Hopper kernel (12 at
 * d64, 8 elsewhere), so a variant's build of it matches the library's. */
int kva__prefill_wg_warps(int built_dim);
/* Q buffers of the library's warp-specialised Hopper kernel (KVA__HP_QBUFS, prefill_kernels.h), which
 * a variant's build of it must match: it is launched with the library's shared-memory size. */
int kva__prefill_hp_qbufs(void);
/* Whether it stages O in its own rings (KVA__HP_ORING, prefill_kernels.h): likewise. */
int kva__prefill_hp_oring(void);
/* Whether it passes work records through shared memory (KVA__HP_SMEM_RECORDS): likewise. */
int kva__prefill_hp_smem_records(void);
/* Whether its native ALiBi build takes the turns (KVA__HP_ALIBI_TURNS): likewise. */
int kva__prefill_hp_alibi_turns(void);

/* Kernels per module: decode (nt - 1) + 2 * global_rowmax; prefill f16/bf16: the 128-row
 * mma.sync kernel, the 64-row one, the wgmma one (sm_90a only; 192 rows at d64) and the warp-specialised
 * TMA kernel (sm_90a, once prefill_hopper.cuh has the hook, KVA__HAS_SCORE_MOD: kva__variant_hopper_hooked),
 * at d128 twice: as the source asks (KVA_VARIANT_PINGPONG: with the consumers' turns, else native
 * ALiBi's KVA__HP_ALIBI_TURNS or none) and with the turns, so that a call picks between them by the
 * library's rule (prefill_launch.cu, hopper_fn); prefill f32: one. */
#define KVA__VMOD_MAX_KERNELS 5
#define KVA__VMOD_PF_LARGE 0
#define KVA__VMOD_PF_SMALL 1
#define KVA__VMOD_PF_HOPPER 2
#define KVA__VMOD_PF_TMA 3
#define KVA__VMOD_PF_TMA_TURNS 4

/* Whether the embedded prefill_hopper.cuh calls the score-modifier hook. Until it does, variants
 * leave its kernel out and run the wgmma kernel where the built-in prefill would run it (a
 * variant build of an unhooked kernel would silently ignore the modifier). */
bool kva__variant_hopper_hooked(void);

typedef struct kva__vmod_id {
    int kind;        /* KVA__VMOD_DECODE or KVA__VMOD_PREFILL */
    kva_dtype dtype;
    int dim;         /* built head dim: 64, 128, 256 */
} kva__vmod_id;

/* A compiled module: CUBIN (or PTX when NVRTC cannot target the device) and the lowered names
 * of its kernels, slot by slot (NULL: the slot has no kernel on this architecture). */
typedef struct kva__vmod_image {
    kva__vmod_id id;
    uint64_t key[2];
    unsigned char *code;
    size_t code_size;
    int is_ptx;
    char *names[KVA__VMOD_MAX_KERNELS];
    int from_disk;   /* read from the disk cache rather than compiled */
} kva__vmod_image;

/* The modules `options` asks for (NULL: all), into ids[capacity]; returns their count. */
int kva__variant_modules(const kva_variant_options *options, kva__vmod_id *ids, int capacity);

/* The cache key of a module: source, function, module, architecture, compiler and library. */
void kva__variant_key(const char *source, const char *function, const kva__vmod_id *id, int arch,
                      uint64_t key[2]);

/* The disk cache directory ($XDG_CACHE_HOME/kvattn, else $HOME/.cache/kvattn) into buf; false
 * when neither variable is set (no disk cache). */
bool kva__variant_cache_dir(char *buf, size_t size);

/* Gets the modules ids[n] for architecture `arch` (major * 10 + minor; 90 means sm_90a): each
 * from cache_dir (NULL: no disk cache) if a valid entry is there, else compiled by NVRTC (in
 * parallel) and written back. On failure (a compile error: NVRTC's log in kva_last_error(),
 * prefixed by `api`) nothing is returned; cache entries written for other modules stay (they
 * are valid). images[n] are freed with kva__vmod_images_free. stats may be NULL. */
kva_status kva__variant_build(const char *api, const char *source, const char *function,
                              const kva__vmod_id *ids, int n, int arch, const char *cache_dir,
                              kva__vmod_image *images, kva_variant_stats *stats);
void kva__vmod_images_free(kva__vmod_image *images, int n);

/* Disk cache (variant_cache.c). load: 1 and *img filled when a valid entry for img->key exists;
 * 0 when there is none or it is corrupt or stale (the caller rebuilds and stores over it). */
int kva__vcache_load(const char *dir, kva__vmod_image *img);
/* Atomic write (temporary file + rename); 0 on success, -1 on failure (ignored by callers). */
int kva__vcache_store(const char *dir, const kva__vmod_image *img);
/* The path of a module's cache file into buf (tests corrupt it). */
void kva__vcache_path(const char *dir, const uint64_t key[2], char *buf, size_t size);

/* FNV-1a over bytes, continuing from h (tests and keys). */
uint64_t kva__fnv1a64(uint64_t h, const void *data, size_t n);

/* The embedded kernel sources (generated at build time from src/cuda, include/, src/plan). */
typedef struct kva__embedded_file {
    const char *name;  /* the #include name the kernel sources use */
    const char *text;
    size_t size;
} kva__embedded_file;
extern const kva__embedded_file kva__embedded_files[];
extern const int kva__embedded_file_count;

/* A loaded module's kernels (variant_load.cu). */
typedef struct kva__vmod_loaded {
    kva__vmod_id id;
    uint64_t key[2];
    void *library;                                 /* cudaLibrary_t */
    const void *fn[KVA__VMOD_MAX_KERNELS];         /* cudaKernel_t, NULL where none */
    int blocks_per_sm[KVA__VMOD_MAX_KERNELS];      /* decode: resident blocks (persistent grid) */
    int runs_sm90[KVA__VMOD_MAX_KERNELS];          /* its running code is sm_90+ (holds kva__pdl_wait) */
} kva__vmod_loaded;

struct kva_variant {
    kva_context *ctx;      /* kept alive until kva_variant_destroy */
    int device_id;
    int num_modules;
    const kva__vmod_loaded **modules; /* owned by the context's module cache */
    kva_variant_stats stats;
};

/* The variant's decode kernel for (dtype, built dim, nt, gr), or NULL (not compiled). */
const void *kva__variant_decode_fn(const kva_variant *v, kva_dtype dtype, int built_dim, int nt, int gr,
                                   int *blocks_per_sm, int *runs_sm90);
/* The variant's prefill kernel for (dtype, dim, slot KVA__VMOD_PF_*), or NULL. */
const void *kva__variant_prefill_fn(const kva_variant *v, kva_dtype dtype, int dim, int slot);

#ifdef __cplusplus
}
#endif
#endif /* KVA_CUDA_VARIANT_H */
