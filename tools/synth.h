/*
 * synth.h -- deterministic synthetic Q/K/V for the serving simulation.
 *
 * Every value is a pure function of (seed, tensor, request, position, layer, head, element), so
 * the simulation never stores the model's activations: a verifier regenerates exactly the
 * rows a kernel saw, and a request preempted and recomputed writes bit-identical K/V again.
 * The generator is a counter-based hash (splitmix64 finaliser), a few nanoseconds per value.
 */
#ifndef KVA_TOOLS_SYNTH_H
#define KVA_TOOLS_SYNTH_H

#include <stdint.h>

typedef enum synth_tensor { SYNTH_Q = 0, SYNTH_K = 1, SYNTH_V = 2 } synth_tensor;

/* One token's row of all heads: out [num_heads][head_dim] floats. Q values lie in [-2, 2),
 * K and V in [-1, 1): scores are spread enough that the softmax is neither flat nor one-hot. */
void synth_token(uint64_t seed, synth_tensor tensor, int32_t request, int32_t position,
                 int32_t layer, int32_t num_heads, int32_t head_dim, float *out);

/* A small seeded generator (xorshift64*) for everything else the tools draw at random:
 * request lengths, page orders, verification samples. */
typedef struct synth_rng {
    uint64_t s;
} synth_rng;

void synth_rng_seed(synth_rng *r, uint64_t seed);
uint64_t synth_rng_next(synth_rng *r);
/* Uniform in [lo, hi] (inclusive; lo <= hi). */
int32_t synth_rng_int(synth_rng *r, int32_t lo, int32_t hi);

#endif
