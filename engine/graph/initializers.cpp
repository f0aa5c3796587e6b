#include "engine/graph/initializers.h"

#include <cmath>
#include <random>

namespace td {

Status initializeParam(float* w, int64_t n, int64_t fanIn, int64_t fanOut,
                       const InitializerSpec& spec, uint64_t seed) {
    std::mt19937_64 rng(spec.seed ? *spec.seed : seed);
    const std::string& k = spec.name;
    auto uniform = [&](double limit) {
        std::uniform_real_distribution<double> d(-limit, limit);
        for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(d(rng));
    };
    // Keras' truncated normal: redraw outside two standard deviations. Variance-scaling
    // initializers divide stddev by 0.87962566103423978 to undo the truncation.
    auto truncated = [&](double mean, double stddev) {
        std::normal_distribution<double> d(0.0, 1.0);
        for (int64_t i = 0; i < n; ++i) {
            double z;
            do z = d(rng);
            while (std::fabs(z) > 2.0);
            w[i] = static_cast<float>(mean + stddev * z);
        }
    };
    const double fanAvg = 0.5 * static_cast<double>(fanIn + fanOut);
    if (k == "zeros") {
        for (int64_t i = 0; i < n; ++i) w[i] = 0.f;
    } else if (k == "ones") {
        for (int64_t i = 0; i < n; ++i) w[i] = 1.f;
    } else if (k == "constant") {
        for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(spec.value);
    } else if (k == "glorot_uniform") {
        uniform(std::sqrt(3.0 / fanAvg));  // = sqrt(6 / (fan_in + fan_out))
    } else if (k == "glorot_normal") {
        truncated(0.0, std::sqrt(1.0 / fanAvg) / 0.87962566103423978);
    } else if (k == "he_uniform") {
        uniform(std::sqrt(6.0 / static_cast<double>(fanIn)));
    } else if (k == "he_normal") {
        truncated(0.0, std::sqrt(2.0 / static_cast<double>(fanIn)) / 0.87962566103423978);
    } else if (k == "lecun_uniform") {
        uniform(std::sqrt(3.0 / static_cast<double>(fanIn)));
    } else if (k == "lecun_normal") {
        truncated(0.0, std::sqrt(1.0 / static_cast<double>(fanIn)) / 0.87962566103423978);
    } else if (k == "random_uniform") {
        std::uniform_real_distribution<double> d(spec.minval, spec.maxval);
        for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(d(rng));
    } else if (k == "random_normal") {
        std::normal_distribution<double> d(spec.mean, spec.stddev);
        for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(d(rng));
    } else if (k == "truncated_normal") {
        truncated(spec.mean, spec.stddev);
    } else {
        return err("unknown initializer '" + k +
                   "' (expected glorot_uniform, glorot_normal, he_uniform, he_normal, "
                   "lecun_uniform, lecun_normal, zeros, ones, constant, random_uniform, "
                   "random_normal, truncated_normal)");
    }
    return Status::success();
}

}  // namespace td
