// rng.h: a small seeded random generator (splitmix64) held in a caller's struct: no global state, and a
// stream is a pure function of (seed, stream id), so any value can be regenerated without replaying others.
#pragma once
#include <math.h>
#include <stdint.h>

typedef struct {
    uint64_t state;
} Rng;

static inline uint64_t rng_next_u64(Rng* r) {
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline Rng rng_seeded(uint64_t seed, uint64_t stream) {
    Rng r = {seed * 0x9e3779b97f4a7c15ull ^ (stream + 0x632be59bd9b4e019ull)};
    rng_next_u64(&r);
    return r;
}

// Uniform in [0, 1) with 24 bits.
static inline float rng_uniform(Rng* r) { return (float)(rng_next_u64(r) >> 40) * (1.0f / 16777216.0f); }

// Standard normal by Box-Muller (one value per call; simple and deterministic).
static inline float rng_normal(Rng* r) {
    double u1 = ((double)(rng_next_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);   // (0, 1]
    double u2 = (double)(rng_next_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
