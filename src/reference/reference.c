/* reference.c -- float64 oracle; see reference.h. Deliberately the textbook algorithm: scores,
 * masks, max-subtracted softmax, weighted sum. */
#include "reference.h"
#include "../common/dtype_convert.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

void kva_ref_attention(const kva_attn_params *p, int32_t qo_len, int32_t kv_len, const double *q,
                       const double *k, const double *v, double *o, double *lse) {
    const int32_t Hq = p->num_qo_heads, Hk = p->num_kv_heads, D = p->head_dim;
    const int32_t group = Hq / Hk;
    const double scale = p->sm_scale > 0 ? p->sm_scale : 1.0 / sqrt((double)D);
    /* The definition in kvattn.h, taken literally: a cap of +inf caps nothing (the textbook
     * cap * tanh(x / cap) would be inf * 0 = NaN), an infinite scale defines nothing (NaN). */
    const double cap = p->logits_soft_cap > 0 && isfinite(p->logits_soft_cap) ? p->logits_soft_cap : 0;
    const bool undefined = !isfinite(scale);
    double *s = malloc(sizeof(double) * (size_t)(kv_len > 0 ? kv_len : 1));
    for (int32_t i = 0; i < qo_len; ++i) {
        const int32_t q_pos = kv_len - qo_len + i;
        for (int32_t h = 0; h < Hq; ++h) {
            const int32_t kh = h / group;
            const double *qr = q + ((size_t)i * Hq + h) * D;
            double m = -INFINITY;
            for (int32_t j = 0; j < kv_len; ++j) {
                const double *kr = k + ((size_t)j * Hk + kh) * D;
                double dot = 0;
                for (int32_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
                double x = dot * scale;
                if (cap > 0) x = cap * tanh(x / cap);
                if (p->score_mod) x = p->score_mod((float)x, q_pos, j, h, p->score_mod_user);
                if (p->causal && j > q_pos) x = -INFINITY;
                if (p->window_left >= 0 && (int64_t)j < (int64_t)q_pos - p->window_left) x = -INFINITY;
                s[j] = x;
                if (x > m) m = x;
            }
            double *orow = o + ((size_t)i * Hq + h) * D;
            for (int32_t d = 0; d < D; ++d) orow[d] = undefined ? NAN : 0;
            if (undefined) {
                if (lse) lse[(size_t)i * Hq + h] = NAN;
                continue;
            }
            if (m == -INFINITY) {
                if (lse) lse[(size_t)i * Hq + h] = -INFINITY;
                continue;
            }
            double sum = 0;
            for (int32_t j = 0; j < kv_len; ++j) {
                double e = s[j] == -INFINITY ? 0.0 : exp(s[j] - m);
                sum += e;
                if (e == 0.0) continue;
                const double *vr = v + ((size_t)j * Hk + kh) * D;
                for (int32_t d = 0; d < D; ++d) orow[d] += e * vr[d];
            }
            for (int32_t d = 0; d < D; ++d) orow[d] /= sum;
            if (lse) lse[(size_t)i * Hq + h] = m + log(sum);
        }
    }
    free(s);
}

void kva_ref_merge_states(int32_t num_rows, int32_t num_states, int32_t head_dim, const double *v,
                          const double *lse, double *v_out, double *lse_out) {
    for (int32_t r = 0; r < num_rows; ++r) {
        double m = -INFINITY;
        for (int32_t s = 0; s < num_states; ++s)
            if (lse[(size_t)r * num_states + s] > m) m = lse[(size_t)r * num_states + s];
        double *out = v_out + (size_t)r * head_dim;
        for (int32_t d = 0; d < head_dim; ++d) out[d] = 0;
        if (m == -INFINITY) {
            if (lse_out) lse_out[r] = -INFINITY;
            continue;
        }
        double sum = 0;
        for (int32_t s = 0; s < num_states; ++s) sum += exp(lse[(size_t)r * num_states + s] - m);
        double total = m + log(sum);
        for (int32_t s = 0; s < num_states; ++s) {
            double w = exp(lse[(size_t)r * num_states + s] - total);
            const double *vs = v + ((size_t)r * num_states + s) * head_dim;
            for (int32_t d = 0; d < head_dim; ++d) out[d] += w * vs[d];
        }
        if (lse_out) lse_out[r] = total;
    }
}

void kva_ref_read_tensor(kva_tensor t, int64_t tok0, int64_t ntok, int32_t heads,
                         int32_t head_dim, double *out) {
    size_t es = kva_dtype_size(t.dtype);
    for (int64_t i = 0; i < ntok; ++i)
        for (int32_t h = 0; h < heads; ++h) {
            const unsigned char *row = (const unsigned char *)t.data +
                                       (size_t)((tok0 + i) * t.stride_token + h * t.stride_head) * es;
            for (int32_t d = 0; d < head_dim; ++d)
                out[((size_t)i * heads + h) * head_dim + d] = kva__load_f32(row, t.dtype, d);
        }
}

int32_t kva_ref_paged_len(const kva_page_table *table, int32_t page_size, int32_t b) {
    int32_t np = table->indptr[b + 1] - table->indptr[b];
    return np == 0 ? 0 : (np - 1) * page_size + table->last_page_len[b];
}

int32_t kva_ref_read_paged(const kva_kv_pages *pg, const kva_page_table *table, int32_t b,
                           double *k, double *v) {
    int32_t len = kva_ref_paged_len(table, pg->page_size, b);
    size_t es = kva_dtype_size(pg->dtype);
    for (int32_t j = 0; j < len; ++j) {
        int32_t page = table->indices[table->indptr[b] + j / pg->page_size];
        int32_t slot = j % pg->page_size;
        for (int32_t h = 0; h < pg->num_kv_heads; ++h) {
            size_t off = (size_t)(page * pg->stride_page + slot * pg->stride_token +
                                  h * pg->stride_head) * es;
            const unsigned char *kr = (const unsigned char *)pg->k_data + off;
            const unsigned char *vr = (const unsigned char *)pg->v_data + off;
            for (int32_t d = 0; d < pg->head_dim; ++d) {
                k[((size_t)j * pg->num_kv_heads + h) * pg->head_dim + d] = kva__load_f32(kr, pg->dtype, d);
                v[((size_t)j * pg->num_kv_heads + h) * pg->head_dim + d] = kva__load_f32(vr, pg->dtype, d);
            }
        }
    }
    return len;
}
