/* context.c -- contexts, device facts and the memory helpers of both devices. */
#define _GNU_SOURCE
#include "internal.h"

#include "../cpu/cpu_backend.h"
#include "../cpu/cpu_isa.h"
#include "../cuda/cuda_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>

int kva__cpu_count(void) {
#if defined(__linux__)
    /* the cores this thread may run on (taskset, a container's cpuset), not the machine's: more
     * workers than those only queue behind each other */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= 1) return CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

static void cpu_model_name(char *out, size_t size) {
    snprintf(out, size, "CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *colon = strchr(line, ':');
            if (colon) {
                colon += 2;
                colon[strcspn(colon, "\n")] = 0;
                snprintf(out, size, "%s", colon);
            }
            break;
        }
    }
    fclose(f);
}

/* (Re)allocates per-thread scratch for n threads. Not on any run path. `api` and `arg` name the
 * public call and where n came from, for the message. */
static kva_status ensure_cpu_scratch(kva_context *ctx, int n, const char *api, const char *arg) {
    if (ctx->cpu_scratch && ctx->cpu_scratch_threads >= n) return KVA_OK;
    size_t per = kva__align_up(kva__cpu_scratch_bytes_per_thread(), 64);
    void *p = NULL;
    if (posix_memalign(&p, 64, per * (size_t)n) != 0)
        return kva__fail(KVA_ERR_OUT_OF_MEMORY,
                         "%s: cannot allocate the CPU scratch of %d threads (%s): %zu bytes, %zu "
                         "per thread",
                         api, n, arg, per * (size_t)n, per);
    free(ctx->cpu_scratch);
    ctx->cpu_scratch = p;
    ctx->cpu_scratch_per_thread = per;
    ctx->cpu_scratch_threads = n;
    return KVA_OK;
}

kva_status kva_context_create(kva_device_type device, int device_id, kva_context **out) {
    KVA_CHECK_NULL(out);
    *out = NULL;
    if (device != KVA_DEVICE_CPU && device != KVA_DEVICE_CUDA)
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_context_create: unknown device %d", (int)device);
    kva_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return kva__fail(KVA_ERR_OUT_OF_MEMORY, "kva_context_create: out of memory");
    ctx->device = device;
    ctx->device_id = device_id;
    ctx->num_cores = kva__cpu_count();
    ctx->num_threads = ctx->num_cores;
    kva_status st;
    if (device == KVA_DEVICE_CPU) {
        /* CUDA contexts never run the CPU kernels, so only CPU contexts choose a variant (and
         * only they can fail on a bad KVA_CPU_ISA). */
        st = kva__cpu_kernels_select(&ctx->cpu_kernels);
        if (st != KVA_OK) {
            free(ctx);
            return st;
        }
        cpu_model_name(ctx->name, sizeof ctx->name);
        ctx->num_sms = ctx->num_threads;
        st = ensure_cpu_scratch(ctx, ctx->num_threads, "kva_context_create", "the core count");
    } else {
        st = kva__cuda_context_init(ctx);
    }
    if (st != KVA_OK) {
        free(ctx->cpu_scratch);
        free(ctx);
        return st;
    }
    *out = ctx;
    return KVA_OK;
}

static void context_free(kva_context *ctx) {
    if (ctx->device == KVA_DEVICE_CUDA) kva__cuda_context_destroy(ctx);
    kva__pool_destroy(ctx->cpu_pool);
    free(ctx->cpu_scratch);
    free(ctx);
}

void kva_context_destroy(kva_context *ctx) {
    if (!ctx) return;
    if (ctx->live_caches > 0 || ctx->live_variants > 0) {
        ctx->destroyed = true; /* the last kva_cache_destroy / kva_variant_destroy frees it */
        return;
    }
    context_free(ctx);
}

void kva__context_cache_released(kva_context *ctx) {
    if (--ctx->live_caches == 0 && ctx->live_variants == 0 && ctx->destroyed) context_free(ctx);
}

void kva__context_variant_released(kva_context *ctx) {
    if (--ctx->live_variants == 0 && ctx->live_caches == 0 && ctx->destroyed) context_free(ctx);
}

kva_device_type kva_context_device(const kva_context *ctx) {
    return ctx ? ctx->device : KVA_DEVICE_CPU;
}

kva_status kva_context_set_threads(kva_context *ctx, int num_threads) {
    KVA_CHECK_NULL(ctx);
    if (num_threads < 0)
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_context_set_threads: num_threads = %d < 0",
                         num_threads);
    int n = num_threads == 0 ? ctx->num_cores : num_threads;
    if (ctx->device == KVA_DEVICE_CPU) {
        KVA_TRY(ensure_cpu_scratch(ctx, n, "kva_context_set_threads", "num_threads"));
        ctx->num_sms = n;
    }
    if (n != ctx->num_threads) { /* the next threaded run starts as many workers as it needs */
        kva__pool_destroy(ctx->cpu_pool);
        ctx->cpu_pool = NULL;
    }
    ctx->num_threads = n;
    return KVA_OK;
}

int kva_context_threads(const kva_context *ctx) { return ctx ? ctx->num_threads : 0; }

const char *kva_cpu_variant(const kva_context *ctx) {
    return ctx && ctx->cpu_kernels ? ctx->cpu_kernels->name : NULL;
}

kva_status kva_context_set_stream(kva_context *ctx, void *cuda_stream) {
    KVA_CHECK_NULL(ctx);
    ctx->stream = cuda_stream;
    return KVA_OK;
}

int kva_cuda_available(void) { return kva__cuda_device_count() > 0; }

kva_status kva_context_info(const kva_context *ctx, kva_device_info *info) {
    KVA_CHECK_NULL(ctx);
    KVA_CHECK_NULL(info);
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", ctx->name);
    info->num_sms = ctx->num_sms;
    info->l2_bytes = ctx->l2_bytes;
    info->total_memory = ctx->total_memory;
    if (ctx->device == KVA_DEVICE_CUDA) return kva__cuda_free_memory((kva_context *)ctx, &info->free_memory);
    return KVA_OK;
}

/* Rounding up to the 64-byte alignment must not wrap (SIZE_MAX would become 0), and no object
 * may exceed PTRDIFF_MAX anyway. */
#define KVA__MAX_ALLOC ((size_t)PTRDIFF_MAX - 63)

kva_status kva_malloc(kva_context *ctx, size_t bytes, void **ptr) {
    KVA_CHECK_NULL(ctx);
    KVA_CHECK_NULL(ptr);
    *ptr = NULL;
    if (bytes > KVA__MAX_ALLOC)
        return kva__fail(KVA_ERR_OUT_OF_MEMORY, "kva_malloc: bytes = %zu is too large", bytes);
    if (ctx->device == KVA_DEVICE_CUDA) return kva__cuda_malloc(ctx, bytes, ptr);
    /* K/V pools come from here: large blocks get huge pages (host_memory.c says why) */
    if ((*ptr = kva__host_memory_alloc(bytes)) == NULL)
        return kva__fail(KVA_ERR_OUT_OF_MEMORY, "kva_malloc: cannot allocate %zu bytes", bytes);
    return KVA_OK;
}

void kva_free(kva_context *ctx, void *ptr) {
    if (!ctx || !ptr) return;
    if (ctx->device == KVA_DEVICE_CUDA)
        kva__cuda_free(ctx, ptr);
    else
        free(ptr);
}

kva_status kva_host_alloc(kva_context *ctx, size_t bytes, void **ptr) {
    KVA_CHECK_NULL(ctx);
    KVA_CHECK_NULL(ptr);
    *ptr = NULL;
    if (bytes > KVA__MAX_ALLOC)
        return kva__fail(KVA_ERR_OUT_OF_MEMORY, "kva_host_alloc: bytes = %zu is too large", bytes);
    if (ctx->device == KVA_DEVICE_CUDA) return kva__cuda_host_alloc(ctx, bytes, ptr);
    if (posix_memalign(ptr, 64, bytes ? kva__align_up(bytes, 64) : 64) != 0) {
        *ptr = NULL;
        return kva__fail(KVA_ERR_OUT_OF_MEMORY, "kva_host_alloc: cannot allocate %zu bytes", bytes);
    }
    return KVA_OK;
}

void kva_host_free(kva_context *ctx, void *ptr) {
    if (!ctx || !ptr) return;
    if (ctx->device == KVA_DEVICE_CUDA)
        kva__cuda_host_free(ctx, ptr);
    else
        free(ptr);
}

kva_status kva_memcpy(kva_context *ctx, void *dst, const void *src, size_t bytes,
                      kva_copy_kind kind) {
    KVA_CHECK_NULL(ctx);
    /* (an unknown kind is refused even for no bytes: a caller's bug, whatever the size) */
    if (kind < KVA_COPY_HOST_TO_DEVICE || kind > KVA_COPY_DEVICE_TO_DEVICE)
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_memcpy: unknown copy kind %d", (int)kind);
    if (bytes == 0) return KVA_OK;
    KVA_CHECK_NULL(dst);
    KVA_CHECK_NULL(src);
    if (ctx->device == KVA_DEVICE_CUDA) return kva__cuda_memcpy(ctx, dst, src, bytes, kind);
    memmove(dst, src, bytes);
    return KVA_OK;
}

kva_status kva_synchronize(kva_context *ctx) {
    KVA_CHECK_NULL(ctx);
    if (ctx->device == KVA_DEVICE_CUDA) return kva__cuda_synchronize(ctx);
    return KVA_OK;
}
