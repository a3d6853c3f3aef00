/*
 * variant_load.cu -- kva__cuda_variant_create: a variant's modules for the context's device,
 * from the context's module cache, else built (variant_compile.c: disk cache or NVRTC) and
 * loaded with the runtime's library API (cudaLibraryLoadData + cudaLibraryGetKernel: no libcuda
 * link, and the kernel handles launch through cudaLaunchKernel like the library's own kernels).
 * Loading also prepares each kernel as context creation prepares the built-in ones (shared-memory
 * opt-in, which makes the runtime load it into the device now -- never lazily inside a run or a
 * graph capture -- and the decode kernels' occupancy for the persistent grid).
 *
 * The context keeps every module it loaded until it is destroyed (kva__cuda_private.vmods), keyed
 * like the disk cache: a second variant with the same source and options costs a lookup. A
 * failing create loads nothing into the cache: its modules are unloaded before it returns.
 */
#include "cuda_common.cuh"
#include "decode_kernels.h"
#include "prefill_kernels.h"
#include "variant.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* Dynamic shared memory and threads of a module's kernel slot (the built-in kernel's geometry:
 * a variant kernel is the same template), or 0 when the slot has none. */
static int slot_smem(const kva__vmod_id *id, int slot, int *threads) {
    *threads = 0;
    if (id->kind == KVA__VMOD_DECODE) {
        kva__decode_choice ch;
        const int group = (slot & 1) ? 16 : 1; /* nt = 2 serves groups of 9..16 */
        if (!kva__decode_kernel_for(NULL, id->dtype, id->dim, group, slot >> 1, &ch)) return 0;
        *threads = KVA__DECODE_THREADS;
        return ch.smem;
    }
    if (slot == KVA__VMOD_PF_TMA || slot == KVA__VMOD_PF_TMA_TURNS) {
        int smem = 0, rows = 0, block_n = 0;
        const void *fn = id->dtype == KVA_BF16   ? kva__prefill_hopper_bf16(id->dim, 0, 0, &smem, threads, &rows, &block_n)
                         : id->dtype == KVA_F16 ? kva__prefill_hopper_f16(id->dim, 0, 0, &smem, threads, &rows, &block_n)
                                                : NULL;
        return fn ? smem : 0;
    }
    const int rows = slot == KVA__VMOD_PF_LARGE ? KVA__PREFILL_ROWS_LARGE
                     : slot == KVA__VMOD_PF_SMALL ? KVA__PREFILL_ROWS_SMALL
                                                  : KVA__PREFILL_ROWS_HOPPER;
    int smem = 0;
    const void *fn = id->dtype == KVA_F32    ? (slot == 0 ? kva__prefill_f32(id->dim, rows, &smem, threads) : NULL)
                     : id->dtype == KVA_BF16 ? kva__prefill_bf16(id->dim, rows, &smem, threads)
                                             : kva__prefill_f16(id->dim, rows, &smem, threads);
    return fn ? smem : 0;
}

static void unload(kva__vmod_loaded *m) {
    if (m && m->library) (void)cudaLibraryUnload((cudaLibrary_t)m->library);
    free(m);
}

/* Loads one image and prepares its kernels. On failure returns the status (message set). */
static kva_status load_module(const char *api, const kva__cuda_private *priv, const kva__vmod_image *img,
                              kva__vmod_loaded **out) {
    kva__vmod_loaded *m = (kva__vmod_loaded *)calloc(1, sizeof *m);
    if (!m) return kva__fail(KVA_ERR_OUT_OF_MEMORY, "%s: out of memory", api);
    m->id = img->id;
    m->key[0] = img->key[0];
    m->key[1] = img->key[1];
    cudaLibrary_t lib = NULL;
    cudaError_t e = cudaLibraryLoadData(&lib, img->code, NULL, NULL, 0, NULL, NULL, 0);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        free(m);
        return kva__fail(KVA_ERR_DEVICE, "%s: loading the variant's %s %s d%d module (%s, %zu bytes) failed: %s", api,
                         img->id.kind ? "prefill" : "decode", kva_dtype_name(img->id.dtype), img->id.dim,
                         img->is_ptx ? "PTX" : "CUBIN", img->code_size, cudaGetErrorString(e));
    }
    m->library = (void *)lib;
    for (int s = 0; s < KVA__VMOD_MAX_KERNELS; ++s) {
        if (!img->names[s]) continue;
        int threads = 0;
        const int smem = slot_smem(&img->id, s, &threads);
        if (smem == 0) continue; /* the library has no such kernel (cannot happen: same tables) */
        cudaKernel_t k = NULL;
        e = cudaLibraryGetKernel(&k, lib, img->names[s]);
        if (e == cudaSuccess && smem <= priv->smem_optin)
            e = cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        int blocks = 0;
        if (e == cudaSuccess && smem <= priv->smem_optin)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (const void *)k, threads, (size_t)smem);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            unload(m);
            return kva__fail(KVA_ERR_DEVICE, "%s: preparing variant kernel %s failed: %s", api, img->names[s],
                             cudaGetErrorString(e));
        }
        if (smem > priv->smem_optin) continue; /* the chooser never picks it on this device */
        m->fn[s] = (const void *)k;
        m->blocks_per_sm[s] = blocks > 0 ? blocks : 1;
        /* (PTX for an older architecture, JIT-compiled here, has no griddepcontrol: such a kernel
         * must not be launched as a programmatic dependent) */
        cudaFuncAttributes fa;
        if (cudaFuncGetAttributes(&fa, (const void *)k) == cudaSuccess)
            m->runs_sm90[s] = fa.ptxVersion >= 90 && priv->cc_major >= 9;
        else
            (void)cudaGetLastError();
    }
    *out = m;
    return KVA_OK;
}

static const kva__vmod_loaded *cached_module(const kva__cuda_private *priv, const uint64_t key[2]) {
    for (int i = 0; i < priv->num_vmods; ++i) {
        const kva__vmod_loaded *m = (const kva__vmod_loaded *)priv->vmods[i];
        if (m->key[0] == key[0] && m->key[1] == key[1]) return m;
    }
    return NULL;
}

extern "C" kva_status kva__cuda_variant_create(kva_context *ctx, const char *api, const char *source,
                                               const char *function, const kva_variant_options *options,
                                               kva_variant **out) {
    const double t0 = now_ms();
    kva__cuda_private *priv = (kva__cuda_private *)ctx->cuda_private;
    KVA_TRY(kva__cuda_use_device(ctx));
    const int arch = priv->cc_major * 10 + priv->cc_minor;
    const int n = kva__variant_modules(options, NULL, 0);
    if (n == 0)
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: options select no kernel (kinds, dtypes, head_dim %d)", api,
                         options ? options->head_dim : 0);
    kva__vmod_id *ids = (kva__vmod_id *)calloc((size_t)n, sizeof *ids);
    kva__vmod_id *todo = (kva__vmod_id *)calloc((size_t)n, sizeof *todo);
    kva__vmod_image *images = (kva__vmod_image *)calloc((size_t)n, sizeof *images);
    kva__vmod_loaded **fresh = (kva__vmod_loaded **)calloc((size_t)n, sizeof *fresh);
    kva_variant *v = (kva_variant *)calloc(1, sizeof *v);
    const kva__vmod_loaded **mods = (const kva__vmod_loaded **)calloc((size_t)n, sizeof *mods);
    kva_status st = KVA_OK;
    int ntodo = 0, nfresh = 0, context_hits = 0;
    kva_variant_stats stats;
    memset(&stats, 0, sizeof stats);
    if (!ids || !todo || !images || !fresh || !v || !mods) {
        st = kva__fail(KVA_ERR_OUT_OF_MEMORY, "%s: out of memory", api);
        goto fail;
    }
    kva__variant_modules(options, ids, n);
    /* modules this context already holds, then the rest from disk or NVRTC */
    for (int i = 0; i < n; ++i) {
        uint64_t key[2];
        kva__variant_key(source, function, &ids[i], arch, key);
        mods[i] = cached_module(priv, key);
        if (mods[i]) ++context_hits;
        else todo[ntodo++] = ids[i];
    }
    if (ntodo > 0) {
        char dir[4096];
#ifdef KVA__HP_TRACE
        const bool disk = false; /* (traced modules: never stored beside or mistaken for plain ones) */
#else
        const bool disk = kva__variant_cache_dir(dir, sizeof dir);
#endif
        st = kva__variant_build(api, source, function, todo, ntodo, arch, disk ? dir : NULL, images, &stats);
        if (st != KVA_OK) goto fail;
        for (int j = 0; j < ntodo && st == KVA_OK; ++j) {
            st = load_module(api, priv, &images[j], &fresh[j]);
            if (st != KVA_OK && images[j].from_disk) {
                /* a cache entry the device refuses is not trusted: rebuild it once */
                kva__vmod_image again[1];
                if (kva__variant_build(api, source, function, &todo[j], 1, arch, NULL, again, NULL) == KVA_OK) {
                    if (disk) (void)kva__vcache_store(dir, &again[0]);
                    st = load_module(api, priv, &again[0], &fresh[j]);
                    kva__vmod_images_free(again, 1);
                }
            }
            if (st == KVA_OK) ++nfresh;
        }
        if (st != KVA_OK) goto fail;
        /* the new modules join the context's cache only now that all of them loaded */
        if (priv->num_vmods + nfresh > priv->cap_vmods) {
            const int cap = (priv->num_vmods + nfresh) * 2;
            void **grown = (void **)realloc(priv->vmods, sizeof(void *) * (size_t)cap);
            if (!grown) {
                st = kva__fail(KVA_ERR_OUT_OF_MEMORY, "%s: out of memory", api);
                goto fail;
            }
            priv->vmods = grown;
            priv->cap_vmods = cap;
        }
        for (int i = 0, j = 0; i < n; ++i)
            if (!mods[i]) mods[i] = fresh[j++];
        for (int j = 0; j < nfresh; ++j) priv->vmods[priv->num_vmods++] = fresh[j];
    }
    kva__vmod_images_free(images, ntodo);
    v->ctx = ctx;
    v->device_id = ctx->device_id;
    v->num_modules = n;
    v->modules = mods;
    v->stats = stats;
    v->stats.modules = n;
    v->stats.context_hits = context_hits;
    v->stats.total_ms = now_ms() - t0;
    free(ids);
    free(todo);
    free(images);
    free(fresh);
    *out = v;
    return KVA_OK;
fail:
    for (int j = 0; j < nfresh; ++j) unload(fresh[j]);
    if (images) kva__vmod_images_free(images, ntodo);
    free(ids);
    free(todo);
    free(images);
    free(fresh);
    free(mods);
    free(v);
    return st;
}

extern "C" void kva__cuda_variant_destroy(kva_variant *v) {
    /* its modules stay in the context's cache until the context goes */
    free((void *)v->modules);
    free(v);
}

/* Called by kva__cuda_context_destroy. */
extern "C" void kva__cuda_variant_modules_release(kva__cuda_private *priv) {
    for (int i = 0; i < priv->num_vmods; ++i) unload((kva__vmod_loaded *)priv->vmods[i]);
    free(priv->vmods);
    priv->vmods = NULL;
    priv->num_vmods = priv->cap_vmods = 0;
}

static const kva__vmod_loaded *find_module(const kva_variant *v, int kind, kva_dtype dtype, int dim) {
    for (int i = 0; i < v->num_modules; ++i) {
        const kva__vmod_loaded *m = v->modules[i];
        if (m->id.kind == kind && m->id.dtype == dtype && m->id.dim == dim) return m;
    }
    return NULL;
}

extern "C" const void *kva__variant_decode_fn(const kva_variant *v, kva_dtype dtype, int built_dim, int nt, int gr,
                                              int *blocks_per_sm, int *runs_sm90) {
    const kva__vmod_loaded *m = find_module(v, KVA__VMOD_DECODE, dtype, built_dim);
    const int s = (nt - 1) + 2 * gr;
    if (!m || s < 0 || s >= KVA__VMOD_MAX_KERNELS || !m->fn[s]) return NULL;
    *blocks_per_sm = m->blocks_per_sm[s];
    if (runs_sm90) *runs_sm90 = m->runs_sm90[s];
    return m->fn[s];
}

extern "C" const void *kva__variant_prefill_fn(const kva_variant *v, kva_dtype dtype, int dim, int slot) {
    const kva__vmod_loaded *m = find_module(v, KVA__VMOD_PREFILL, dtype, dim);
    if (dtype == KVA_F32) slot = 0;
    if (!m || slot < 0 || slot >= KVA__VMOD_MAX_KERNELS) return NULL;
    return m->fn[slot];
}

#ifdef KVA__HP_TRACE
/* Measurement builds (KVA_HP_TRACE): the trace of the last launch of variant v's bf16 Hopper
 * prefill kernel at built head dim `dim` (the module's own copy of prefill_hopper_trace.cuh's
 * buffer), as kva__hp_trace_read reads the library's: into dst, count values at most, then
 * cleared. Returns the CUDA error, or -1 where v has no such module. */
extern "C" int kva__variant_trace_read(const kva_variant *v, int dim, long long *dst, size_t count) {
    const kva__vmod_loaded *m = find_module(v, KVA__VMOD_PREFILL, KVA_BF16, dim);
    if (!m || !m->library) return -1;
    void *buf = NULL;
    size_t bytes = 0;
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaLibraryGetGlobal(&buf, &bytes, (cudaLibrary_t)m->library, "kva__hp_trace_buf");
    if (e == cudaSuccess) e = cudaMemcpy(dst, buf, (count * sizeof(long long) < bytes ? count * sizeof(long long) : bytes), cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaMemset(buf, 0, bytes);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return (int)e;
}
#endif
