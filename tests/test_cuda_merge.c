/*
 * test_cuda_merge.c -- kva_merge_states on CUDA against the float64 reference: every dtype, odd
 * head dims, many states, states with lse = -inf, a row whose states are all -inf (0 and -inf,
 * never NaN), zero states, and lse_out optional. Outputs are poisoned first.
 */
#include "harness.h"
#include "test_cuda_util.h"
#include "test_util.h"
#include "../src/reference/reference.h"
#include "../src/common/dtype_convert.h"

#include <math.h>
#include <stdlib.h>

static void merge_case(kva_context *ctx, kva_rng *rng, kva_dtype dt, int32_t rows, int32_t states,
                       int32_t D, bool want_lse) {
    const size_t es = kva_dtype_size(dt);
    const size_t nv = (size_t)rows * (states > 0 ? states : 1) * D, nl = (size_t)rows * (states > 0 ? states : 1);
    void *v = kva_test_alloc(nv * es);
    float *lse = kva_test_alloc(nl * sizeof(float));
    kva_fill_random(rng, v, dt, nv, -2.f, 2.f);
    for (size_t i = 0; i < nl; ++i) lse[i] = kva_rng_uniform(rng, -6.f, 6.f);
    for (int32_t r = 0; r < rows && states > 0; ++r) {
        if (r % 3 == 1) lse[(size_t)r * states + (size_t)kva_rng_int(rng, 0, states - 1)] = -INFINITY;
        if (r == rows - 1)
            for (int32_t s = 0; s < states; ++s) lse[(size_t)r * states + s] = -INFINITY;
    }
    double *vd = kva_test_alloc(sizeof(double) * nv), *ld = kva_test_alloc(sizeof(double) * nl);
    for (size_t i = 0; i < nv; ++i) vd[i] = kva__load_f32(v, dt, (int64_t)i);
    for (size_t i = 0; i < nl; ++i) ld[i] = lse[i];
    double *o_ref = kva_test_alloc(sizeof(double) * (size_t)rows * D), *l_ref = kva_test_alloc(sizeof(double) * (size_t)rows);
    kva_ref_merge_states(rows, states, D, vd, ld, o_ref, l_ref);

    void *v_dev = cuda_test_upload(ctx, v, nv * es);
    float *l_dev = cuda_test_upload(ctx, lse, nl * sizeof(float));
    void *o_dev = cuda_test_poisoned(ctx, (size_t)rows * D * es);
    float *lo_dev = want_lse ? cuda_test_poisoned(ctx, (size_t)rows * sizeof(float)) : NULL;
    CHECK_OK(kva_merge_states(ctx, rows, states, D, dt, v_dev, l_dev, o_dev, lo_dev));
    CHECK_OK(kva_synchronize(ctx));
    void *o = cuda_test_download(ctx, o_dev, (size_t)rows * D * es);
    int before = kva_test_failures;
    kva_compare("merged v", o, dt, o_ref, (size_t)rows * D, kva_tol_for(dt), NULL);
    if (want_lse) {
        float *lo = cuda_test_download(ctx, lo_dev, (size_t)rows * sizeof(float));
        kva_compare_lse("merged lse", lo, l_ref, (size_t)rows, dt, NULL);
        free(lo);
    }
    if (kva_test_failures != before)
        printf("    case: %s rows=%d states=%d D=%d\n", kva_dtype_name(dt), rows, states, D);
    free(o);
    free(v);
    free(lse);
    free(vd);
    free(ld);
    free(o_ref);
    free(l_ref);
    kva_free(ctx, v_dev);
    kva_free(ctx, l_dev);
    kva_free(ctx, o_dev);
    kva_free(ctx, lo_dev);
}

KVA_TEST(cuda_merge_states_matches_reference) {
    kva_context *ctx = cuda_test_context();
    if (!ctx) return;
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const kva_dtype dts[] = {KVA_F32, KVA_F16, KVA_BF16};
    for (int i = 0; i < 3; ++i) {
        merge_case(ctx, &rng, dts[i], 37, 5, 128, true);
        merge_case(ctx, &rng, dts[i], 7, 1, 64, true);
        merge_case(ctx, &rng, dts[i], 3, 130, 33, i != 1);
        merge_case(ctx, &rng, dts[i], 5, 0, 256, true);
        merge_case(ctx, &rng, dts[i], 1, 3, 1000, true);
    }
    kva_context_destroy(ctx);
}
