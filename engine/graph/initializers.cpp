#include "engine/graph/initializers.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace td {
namespace {

// Keras' truncated normal redraws outside two standard deviations, which leaves a variance of
// 0.87962566103423978^2 of the untruncated one; variance scaling divides by it to compensate.
constexpr double kTruncatedStddev = 0.87962566103423978;

struct Fans {
    double in = 1, out = 1;
};

// keras.src.initializers.random_initializers.compute_fans: with both axis lists, the products of
// those dimensions (Python indexing: -1 is the last); otherwise by rank.
Result<Fans> computeFans(const Shape& shape, const InitializerSpec& spec) {
    if (!spec.inputAxes.empty() && !spec.outputAxes.empty()) {
        const auto rank = static_cast<int64_t>(shape.size());
        Fans f;
        for (int pass = 0; pass < 2; ++pass) {
            double fan = 1;
            for (int64_t axis : pass == 0 ? spec.inputAxes : spec.outputAxes) {
                if (axis < -rank || axis >= rank)
                    return err(std::string(pass == 0 ? "input_axes" : "output_axes") + ": axis " +
                               std::to_string(axis) + " is out of range for a " +
                               "parameter of shape " + shapeToString(shape));
                fan *= double(shape[static_cast<size_t>(axis < 0 ? axis + rank : axis)]);
            }
            (pass == 0 ? f.in : f.out) = fan;
        }
        return f;
    }
    if (shape.empty()) return Fans{};
    if (shape.size() == 1) return Fans{double(shape[0]), double(shape[0])};
    if (shape.size() == 2) return Fans{double(shape[0]), double(shape[1])};
    double receptive = 1;
    for (size_t i = 0; i + 2 < shape.size(); ++i) receptive *= double(shape[i]);
    return Fans{double(shape[shape.size() - 2]) * receptive, double(shape.back()) * receptive};
}

// The variance-scaling family by name: scale, mode, distribution.
struct VarianceScaling {
    double scale;
    const char* mode;
    const char* distribution;
};

bool namedVarianceScaling(const std::string& k, VarianceScaling* out) {
    static const struct {
        const char* name;
        VarianceScaling vs;
    } table[] = {
        {"glorot_uniform", {1.0, "fan_avg", "uniform"}},
        {"glorot_normal", {1.0, "fan_avg", "truncated_normal"}},
        {"he_uniform", {2.0, "fan_in", "uniform"}},
        {"he_normal", {2.0, "fan_in", "truncated_normal"}},
        {"lecun_uniform", {1.0, "fan_in", "uniform"}},
        {"lecun_normal", {1.0, "fan_in", "truncated_normal"}},
    };
    for (const auto& e : table)
        if (k == e.name) {
            *out = e.vs;
            return true;
        }
    return false;
}

// Keras Orthogonal: the Q of a QR decomposition of a normal [max(r, c), min(r, c)] matrix, with
// the signs of R's diagonal folded in (which makes it the Gram-Schmidt basis, R's diagonal > 0),
// transposed when there are fewer rows than columns, times gain. Rows are the product of every
// dimension but the last.
Status orthogonal(float* w, const Shape& shape, double gain, std::mt19937_64& rng) {
    if (shape.size() < 2)
        return err("orthogonal needs a parameter of at least two dimensions, got " +
                   shapeToString(shape));
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
    const int64_t cols = shape.back();
    const int64_t m = std::max(rows, cols), n = std::min(rows, cols);
    std::normal_distribution<double> normal(0.0, 1.0);
    // Column-major [m, n]: column j is q[j * m, (j + 1) * m).
    std::vector<double> q(static_cast<size_t>(m * n));
    for (double& x : q) x = normal(rng);
    for (int64_t j = 0; j < n; ++j) {
        double* cj = q.data() + j * m;
        // Two passes of modified Gram-Schmidt keep the columns orthogonal to double precision.
        for (int pass = 0; pass < 2; ++pass) {
            for (int64_t k = 0; k < j; ++k) {
                const double* ck = q.data() + k * m;
                double dot = 0;
                for (int64_t i = 0; i < m; ++i) dot += ck[i] * cj[i];
                for (int64_t i = 0; i < m; ++i) cj[i] -= dot * ck[i];
            }
        }
        double norm = 0;
        for (int64_t i = 0; i < m; ++i) norm += cj[i] * cj[i];
        norm = std::sqrt(norm);
        if (!(norm > 0)) return err("orthogonal: degenerate random matrix; use another seed");
        for (int64_t i = 0; i < m; ++i) cj[i] /= norm;
    }
    // Q is [m, n]; the parameter is [rows, cols] row-major: Q itself when rows >= cols, else Q^T.
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
            const double v = rows >= cols ? q[static_cast<size_t>(c * m + r)]
                                          : q[static_cast<size_t>(r * m + c)];
            w[r * cols + c] = static_cast<float>(gain * v);
        }
    return Status::success();
}

}  // namespace

Status initializeParam(float* w, const Shape& shape, const InitializerSpec& spec, uint64_t seed) {
    const int64_t n = numElements(shape);
    std::mt19937_64 rng(spec.seed ? *spec.seed : seed);
    const std::string& k = spec.name;
    auto uniform = [&](double lo, double hi) {
        std::uniform_real_distribution<double> d(lo, hi);
        for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(d(rng));
    };
    auto normal = [&](double mean, double stddev) {
        std::normal_distribution<double> d(mean, stddev);
        for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(d(rng));
    };
    auto truncated = [&](double mean, double stddev) {
        std::normal_distribution<double> d(0.0, 1.0);
        for (int64_t i = 0; i < n; ++i) {
            double z;
            do z = d(rng);
            while (std::fabs(z) > 2.0);
            w[i] = static_cast<float>(mean + stddev * z);
        }
    };
    auto fill = [&](double v) {
        for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(v);
    };

    VarianceScaling vs{spec.scale, spec.mode.c_str(), spec.distribution.c_str()};
    if (namedVarianceScaling(k, &vs) || k == "variance_scaling") {
        const std::string mode = vs.mode, distribution = vs.distribution;
        if (!(vs.scale > 0))
            return err(k + ": scale must be positive, got " + std::to_string(vs.scale));
        auto fansOr = computeFans(shape, spec);
        if (!fansOr.ok()) return err(k + ": " + fansOr.error());
        const Fans fans = *fansOr;
        double scale = vs.scale;
        if (mode == "fan_in") {
            scale /= std::max(1.0, fans.in);
        } else if (mode == "fan_out") {
            scale /= std::max(1.0, fans.out);
        } else if (mode == "fan_avg") {
            scale /= std::max(1.0, 0.5 * (fans.in + fans.out));
        } else {
            return err(k + ": unknown mode '" + mode + "' (expected fan_in, fan_out or fan_avg)");
        }
        if (distribution == "truncated_normal") {
            truncated(0.0, std::sqrt(scale) / kTruncatedStddev);
        } else if (distribution == "untruncated_normal") {
            normal(0.0, std::sqrt(scale));
        } else if (distribution == "uniform") {
            const double limit = std::sqrt(3.0 * scale);
            uniform(-limit, limit);
        } else {
            return err(k + ": unknown distribution '" + distribution +
                       "' (expected truncated_normal, untruncated_normal or uniform)");
        }
    } else if (k == "zeros") {
        fill(0.0);
    } else if (k == "ones") {
        fill(1.0);
    } else if (k == "constant") {
        fill(spec.value);
    } else if (k == "random_uniform") {
        uniform(spec.minval, spec.maxval);
    } else if (k == "random_normal") {
        normal(spec.mean, spec.stddev);
    } else if (k == "truncated_normal") {
        truncated(spec.mean, spec.stddev);
    } else if (k == "orthogonal") {
        return orthogonal(w, shape, spec.gain, rng);
    } else if (k == "identity") {
        if (shape.size() != 2)
            return err("identity needs a matrix (two dimensions), got " + shapeToString(shape));
        fill(0.0);
        for (int64_t i = 0; i < std::min(shape[0], shape[1]); ++i)
            w[i * shape[1] + i] = static_cast<float>(spec.gain);
    } else {
        return err("unknown initializer '" + k +
                   "' (expected glorot_uniform, glorot_normal, he_uniform, he_normal, "
                   "lecun_uniform, lecun_normal, variance_scaling, zeros, ones, constant, "
                   "random_uniform, random_normal, truncated_normal, orthogonal, identity)");
    }
    return Status::success();
}

}  // namespace td
