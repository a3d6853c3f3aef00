/*
 * fuzz_merge.c -- kva_merge_states against the float64 reference: any mix of rows, states, head
 * dims, dtypes and LSE values (ordinary, very large, very negative, -inf for empty states, NaN).
 * Empty states must weigh nothing, all-empty rows give 0 / -inf, a NaN state makes its row NaN,
 * and nothing is ever NaN otherwise.
 */
#include "fuzz_input.h"
#include "kvattn.h"
#include "../src/reference/reference.h"

#include <math.h>
#include <string.h>

enum { MAX_ROWS = 6, MAX_STATES = 9, MAX_D = 40 };

static kva_context *ctx;

static float pick_lse(fz_in *in) {
    switch (fz_range(&in[0], 0, 9)) {
    case 0: return -INFINITY;
    case 1: return (float)fz_range(in, -200, 200) * 1e35f; /* huge magnitudes, still finite */
    case 2: return NAN;
    default: return (float)fz_range(in, -3000, 3000) / 100.0f;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ctx) {
        if (kva_context_create(KVA_DEVICE_CPU, 0, &ctx) != KVA_OK) abort();
        kva_context_set_threads(ctx, 1);
    }
    fz_in in = {data, size, 0};
    int32_t R = fz_range(&in, 0, MAX_ROWS), S = fz_range(&in, 0, MAX_STATES);
    int32_t D = fz_range(&in, 1, MAX_D);
    kva_dtype dt = (kva_dtype)fz_range(&in, 0, 2);
    int with_lse_out = fz_bool(&in);
    uint64_t seed = fz_u32(&in) | 1;

    static float lse[MAX_ROWS * MAX_STATES], lse_out[MAX_ROWS];
    static float vf[MAX_ROWS * MAX_STATES * MAX_D], of[MAX_ROWS * MAX_D];
    static uint16_t vh[MAX_ROWS * MAX_STATES * MAX_D], oh[MAX_ROWS * MAX_D];
    static double vd[MAX_ROWS * MAX_STATES * MAX_D], ld[MAX_ROWS * MAX_STATES];
    static double od[MAX_ROWS * MAX_D], lod[MAX_ROWS];
    size_t nv = (size_t)R * S * D;
    for (size_t i = 0; i < nv; ++i) vf[i] = fz_randf(&seed) * 4.0f;
    for (int i = 0; i < R * S; ++i) lse[i] = pick_lse(&in);
    void *v_in = vf, *v_out = of;
    if (dt != KVA_F32) {
        kva_convert(vf, KVA_F32, vh, dt, nv);
        kva_convert(vh, dt, vf, KVA_F32, nv); /* the reference sees the rounded values */
        v_in = vh, v_out = oh;
    }
    for (size_t i = 0; i < nv; ++i) vd[i] = vf[i];
    for (int i = 0; i < R * S; ++i) ld[i] = lse[i];

    kva_status st = kva_merge_states(ctx, R, S, D, dt, v_in, lse, v_out,
                                     with_lse_out ? lse_out : NULL);
    FZ_ASSERT(st == KVA_OK, "%s", kva_last_error());
    if (dt != KVA_F32) kva_convert(oh, dt, of, KVA_F32, (size_t)R * D);

    for (int r = 0; r < R; ++r) {
        int has_nan = 0;
        for (int s = 0; s < S; ++s) has_nan |= isnan(lse[r * S + s]);
        if (has_nan) { /* an overflowed state (see kvattn.h) must stay visible */
            for (int d = 0; d < D; ++d) FZ_ASSERT(isnan(of[r * D + d]), "row %d: NaN state hidden", r);
            if (with_lse_out) FZ_ASSERT(isnan(lse_out[r]), "row %d: NaN lse hidden", r);
            continue;
        }
        kva_ref_merge_states(1, S, D, vd + (size_t)r * S * D, ld + (size_t)r * S, od + (size_t)r * D,
                             lod + r);
        double tol = dt == KVA_F32 ? 1e-5 : dt == KVA_F16 ? 2e-3 : 1.6e-2;
        for (int d = 0; d < D; ++d) {
            double got = of[r * D + d], want = od[r * D + d];
            FZ_ASSERT(fabs(got - want) <= tol * (4.0 + fabs(want)), "row %d dim %d: %g vs %g", r, d,
                      got, want);
        }
        if (with_lse_out) {
            if (isinf(lod[r])) {
                FZ_ASSERT(lse_out[r] == -INFINITY, "row %d: lse %g, expected -inf", r, lse_out[r]);
            } else {
                FZ_ASSERT(fabs(lse_out[r] - lod[r]) <= 1e-5 * (1.0 + fabs(lod[r])),
                          "row %d lse %g vs %g", r, lse_out[r], lod[r]);
            }
        }
    }
    return 0;
}
