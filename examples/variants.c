/*
 * variants.c -- custom attention variants on the GPU from C (kva_variant, compiled at run time
 * by NVRTC): built-in ALiBi, a T5-style bucketed relative bias read from caller data, a document
 * mask, and soft cap written as a snippet (examples/variant_sources.h). Each runs one causal
 * sequence through kva_attention on the GPU and, for comparison, the same function as a C
 * score_mod callback on a CPU context, and prints the largest difference.
 *
 * Build: part of the CMake build (build/variants). Run: ./build/variants. Without a GPU (or a
 * build without CUDA) it says so and exits 0. The first run compiles (about a second per
 * module); later runs load the compiled modules from ~/.cache/kvattn.
 */
#include <kvattn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "variant_sources.h"

/* The CPU callbacks: the same text as the GPU sources. */
KVA_EX_DEFINE_ALIBI(alibi_cpu, )
KVA_EX_DEFINE_T5(t5_cpu, )
KVA_EX_DEFINE_DOC_MASK(doc_mask_cpu, )
KVA_EX_DEFINE_SOFTCAP(softcap_cpu, )

#define CHECK(call)                                                                            \
    do {                                                                                       \
        kva_status st_ = (call);                                                               \
        if (st_ != KVA_OK) {                                                                   \
            fprintf(stderr, "%s failed: %s\n%s\n", #call, kva_status_str(st_), kva_last_error()); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

enum { S = 300, HQ = 8, HK = 2, D = 64 };

/* Attention of one causal sequence with the modifier: on the GPU through `variant` (user data
 * copied to the device), on the CPU through `cpu_mod`; returns the largest |difference|. */
static double run_both(kva_context *gpu, kva_context *cpu, const kva_variant *variant, kva_score_mod_fn cpu_mod,
                       void *user, size_t user_bytes, const float *q, const float *k, const float *v) {
    const size_t nq = (size_t)S * HQ * D, nk = (size_t)S * HK * D;
    float *o_gpu = malloc(nq * sizeof(float)), *o_cpu = malloc(nq * sizeof(float));
    void *dq, *dk, *dv, *dout, *duser;
    CHECK(kva_malloc(gpu, nq * sizeof(float), &dq));
    CHECK(kva_malloc(gpu, nk * sizeof(float), &dk));
    CHECK(kva_malloc(gpu, nk * sizeof(float), &dv));
    CHECK(kva_malloc(gpu, nq * sizeof(float), &dout));
    CHECK(kva_malloc(gpu, user_bytes, &duser));
    CHECK(kva_memcpy(gpu, dq, q, nq * sizeof(float), KVA_COPY_HOST_TO_DEVICE));
    CHECK(kva_memcpy(gpu, dk, k, nk * sizeof(float), KVA_COPY_HOST_TO_DEVICE));
    CHECK(kva_memcpy(gpu, dv, v, nk * sizeof(float), KVA_COPY_HOST_TO_DEVICE));
    CHECK(kva_memcpy(gpu, duser, user, user_bytes, KVA_COPY_HOST_TO_DEVICE));

    kva_attn_params p = kva_attn_params_default(HQ, HK, D);
    p.causal = 1;
    p.variant = variant;      /* GPU: the compiled variant, device data */
    p.score_mod_user = duser;
    CHECK(kva_attention(gpu, &p, S, S, kva_tensor_nhd(dq, KVA_F32, HQ, D), kva_tensor_nhd(dk, KVA_F32, HK, D),
                        kva_tensor_nhd(dv, KVA_F32, HK, D), kva_tensor_nhd(dout, KVA_F32, HQ, D), NULL));
    CHECK(kva_memcpy(gpu, o_gpu, dout, nq * sizeof(float), KVA_COPY_DEVICE_TO_HOST));

    p.variant = NULL;         /* CPU: the C callback, host data */
    p.score_mod = cpu_mod;
    p.score_mod_user = user;
    CHECK(kva_attention(cpu, &p, S, S, kva_tensor_nhd((void *)q, KVA_F32, HQ, D),
                        kva_tensor_nhd((void *)k, KVA_F32, HK, D), kva_tensor_nhd((void *)v, KVA_F32, HK, D),
                        kva_tensor_nhd(o_cpu, KVA_F32, HQ, D), NULL));
    double worst = 0;
    for (size_t i = 0; i < nq; ++i) worst = fmax(worst, fabs((double)o_gpu[i] - o_cpu[i]));
    kva_free(gpu, dq);
    kva_free(gpu, dk);
    kva_free(gpu, dv);
    kva_free(gpu, dout);
    kva_free(gpu, duser);
    free(o_gpu);
    free(o_cpu);
    return worst;
}

static void report(const char *name, const kva_variant *v, double diff) {
    kva_variant_stats st;
    CHECK(kva_variant_get_stats(v, &st));
    printf("%-16s created in %7.1f ms (%d module%s: %d compiled, %d from the disk cache)   max |gpu - cpu| = %.2e\n",
           name, st.total_ms, st.modules, st.modules == 1 ? "" : "s", st.compiled, st.disk_hits, diff);
}

int main(void) {
    if (!kva_cuda_available()) {
        printf("variants: no GPU (or kvattn built without CUDA); nothing to run\n");
        return 0;
    }
    kva_context *gpu, *cpu;
    CHECK(kva_context_create(KVA_DEVICE_CUDA, 0, &gpu));
    CHECK(kva_context_create(KVA_DEVICE_CPU, 0, &cpu));

    float *q = malloc(sizeof(float) * S * HQ * D), *k = malloc(sizeof(float) * S * HK * D);
    float *v = malloc(sizeof(float) * S * HK * D);
    srand(7);
    for (int i = 0; i < S * HQ * D; ++i) q[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < S * HK * D; ++i) k[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < S * HK * D; ++i) v[i] = (float)rand() / RAND_MAX - 0.5f;

    /* Only the kernels this program runs: f32 prefill at head dim 64 (NULL compiles them all). */
    const kva_variant_options opt = {KVA_VARIANT_PREFILL, 1u << KVA_F32, D};
    kva_variant *var;

    /* ALiBi: built in; caller data = per-head slopes */
    float slopes[HQ];
    kva_alibi_slopes(HQ, slopes);
    CHECK(kva_variant_create_alibi(gpu, &opt, &var));
    report("alibi", var, run_both(gpu, cpu, var, alibi_cpu, slopes, sizeof slopes, q, k, v));
    kva_variant_destroy(var);

    /* T5 bias: caller data = distance -> bucket table, then a bias per (head, bucket) */
    const size_t t5_bytes = sizeof(int32_t) * KVA_EX_T5_MAX_DISTANCE + sizeof(float) * HQ * KVA_EX_T5_BUCKETS;
    int32_t *t5 = malloc(t5_bytes);
    kva_ex_t5_buckets(t5);
    float *bias = (float *)(t5 + KVA_EX_T5_MAX_DISTANCE);
    for (int i = 0; i < HQ * KVA_EX_T5_BUCKETS; ++i) bias[i] = (float)((i * 37) % 23) / 11.0f - 1.0f;
    CHECK(kva_variant_create(gpu, KVA_EX_SOURCE_T5, "t5_bias", &opt, &var));
    report("t5 bias", var, run_both(gpu, cpu, var, t5_cpu, t5, t5_bytes, q, k, v));
    kva_variant_destroy(var);

    /* document mask: three documents packed in the sequence */
    int32_t doc[S];
    for (int i = 0; i < S; ++i) doc[i] = i < 100 ? 0 : i < 170 ? 1 : 2;
    CHECK(kva_variant_create(gpu, KVA_EX_SOURCE_DOC_MASK, "doc_mask", &opt, &var));
    report("document mask", var, run_both(gpu, cpu, var, doc_mask_cpu, doc, sizeof doc, q, k, v));
    kva_variant_destroy(var);

    /* soft cap as a snippet (the built-in kva_attn_params.logits_soft_cap does the same) */
    float cap = 0.5f;
    CHECK(kva_variant_create(gpu, KVA_EX_SOURCE_SOFTCAP, "softcap", &opt, &var));
    report("soft-cap snippet", var, run_both(gpu, cpu, var, softcap_cpu, &cap, sizeof cap, q, k, v));
    kva_variant_destroy(var);

    /* a compile error comes back with NVRTC's log */
    kva_status st = kva_variant_create(gpu, "float broken(float s) { return s +; }", "broken", &opt, &var);
    printf("a broken source: %s; first line of the log:\n  %.*s\n", kva_status_str(st),
           (int)strcspn(strchr(kva_last_error(), '\n') ? strchr(kva_last_error(), '\n') + 1 : "", "\n"),
           strchr(kva_last_error(), '\n') ? strchr(kva_last_error(), '\n') + 1 : "");

    free(t5);
    free(q);
    free(k);
    free(v);
    kva_context_destroy(cpu);
    kva_context_destroy(gpu);
    return 0;
}
