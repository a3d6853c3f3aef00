/* synth.c -- counter-based synthetic activations; see synth.h. */
#include "synth.h"

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

void synth_token(uint64_t seed, synth_tensor tensor, int32_t request, int32_t position,
                 int32_t layer, int32_t num_heads, int32_t head_dim, float *out) {
    /* Each coordinate gets its own odd multiplier before mixing, so neighbouring rows share no
     * structure. */
    uint64_t row = mix64(seed ^ 0x9e3779b97f4a7c15ull);
    row = mix64(row ^ ((uint64_t)tensor * 0xd1b54a32d192ed03ull));
    row = mix64(row ^ ((uint64_t)(uint32_t)request * 0x8cb92ba72f3d8dd7ull));
    row = mix64(row ^ ((uint64_t)(uint32_t)position * 0xa0761d6478bd642full));
    row = mix64(row ^ ((uint64_t)(uint32_t)layer * 0xe7037ed1a0b428dbull));
    const float scale = tensor == SYNTH_Q ? 4.0f : 2.0f; /* width of the interval */
    const int64_t n = (int64_t)num_heads * head_dim;
    for (int64_t i = 0; i < n; ++i) {
        uint64_t h = mix64(row + (uint64_t)i * 0x9e3779b97f4a7c15ull);
        float u = (float)(h >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
        out[i] = (u - 0.5f) * scale;
    }
}

void synth_rng_seed(synth_rng *r, uint64_t seed) { r->s = mix64(seed) | 1; }

uint64_t synth_rng_next(synth_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

int32_t synth_rng_int(synth_rng *r, int32_t lo, int32_t hi) {
    return lo + (int32_t)(synth_rng_next(r) % ((uint64_t)((int64_t)hi - lo) + 1));
}
