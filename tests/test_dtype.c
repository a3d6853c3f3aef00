/*
 * test_dtype.c -- kva_convert (src/common/dtype.c, src/common/dtype_convert.h) against an
 * independent oracle: 16-bit values decoded by their definition in double arithmetic (sign,
 * exponent, mantissa, ldexp), and f32 values rounded by searching the table of every finite
 * 16-bit value for the two neighbours, nearer one wins, ties to the even pattern, infinity from
 * max + half an ulp on. Every 16-bit pattern both ways, f32 values at, around and between every
 * pair of neighbouring 16-bit values, random f32 patterns, specials; odd lengths and offsets (the
 * loops are vectorised); in place where the destination elements are no wider.
 */
#include "harness.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The two 16-bit formats: exponent bits and mantissa bits. */
typedef struct {
    kva_dtype dtype;
    int exp_bits, man_bits;
} fmt16;

static const fmt16 k_f16 = {KVA_F16, 5, 10}, k_bf16 = {KVA_BF16, 8, 7};

static double decode16(fmt16 f, uint16_t b) {
    const int emax = (1 << f.exp_bits) - 1, bias = emax / 2;
    const int e = (b >> f.man_bits) & emax;
    const int m = b & ((1 << f.man_bits) - 1);
    const double sign = (b & 0x8000u) ? -1.0 : 1.0;
    if (e == emax) return m ? NAN : sign * INFINITY;
    if (e == 0) return sign * ldexp((double)m, 1 - bias - f.man_bits);
    return sign * ldexp((double)(m + (1 << f.man_bits)), e - bias - f.man_bits);
}

/* Non-negative finite values of a format in increasing order: patterns 0 .. max finite. */
typedef struct {
    double v[0x8000];
    int count;
} table16;

static void make_table(fmt16 f, table16 *t) {
    t->count = 0;
    for (uint32_t b = 0; b < 0x8000u; ++b) {
        const double v = decode16(f, (uint16_t)b);
        if (!isfinite(v)) break; /* the first exponent-all-ones pattern: infinity */
        t->v[t->count++] = v;
    }
}

/* The oracle's rounding of x (a float's value) to the format: 16-bit pattern. */
static uint16_t encode16(const table16 *t, double x) {
    const uint16_t sign = signbit(x) ? 0x8000u : 0;
    if (isnan(x)) return 0xffffu; /* (any NaN: compared by class) */
    const double a = fabs(x);
    const int last = t->count - 1;
    const double max = t->v[last], half_ulp = (t->v[last] - t->v[last - 1]) / 2;
    if (a >= max + half_ulp) return (uint16_t)(sign | (uint16_t)(last + 1)); /* ties: max is odd */
    int lo = 0, hi = last; /* largest index with v <= a */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (t->v[mid] <= a) lo = mid;
        else hi = mid - 1;
    }
    int k = lo;
    if (k < last) {
        const double dl = a - t->v[k], dh = t->v[k + 1] - a;
        if (dh < dl || (dh == dl && (k & 1))) k = k + 1;
    }
    return (uint16_t)(sign | (uint16_t)k);
}

static bool is_nan16(fmt16 f, uint16_t b) { return isnan(decode16(f, b)); }

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* f32 inputs for one format: each finite value, its f32 neighbours, the midpoint to the next
 * value and the midpoint's neighbours, both signs; specials; random patterns. */
static float *f32_inputs(const table16 *t, size_t *n_out) {
    const size_t n_rand = 1u << 18, n_grid = (size_t)t->count * 12, n_special = 16;
    float *x = (float *)malloc(sizeof(float) * (n_grid + n_rand + n_special));
    if (!x) return NULL;
    size_t n = 0;
    for (int k = 0; k < t->count; ++k) {
        const float v = (float)t->v[k];
        const float mid = k + 1 < t->count ? (float)((t->v[k] + t->v[k + 1]) / 2)
                                           : (float)(t->v[k] + (t->v[k] - t->v[k - 1]) / 2);
        const float pts[6] = {v, nextafterf(v, INFINITY), nextafterf(v, 0.0f), mid, nextafterf(mid, INFINITY),
                              nextafterf(mid, 0.0f)};
        for (int i = 0; i < 6; ++i) {
            x[n++] = pts[i];
            x[n++] = -pts[i];
        }
    }
    const float specials[16] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, bits_f32(0x7f800001u),
                                bits_f32(0xffc00123u), FLT_MAX, -FLT_MAX, FLT_MIN, bits_f32(1u),
                                bits_f32(0x807fffffu), 65520.0f, 65519.996f, 1e-8f};
    for (size_t i = 0; i < n_special; ++i) x[n++] = specials[i];
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n_rand; ++i) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[n++] = bits_f32((uint32_t)(s >> 16));
    }
    *n_out = n;
    return x;
}

/* Every 16-bit pattern to f32 and to the other 16-bit format, and back from f32 exactly. */
static void check_from16(fmt16 f, fmt16 other, const table16 *t_other) {
    uint16_t *src = (uint16_t *)malloc(0x10000 * 2), *cross = (uint16_t *)malloc(0x10000 * 2);
    float *wide = (float *)malloc(0x10000 * 4);
    uint16_t *back = (uint16_t *)malloc(0x10000 * 2);
    if (!src || !cross || !wide || !back) {
        CHECK(!"out of memory");
        goto done;
    }
    for (uint32_t b = 0; b < 0x10000u; ++b) src[b] = (uint16_t)b;
    CHECK_OK(kva_convert(src, f.dtype, wide, KVA_F32, 0x10000));
    CHECK_OK(kva_convert(src, f.dtype, cross, other.dtype, 0x10000));
    CHECK_OK(kva_convert(wide, KVA_F32, back, f.dtype, 0x10000));
    int bad = 0;
    for (uint32_t b = 0; b < 0x10000u && bad < 5; ++b) {
        const double want = decode16(f, (uint16_t)b);
        const float got = wide[b];
        const bool ok = isnan(want) ? (isnan(got) && !signbit(got) == !(b & 0x8000u))
                                    : (f32_bits(got) == f32_bits((float)want));
        const bool ok_back = isnan(want) ? is_nan16(f, back[b]) : back[b] == b;
        const uint16_t want_cross = encode16(t_other, want);
        const bool ok_cross = isnan(want) ? is_nan16(other, cross[b]) : cross[b] == want_cross;
        if (!ok || !ok_back || !ok_cross) {
            ++bad;
            CHECK_MSG(false, "%s 0x%04x: f32 %a (want %a), back 0x%04x, to %s 0x%04x (want 0x%04x)",
                      kva_dtype_name(f.dtype), b, (double)got, want, back[b], kva_dtype_name(other.dtype), cross[b],
                      want_cross);
        }
    }
    /* lengths 1..40 at offsets 0..3 (the vector loops' edges), to f32 and to the other format */
    for (size_t off = 0; off < 4; ++off)
        for (size_t len = 1; len <= 40; ++len) {
            float w[48];
            uint16_t c[48];
            memset(w, 0xa5, sizeof w);
            memset(c, 0xa5, sizeof c);
            CHECK_OK(kva_convert(src + 777 + off, f.dtype, w + off, KVA_F32, len));
            CHECK_OK(kva_convert(src + 777 + off, f.dtype, c + off, other.dtype, len));
            bool ok = f32_bits(w[off + len]) == 0xa5a5a5a5u && c[off + len] == 0xa5a5u;
            for (size_t i = 0; i < len; ++i)
                ok = ok && f32_bits(w[off + i]) == f32_bits(wide[777 + off + i]) && c[off + i] == cross[777 + off + i];
            CHECK_MSG(ok, "%s: %zu elements at offset %zu differ from the whole conversion or wrote outside",
                      kva_dtype_name(f.dtype), len, off);
        }
    /* in place to the other 16-bit format; the same format is a copy, NaN payloads included */
    memcpy(back, src, 0x10000 * 2);
    CHECK_OK(kva_convert(back, f.dtype, back, other.dtype, 0x10000));
    CHECK_MSG(memcmp(back, cross, 0x10000 * 2) == 0, "%s -> %s in place differs", kva_dtype_name(f.dtype),
              kva_dtype_name(other.dtype));
    CHECK_OK(kva_convert(src, f.dtype, back, f.dtype, 0x10000));
    CHECK(memcmp(back, src, 0x10000 * 2) == 0);
done:
    free(src);
    free(cross);
    free(wide);
    free(back);
}

/* f32 values to the format: against the oracle, whole, in short slices at odd offsets, in place. */
static void check_to16(fmt16 f, const table16 *t) {
    size_t n = 0;
    float *x = f32_inputs(t, &n);
    uint16_t *got = (uint16_t *)malloc(n * 2), *slice = (uint16_t *)malloc(64 * 2);
    float *inplace = (float *)malloc(n * 4);
    if (!x || !got || !slice || !inplace) {
        CHECK(!"out of memory");
        goto done;
    }
    CHECK_OK(kva_convert(x, KVA_F32, got, f.dtype, n));
    int bad = 0;
    for (size_t i = 0; i < n && bad < 5; ++i) {
        const uint16_t want = encode16(t, (double)x[i]);
        const bool ok = isnan(x[i]) ? is_nan16(f, got[i]) : got[i] == want;
        if (!ok) {
            ++bad;
            CHECK_MSG(false, "f32 %a (0x%08x) -> %s 0x%04x, want 0x%04x", (double)x[i], f32_bits(x[i]),
                      kva_dtype_name(f.dtype), got[i], want);
        }
    }
    /* lengths 1..40 at offsets 0..3: the vector loop's edges */
    for (size_t off = 0; off < 4; ++off)
        for (size_t len = 1; len <= 40; ++len) {
            memset(slice, 0xa5, 64 * 2);
            CHECK_OK(kva_convert(x + off * 1000, KVA_F32, slice + off, f.dtype, len));
            bool ok = slice[0] == (off ? 0xa5a5u : got[off * 1000]) && slice[off + len] == 0xa5a5u;
            for (size_t i = 0; i < len; ++i) ok = ok && slice[off + i] == got[off * 1000 + i];
            CHECK_MSG(ok, "%s: %zu elements at offset %zu differ from the whole conversion or wrote outside",
                      kva_dtype_name(f.dtype), len, off);
        }
    /* in place: narrower destination elements over their own source */
    memcpy(inplace, x, n * 4);
    CHECK_OK(kva_convert(inplace, KVA_F32, inplace, f.dtype, n));
    CHECK_MSG(memcmp(inplace, got, n * 2) == 0, "%s: in-place conversion differs", kva_dtype_name(f.dtype));
done:
    free(x);
    free(got);
    free(slice);
    free(inplace);
}

KVA_TEST(dtype_convert_matches_the_formats_definition) {
    table16 *tf = (table16 *)malloc(sizeof *tf), *tb = (table16 *)malloc(sizeof *tb);
    if (!tf || !tb) {
        CHECK(!"out of memory");
        free(tf);
        free(tb);
        return;
    }
    make_table(k_f16, tf);
    make_table(k_bf16, tb);
    CHECK(tf->count == 0x7c00 && tb->count == 0x7f80);
    CHECK(tf->v[tf->count - 1] == 65504.0);
    check_from16(k_f16, k_bf16, tb);
    check_from16(k_bf16, k_f16, tf);
    check_to16(k_f16, tf);
    check_to16(k_bf16, tb);
    /* same dtype: a copy, overlapping allowed */
    float v[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    CHECK_OK(kva_convert(v, KVA_F32, v + 1, KVA_F32, 8));
    CHECK(v[0] == 1 && v[1] == 1 && v[8] == 8);
    free(tf);
    free(tb);
}

/* Each dtype's size and name, as kvattn.h lists them; unknown dtypes: 0 and "?". */
KVA_TEST(dtype_sizes_and_names) {
    const kva_dtype dts[3] = {KVA_F32, KVA_F16, KVA_BF16};
    const size_t sizes[3] = {4, 2, 2};
    const char *const names[3] = {"f32", "f16", "bf16"};
    for (int i = 0; i < 3; ++i)
        CHECK_MSG(kva_dtype_size(dts[i]) == sizes[i] && strcmp(kva_dtype_name(dts[i]), names[i]) == 0,
                  "dtype %d: size %zu, name \"%s\" (want %zu, \"%s\")", (int)dts[i], kva_dtype_size(dts[i]),
                  kva_dtype_name(dts[i]), sizes[i], names[i]);
    CHECK(kva_dtype_size((kva_dtype)3) == 0 && strcmp(kva_dtype_name((kva_dtype)3), "?") == 0);
    CHECK(kva_dtype_size((kva_dtype)-1) == 0 && strcmp(kva_dtype_name((kva_dtype)-1), "?") == 0);
}
