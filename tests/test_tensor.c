/*
 * test_tensor.c -- the view constructors of src/common/tensor.c, field by field, for random
 * shapes: kva_tensor_nhd / _hnd, kva_kv_pages_separate / _interleaved in both layouts (the
 * interleaved V half starts half a page after K, in bytes of the dtype; a NULL pool gives NULL
 * halves), and every field of kva_attn_params_default as kvattn.h documents it.
 */
#include "harness.h"
#include "test_util.h"

#include <stdint.h>
#include <string.h>

static const kva_dtype tensor_dtypes[3] = {KVA_F32, KVA_F16, KVA_BF16};

KVA_TEST(tensor_views_have_the_documented_strides) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    static unsigned char buf[64];
    for (int rep = 0; rep < 20; ++rep) {
        const kva_dtype dt = tensor_dtypes[rep % 3];
        const int32_t H = kva_rng_int(&rng, 2, 40), D = 16 * kva_rng_int(&rng, 1, 16);
        const int64_t T = kva_rng_int(&rng, 2, 100000);
        kva_tensor n = kva_tensor_nhd(buf, dt, H, D);
        CHECK_MSG(n.data == buf && n.dtype == dt && n.stride_token == (int64_t)H * D && n.stride_head == D,
                  "nhd(H %d, D %d): strides %lld, %lld", H, D, (long long)n.stride_token, (long long)n.stride_head);
        kva_tensor h = kva_tensor_hnd(buf + 16, dt, T, D);
        CHECK_MSG(h.data == buf + 16 && h.dtype == dt && h.stride_token == D && h.stride_head == T * D,
                  "hnd(T %lld, D %d): strides %lld, %lld", (long long)T, D, (long long)h.stride_token,
                  (long long)h.stride_head);
    }
}

KVA_TEST(tensor_page_pool_views) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    static unsigned char k[64], v[64];
    for (int rep = 0; rep < 30; ++rep) {
        const kva_dtype dt = tensor_dtypes[rep % 3];
        const size_t es = kva_dtype_size(dt);
        const int32_t P = kva_rng_int(&rng, 1, 5000), ps = kva_rng_int(&rng, 2, 300), H = kva_rng_int(&rng, 2, 16),
                      D = 16 * kva_rng_int(&rng, 1, 16);
        const int64_t half = (int64_t)ps * H * D;
        for (int hnd = 0; hnd < 2; ++hnd) {
            const kva_layout layout = hnd ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
            const int64_t st_tok = hnd ? D : (int64_t)H * D, st_head = hnd ? (int64_t)ps * D : D;
            kva_kv_pages s = kva_kv_pages_separate(k, v, dt, P, ps, H, D, layout);
            CHECK_MSG(s.k_data == k && s.v_data == v && s.dtype == dt && s.num_pages == P && s.page_size == ps &&
                          s.num_kv_heads == H && s.head_dim == D && s.stride_page == half &&
                          s.stride_token == st_tok && s.stride_head == st_head,
                      "separate %s P %d ps %d H %d D %d: strides page %lld token %lld head %lld",
                      hnd ? "HND" : "NHD", P, ps, H, D, (long long)s.stride_page, (long long)s.stride_token,
                      (long long)s.stride_head);
            kva_kv_pages i = kva_kv_pages_interleaved(k, dt, P, ps, H, D, layout);
            CHECK_MSG(i.k_data == k && (const unsigned char *)i.v_data == k + (size_t)half * es && i.dtype == dt &&
                          i.num_pages == P && i.page_size == ps && i.num_kv_heads == H && i.head_dim == D &&
                          i.stride_page == 2 * half && i.stride_token == st_tok && i.stride_head == st_head,
                      "interleaved %s %s P %d ps %d H %d D %d: v at +%td bytes, strides page %lld token %lld head "
                      "%lld",
                      kva_dtype_name(dt), hnd ? "HND" : "NHD", P, ps, H, D, (const unsigned char *)i.v_data - k,
                      (long long)i.stride_page, (long long)i.stride_token, (long long)i.stride_head);
            kva_kv_pages none = kva_kv_pages_interleaved(NULL, dt, P, ps, H, D, layout);
            CHECK_MSG(none.k_data == NULL && none.v_data == NULL, "an interleaved view of NULL has a V half");
        }
    }
}

KVA_TEST(tensor_attn_params_default_is_documented) {
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    for (int rep = 0; rep < 10; ++rep) {
        const int32_t hk = kva_rng_int(&rng, 1, 8), hq = hk * kva_rng_int(&rng, 1, 8);
        const int32_t D = 16 * kva_rng_int(&rng, 1, 16);
        kva_attn_params p;
        memset(&p, 0x5a, sizeof p);
        p = kva_attn_params_default(hq, hk, D);
        CHECK_MSG(p.num_qo_heads == hq && p.num_kv_heads == hk && p.head_dim == D, "heads / head_dim not kept");
        CHECK_MSG(p.sm_scale == 0.0f && p.causal == 0 && p.window_left == -1 && p.logits_soft_cap == 0.0f,
                  "defaults: sm_scale %g causal %d window_left %d soft cap %g", (double)p.sm_scale, p.causal,
                  p.window_left, (double)p.logits_soft_cap);
        CHECK(p.score_mod == NULL && p.score_mod_user == NULL && p.variant == NULL);
    }
}
