/* variant_api.c -- the public kva_variant calls (kvattn.h): argument checks, then the CUDA
 * backend (src/cuda/variant_load.cu; cuda_stub.c without CUDA), and the ALiBi helpers. */
#include "../common/internal.h"
#include "../cuda/cuda_backend.h"
#include "../cuda/variant.h"

#include <math.h>
#include <string.h>

/* The built-in ALiBi source, src/cuda/variant_alibi.cuh, embedded at build time. */
static const char *alibi_source(void) {
    for (int i = 0; i < kva__embedded_file_count; ++i)
        if (strcmp(kva__embedded_files[i].name, "variant_alibi.cuh") == 0) return kva__embedded_files[i].text;
    return NULL;
}

static bool is_identifier(const char *s) {
    if (!s || !(s[0] == '_' || (s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z'))) return false;
    size_t n = 0;
    for (; s[n]; ++n)
        if (!(s[n] == '_' || (s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') ||
              (s[n] >= '0' && s[n] <= '9')))
            return false;
    return n <= 200;
}

static kva_status create(const char *api, kva_context *ctx, const char *source, const char *function,
                         const kva_variant_options *options, kva_variant **out) {
    if (!out) return kva__fail(KVA_ERR_INVALID_ARG, "%s: out is NULL", api);
    *out = NULL;
    if (!ctx) return kva__fail(KVA_ERR_INVALID_ARG, "%s: ctx is NULL", api);
    if (!source) return kva__fail(KVA_ERR_INVALID_ARG, "%s: source is NULL", api);
    if (!is_identifier(function))
        return kva__fail(KVA_ERR_INVALID_ARG, "%s: function %s%s%s is not a C identifier", api,
                         function ? "'" : "", function ? function : "(NULL)", function ? "'" : "");
    if (options) {
        if (options->kinds & ~(uint32_t)(KVA_VARIANT_DECODE | KVA_VARIANT_PREFILL))
            return kva__fail(KVA_ERR_INVALID_ARG, "%s: options.kinds = 0x%x has unknown bits", api, options->kinds);
        if (options->dtypes & ~7u)
            return kva__fail(KVA_ERR_INVALID_ARG, "%s: options.dtypes = 0x%x has unknown bits", api, options->dtypes);
        if (options->head_dim < 0)
            return kva__fail(KVA_ERR_INVALID_ARG, "%s: options.head_dim = %d is negative", api, options->head_dim);
    }
    if (ctx->device != KVA_DEVICE_CUDA)
        return kva__fail(KVA_ERR_UNSUPPORTED,
                         "%s: variants are compiled for CUDA contexts; on the CPU set params.score_mod to a C "
                         "callback instead",
                         api);
    kva_variant *v = NULL;
    KVA_TRY(kva__cuda_variant_create(ctx, api, source, function, options, &v));
    ctx->live_variants += 1; /* released by kva_variant_destroy */
    *out = v;
    return KVA_OK;
}

kva_status kva_variant_create(kva_context *ctx, const char *source, const char *function,
                              const kva_variant_options *options, kva_variant **out) {
    return create("kva_variant_create", ctx, source, function, options, out);
}

kva_status kva_variant_create_alibi(kva_context *ctx, const kva_variant_options *options, kva_variant **out) {
    return create("kva_variant_create_alibi", ctx, alibi_source(), "kva_alibi", options, out);
}

const char *kva_variant_alibi_source(void) { return alibi_source(); }

void kva_variant_destroy(kva_variant *variant) {
    if (!variant) return;
    kva_context *ctx = variant->ctx;
    kva__cuda_variant_destroy(variant);
    kva__context_variant_released(ctx);
}

kva_status kva_variant_get_stats(const kva_variant *variant, kva_variant_stats *stats) {
    if (!variant || !stats)
        return kva__fail(KVA_ERR_INVALID_ARG, "kva_variant_get_stats: %s is NULL", variant ? "stats" : "variant");
    *stats = variant->stats;
    return KVA_OK;
}

/* Press et al.: for n a power of two, slope_h = 2^(-8 (h + 1) / n); otherwise the slopes of the
 * largest power of two p below n, followed by every other slope of 2p (the reference code's
 * interleaving). */
void kva_alibi_slopes(int32_t num_heads, float *slopes) {
    if (num_heads <= 0 || !slopes) return;
    int32_t p = 1;
    while (p * 2 <= num_heads) p *= 2;
    for (int32_t h = 0; h < p; ++h) slopes[h] = (float)pow(2.0, -8.0 * (h + 1) / p);
    for (int32_t h = p, i = 0; h < num_heads; ++h, ++i)
        slopes[h] = (float)pow(2.0, -8.0 * (2 * i + 1) / (2 * p));
}
