/*
 * internal.h -- what every part of the library shares but users never see: the context
 * struct, error reporting and small integer helpers.
 */
#ifndef KVA_INTERNAL_H
#define KVA_INTERNAL_H

#include "kvattn.h"
#include "thread_pool.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kva_context {
    kva_device_type device;
    int device_id;
    int num_threads;          /* CPU workers for later calls (>= 1) */
    int num_cores;            /* cores the creating thread could run on (kva__cpu_count), fixed:
                                 the CPU split policy, and so workspace sizes, depend on it */
    void *stream;             /* cudaStream_t (NULL = legacy default stream) */

    /* CPU: per-thread scratch owned by the context so runs never allocate. */
    unsigned char *cpu_scratch;
    size_t cpu_scratch_per_thread;
    int cpu_scratch_threads;
    const struct kva__cpu_kernels *cpu_kernels; /* the ISA variant, chosen at creation */
    struct kva__pool *cpu_pool; /* worker threads (thread_pool.h), started by the first threaded run */

    /* CUDA: device facts read once at creation, and backend-private state. */
    int num_sms;
    size_t l2_bytes;
    size_t total_memory;
    char name[128];
    void *cuda_private;       /* owned by src/cuda (events etc.) */

    /* Caches made with this context still alive: kva_context_destroy defers the free until the
     * last of them is destroyed, since each frees its pool through the context. */
    int live_caches;
    int live_variants;        /* the same for variants (their kernels live in the context) */
    bool destroyed;
};

/* A cache of ctx is gone; frees ctx if kva_context_destroy already ran and it was the last. */
void kva__context_cache_released(kva_context *ctx);
/* The same for a variant of ctx (kva_variant_destroy). */
void kva__context_variant_released(kva_context *ctx);

/* Records a formatted message as this thread's last error and returns status, so failures read
 * `return kva__fail(KVA_ERR_BAD_SHAPE, "q.stride_head (%lld) ...", ...);` */
kva_status kva__fail(kva_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Propagates a failing status (the callee already set the message). */
#define KVA_TRY(expr)                                                                          \
    do {                                                                                       \
        kva_status kva__st = (expr);                                                           \
        if (kva__st != KVA_OK) return kva__st;                                                 \
    } while (0)

/* The public call being served on this thread, so checks shared by several entry points name
 * the call the caller wrote ("kva_decode_run: params is NULL"), not an internal helper. Public
 * entry points whose checks live in shared helpers set it first (KVA_API). */
void kva__set_api(const char *name);
const char *kva__api(void);
#define KVA_API(name) kva__set_api(name)
/* __func__ of a public function, or the current public call inside an internal kva__ helper. */
const char *kva__caller(const char *func);

#define KVA_CHECK_NULL(p)                                                                      \
    do {                                                                                       \
        if ((p) == NULL)                                                                       \
            return kva__fail(KVA_ERR_INVALID_ARG, "%s: %s is NULL", kva__caller(__func__), #p); \
    } while (0)

/* Largest page size any call accepts (documented in kvattn.h). */
#define KVA__MAX_PAGE_SIZE 65536

/* The soft cap a kernel applies: 0 (none) for caps <= 0 and for +inf, which caps nothing. */
static inline float kva__soft_cap(float cap) { return cap > 0 && cap < INFINITY ? cap : 0.0f; }

static inline int64_t kva__ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int32_t kva__min32(int32_t a, int32_t b) { return a < b ? a : b; }
static inline int32_t kva__max32(int32_t a, int32_t b) { return a > b ? a : b; }
static inline size_t kva__align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* True if dtype is one of the three the library knows. */
static inline bool kva__dtype_valid(kva_dtype d) {
    return d == KVA_F32 || d == KVA_F16 || d == KVA_BF16;
}

/* Number of CPU cores available to this process (>= 1). */
int kva__cpu_count(void);

/* CPU device memory (host_memory.c): 64-byte aligned; blocks of KVA__HUGE_PAGE_BYTES or more
 * are aligned to it and advised for transparent huge pages (Linux; KVA_HUGE_PAGES=0: not).
 * Freed with free(). NULL when out of memory. */
#define KVA__HUGE_PAGE_BYTES ((size_t)2 << 20)
void *kva__host_memory_alloc(size_t bytes);
/* madvise(MADV_HUGEPAGE) on the whole 2 MB frames inside [p, p + bytes): 0, or -1 when there is
 * none, the call failed or the platform has no such advice (harmless: 4 KB pages stay). */
int kva__advise_huge_pages(void *p, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif /* KVA_INTERNAL_H */
