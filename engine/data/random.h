// Deterministic random numbers for the data layer: the same seed gives the same stream on every
// platform and standard library (std::*_distribution does not), so shuffle orders and synthetic
// data are reproducible across machines.
#pragma once

#include <cmath>
#include <cstdint>

namespace td {

// One splitmix64 step: a bijective 64-bit mixer, also used to derive seeds from (seed, key).
constexpr uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// A seed for stream `key` of `seed` (epoch e of a shuffle, sample i of a synthetic set).
constexpr uint64_t deriveSeed(uint64_t seed, uint64_t key) {
    return mix64(seed ^ mix64(key + 0x632be59bd9b4e019ull));
}

// splitmix64 generator. Not thread-safe: one instance per thread or stream.
class Rng {
  public:
    explicit Rng(uint64_t seed) : state_(seed) {}

    uint64_t next() {
        state_ += 0x9e3779b97f4a7c15ull;
        uint64_t z = state_;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }

    // Uniform in [0, bound), bound > 0, without modulo bias (rejects the incomplete last block).
    uint64_t uniform(uint64_t bound) {
        const uint64_t limit = ~0ull - (~0ull % bound + 1) % bound;  // values <= limit are unbiased
        uint64_t r = next();
        while (r > limit) r = next();
        return r % bound;
    }

    // Uniform in [0, 1) with 53 random bits.
    double uniformDouble() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

    // Standard normal (Box-Muller; one value per call, the pair's second value is dropped to keep
    // the stream position independent of call history).
    double normal() {
        double u1 = uniformDouble();
        const double u2 = uniformDouble();
        if (u1 < 1e-300) u1 = 1e-300;
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }

  private:
    uint64_t state_;
};

}  // namespace td
