/*
 * verify.h -- how `kvattn run` and `kvattn check` judge an output against the float64
 * reference: |got - ref| <= atol + rtol * |ref| per element, with tolerances set by the dtype the
 * inputs and outputs are rounded to (accumulation is always f32). NaN never passes.
 */
#ifndef KVA_TOOLS_VERIFY_H
#define KVA_TOOLS_VERIFY_H

#include "kvattn.h"

#include <math.h>
#include <stdbool.h>

typedef struct verify_tol {
    double atol, rtol;
} verify_tol;

static inline verify_tol verify_tol_for(kva_dtype dtype) {
    verify_tol t;
    switch (dtype) {
    case KVA_F32: t.atol = 1e-5; t.rtol = 1e-5; break;
    case KVA_F16: t.atol = 2e-3; t.rtol = 1e-2; break;
    default: t.atol = 1e-2; t.rtol = 2e-2; break;
    }
    return t;
}

/* LSE (natural log) is f32 whatever the dtype; half inputs shift it by their rounding. */
static inline verify_tol verify_lse_tol_for(kva_dtype dtype) {
    verify_tol t;
    t.atol = dtype == KVA_F32 ? 1e-5 : 1e-3;
    t.rtol = t.atol;
    return t;
}

/* Folds one comparison into a running worst error; returns true if within tolerance. */
static inline bool verify_value(double got, double ref, verify_tol tol, double *max_err) {
    if (got == ref) return true; /* also equal infinities (an empty row's LSE) */
    double err = fabs(got - ref);
    if (err != err) err = INFINITY;
    if (err > *max_err) *max_err = err;
    return err <= tol.atol + tol.rtol * fabs(ref);
}

#endif
