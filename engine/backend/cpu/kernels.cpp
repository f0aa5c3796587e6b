#include "engine/backend/cpu/kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/backend/cpu/simd_kernels.h"
#include "engine/backend/kernel_math.h"
#include "engine/core/result.h"

namespace td::cpu {

namespace {
constexpr float kEps = 1e-7f;  // Keras backend epsilon
// Above this many elements an elementwise kernel splits across threads; below, OpenMP's fork
// costs more than the work.
constexpr int64_t kParallelMin = 1 << 16;

// f(i) for every i in [0, n): split across the OpenMP team above kParallelMin, else a plain loop
// on this thread. `omp parallel for if (false)` still enters the runtime and forms a team of one,
// 0.31-0.40 us a call measured on a 2-core AVX-512 machine, paid by every small instruction of
// every step (two a step on the seed MLP at batch 32). forEachSimd also asks for vectors.
template <class F>
inline void forEach(int64_t n, F&& f) {
    if (n > kParallelMin) {
#pragma omp parallel for
        for (int64_t i = 0; i < n; ++i) f(i);
    } else {
        for (int64_t i = 0; i < n; ++i) f(i);
    }
}
// f(r) for every row r of a [rows, cols] operand, split across the team as forEach splits.
template <class F>
inline void forRows(int64_t rows, int64_t cols, F&& f) {
    if (rows * cols > kParallelMin) {
#pragma omp parallel for
        for (int64_t r = 0; r < rows; ++r) f(r);
    } else {
        for (int64_t r = 0; r < rows; ++r) f(r);
    }
}
template <class F>
inline void forEachSimd(int64_t n, F&& f) {
    if (n > kParallelMin) {
#pragma omp parallel for simd
        for (int64_t i = 0; i < n; ++i) f(i);
    } else {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) f(i);
    }
}

using kmath::sigmoid;
}  // namespace

void activation(ActKind k, float alpha, const float* x, float* y, int64_t rows, int64_t cols) {
    const int64_t n = rows * cols;
    switch (k) {
        case ActKind::Linear:
            std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
            return;
        case ActKind::Relu:
            forEachSimd(n, [&](int64_t i) { y[i] = x[i] > 0.f ? x[i] : 0.f; });
            return;
        case ActKind::LeakyRelu:
            forEachSimd(n, [&](int64_t i) { y[i] = x[i] > 0.f ? x[i] : alpha * x[i]; });
            return;
        case ActKind::Elu:
            forEach(n, [&](int64_t i) { y[i] = kmath::elu(x[i], alpha); });
            return;
        case ActKind::Gelu:
            forEach(n, [&](int64_t i) { y[i] = kmath::gelu(x[i]); });
            return;
        case ActKind::Sigmoid:
            forEach(n, [&](int64_t i) { y[i] = sigmoid(x[i]); });
            return;
        case ActKind::Tanh:
            forEach(n, [&](int64_t i) { y[i] = std::tanh(x[i]); });
            return;
        case ActKind::Softmax:
            for (int64_t r = 0; r < rows; ++r) {
                const float* xr = x + r * cols;
                float* yr = y + r * cols;
                float m = xr[0];
                for (int64_t c = 1; c < cols; ++c) m = std::max(m, xr[c]);
                float s = 0.f;
                for (int64_t c = 0; c < cols; ++c) s += (yr[c] = std::exp(xr[c] - m));
                const float inv = 1.0f / s;
                for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
            }
            return;
    }
}

void activationGrad(ActKind k, float alpha, bool usesOutput, const float* dy, const float* s,
                    float* dx, int64_t rows, int64_t cols) {
    const int64_t n = rows * cols;
    switch (k) {
        case ActKind::Linear:
            std::memcpy(dx, dy, static_cast<size_t>(n) * sizeof(float));
            return;
        case ActKind::Relu: {  // s = y or x: both are > 0 exactly where the unit is active
            const auto loop = simd::activeKernels().reluGrad;
            if (n <= kParallelMin) {
                loop(dy, s, dx, n);
                return;
            }
#pragma omp parallel
            {
                const int64_t t = omp_get_num_threads(), me = omp_get_thread_num();
                const int64_t lo = n * me / t, hi = n * (me + 1) / t;
                loop(dy + lo, s + lo, dx + lo, hi - lo);
            }
            return;
        }
        case ActKind::LeakyRelu:
            forEachSimd(n, [&](int64_t i) { dx[i] = s[i] > 0.f ? dy[i] : alpha * dy[i]; });
            return;
        case ActKind::Elu:
            if (usesOutput) {
                for (int64_t i = 0; i < n; ++i)
                    dx[i] = kmath::eluGradFromOutput(dy[i], s[i], alpha);
            } else {
                forEach(n, [&](int64_t i) { dx[i] = kmath::eluGrad(dy[i], s[i], alpha); });
            }
            return;
        case ActKind::Gelu:
            TD_ASSERT(!usesOutput);
            forEach(n, [&](int64_t i) { dx[i] = kmath::geluGrad(dy[i], s[i]); });
            return;
        case ActKind::Sigmoid:
            if (usesOutput) {
                forEachSimd(n, [&](int64_t i) { dx[i] = dy[i] * s[i] * (1.f - s[i]); });
            } else {
                for (int64_t i = 0; i < n; ++i) dx[i] = kmath::sigmoidGrad(dy[i], sigmoid(s[i]));
            }
            return;
        case ActKind::Tanh:
            if (usesOutput) {
                forEachSimd(n, [&](int64_t i) { dx[i] = dy[i] * (1.f - s[i] * s[i]); });
            } else {
                for (int64_t i = 0; i < n; ++i) dx[i] = kmath::tanhGrad(dy[i], std::tanh(s[i]));
            }
            return;
        case ActKind::Softmax:
            TD_ASSERT(usesOutput);
            for (int64_t r = 0; r < rows; ++r) {
                const float* yr = s + r * cols;
                const float* gr = dy + r * cols;
                float dot = 0.f;
                for (int64_t c = 0; c < cols; ++c) dot += gr[c] * yr[c];
                for (int64_t c = 0; c < cols; ++c) dx[r * cols + c] = yr[c] * (gr[c] - dot);
            }
            return;
    }
}

void biasAdd(const float* x, const float* b, float* y, int64_t rows, int64_t cols) {
    forRows(rows, cols, [&](int64_t r) {
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = x[r * cols + c] + b[c];
    });
}

void biasGrad(const float* dy, float* db, int64_t rows, int64_t cols) {
    std::memset(db, 0, static_cast<size_t>(cols) * sizeof(float));
    for (int64_t r = 0; r < rows; ++r) {
        const float* g = dy + r * cols;
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) db[c] += g[c];
    }
}

float keyedUniform(uint64_t seed, int64_t step, int64_t sample, int64_t col) {
    const uint32_t h24 = kmath::dropoutHash24(kmath::dropoutRowBase(seed, step, sample), col);
    return static_cast<float>(h24) * (1.0f / 16777216.0f);
}

void dropout(const float* x, float* y, int64_t rows, int64_t cols, float rate, uint64_t seed,
             int64_t step, int64_t sampleBase) {
    const float keepScale = 1.0f / (1.0f - rate);
    // Threshold on the top 24 bits of the keyed hash, as keyedUniform() computes it.
    const uint32_t threshold = kmath::dropoutThreshold(rate);
    // The column loop needs a 32-bit lane multiply, which the baseline x86-64 lacks.
    const auto rowLoop = simd::activeKernels().dropoutRow;
    forRows(rows, cols, [&](int64_t r) {
        const uint32_t base = kmath::dropoutRowBase(seed, step, sampleBase + r);
        rowLoop(x + r * cols, y + r * cols, cols, base, threshold, keepScale);
    });
}

void add(const float* a, const float* b, float* y, int64_t n) {
    forEachSimd(n, [&](int64_t i) { y[i] = a[i] + b[i]; });
}

namespace {
// Softmax's exponentials for every row at once: each row's max m (maxes[r]), exp(x - m) into e
// (rows * cols, apart from x) and their sum in column order (sums[r]). Softmax cross-entropy's loss
// and gradient both start from these, the same operations in the same order. The shifted values are
// written first and exponentiated in one call over all rows (simd::expShifted, vectorised): rows of
// a few classes are too short for a vector loop each.
void rowExps(const float* x, int64_t rows, int64_t cols, float* e, float* maxes, float* sums) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* p = x + r * cols;
        float m = p[0];
        for (int64_t c = 1; c < cols; ++c) m = std::max(m, p[c]);
        maxes[r] = m;
        float* q = e + r * cols;
        for (int64_t c = 0; c < cols; ++c) q[c] = p[c] - m;
    }
    simd::activeKernels().expShifted(e, 0.f, e, rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
        const float* q = e + r * cols;
        float s = 0.f;
        for (int64_t c = 0; c < cols; ++c) s += q[c];
        sums[r] = s;
    }
}

// Per-thread room for rowExps' results where the caller has none.
struct RowExpScratch {
    std::vector<float> e, maxes, sums;
    void size(int64_t rows, int64_t cols, bool withE) {
        if (withE) e.resize(static_cast<size_t>(rows * cols));
        maxes.resize(static_cast<size_t>(rows));
        sums.resize(static_cast<size_t>(rows));
    }
};
RowExpScratch& rowExpScratch() {
    thread_local RowExpScratch s;
    return s;
}

// One row's softmax cross-entropy from its log-sum-exp: sparse (class id y) or one-hot (yRow).
inline double softmaxXentRow(LossKind k, const float* p, int64_t cols, float lse, int32_t y,
                             const float* yRow) {
    if (k == LossKind::SparseSoftmaxXent) return lse - p[y];
    double l = 0.0;
    for (int64_t c = 0; c < cols; ++c) l += yRow[c] * (lse - p[c]);
    return l;
}

// One row's softmax cross-entropy gradient, g holding exp(p - max) summing to s on entry.
inline void softmaxXentGradRow(LossKind k, float* g, int64_t cols, float s, float scale, int32_t y,
                               const float* yRow) {
    const float inv = scale / s;
    if (k == LossKind::SparseSoftmaxXent) {
        for (int64_t c = 0; c < cols; ++c) g[c] *= inv;
        g[y] -= scale;
    } else {
        float ysum = 0.f;
        for (int64_t c = 0; c < cols; ++c) ysum += yRow[c];
        for (int64_t c = 0; c < cols; ++c) g[c] = g[c] * inv * ysum - scale * yRow[c];
    }
}
inline float clampP(float p) {
    return std::min(std::max(p, kEps), 1.f - kEps);
}
}  // namespace

void loss(LossKind k, const float* pred, const void* labels, float* out, int64_t rows, int64_t cols,
          float scale) {
    const int32_t* yi = static_cast<const int32_t*>(labels);
    const float* yf = static_cast<const float*>(labels);
    RowExpScratch& ex = rowExpScratch();
    if (k == LossKind::SparseSoftmaxXent || k == LossKind::SoftmaxXent) {
        ex.size(rows, cols, true);
        rowExps(pred, rows, cols, ex.e.data(), ex.maxes.data(), ex.sums.data());
    }
    // log-sum-exp of row r.
    const auto lse = [&ex](int64_t r) {
        return ex.maxes[static_cast<size_t>(r)] + std::log(ex.sums[static_cast<size_t>(r)]);
    };
    double total = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
        const float* p = pred + r * cols;
        double l = 0.0;
        switch (k) {
            case LossKind::SparseSoftmaxXent:
                l = softmaxXentRow(k, p, cols, lse(r), yi[r], nullptr);
                break;
            case LossKind::SoftmaxXent:
                l = softmaxXentRow(k, p, cols, lse(r), 0, yf + r * cols);
                break;
            case LossKind::SparseXent: {
                float s = 0.f;
                for (int64_t c = 0; c < cols; ++c) s += p[c];
                l = -std::log(clampP(p[yi[r]] / s));
                break;
            }
            case LossKind::Xent: {
                float s = 0.f;
                for (int64_t c = 0; c < cols; ++c) s += p[c];
                for (int64_t c = 0; c < cols; ++c)
                    l -= yf[r * cols + c] * std::log(clampP(p[c] / s));
                break;
            }
            case LossKind::SigmoidBce:
                for (int64_t c = 0; c < cols; ++c) {
                    const float x = p[c], y = yf[r * cols + c];
                    l += std::max(x, 0.f) - x * y + std::log1p(std::exp(-std::fabs(x)));
                }
                l /= static_cast<double>(cols);
                break;
            case LossKind::Bce:
                for (int64_t c = 0; c < cols; ++c) {
                    const float q = clampP(p[c]), y = yf[r * cols + c];
                    l -= y * std::log(q) + (1.f - y) * std::log(1.f - q);
                }
                l /= static_cast<double>(cols);
                break;
            case LossKind::Mse:
                for (int64_t c = 0; c < cols; ++c) {
                    const double d = static_cast<double>(p[c]) - yf[r * cols + c];
                    l += d * d;
                }
                l /= static_cast<double>(cols);
                break;
        }
        total += l;
    }
    out[0] = static_cast<float>(total * scale);
}

void lossGrad(LossKind k, const float* pred, const void* labels, float* dp, int64_t rows,
              int64_t cols, float scale) {
    const int32_t* yi = static_cast<const int32_t*>(labels);
    const float* yf = static_cast<const float*>(labels);
    const float invCols = 1.0f / static_cast<float>(cols);
    RowExpScratch& ex = rowExpScratch();
    if (k == LossKind::SparseSoftmaxXent || k == LossKind::SoftmaxXent) {
        ex.size(rows, cols, false);
        rowExps(pred, rows, cols, dp, ex.maxes.data(), ex.sums.data());
    }
    for (int64_t r = 0; r < rows; ++r) {
        const float* p = pred + r * cols;
        float* g = dp + r * cols;
        switch (k) {
            case LossKind::SparseSoftmaxXent:
            case LossKind::SoftmaxXent: {
                const bool sparse = k == LossKind::SparseSoftmaxXent;
                const float s = ex.sums[static_cast<size_t>(r)];
                softmaxXentGradRow(k, g, cols, s, scale, sparse ? yi[r] : 0,
                                   sparse ? nullptr : yf + r * cols);
                break;
            }
            case LossKind::SparseXent:
            case LossKind::Xent: {
                float s = 0.f;
                for (int64_t c = 0; c < cols; ++c) s += p[c];
                // loss = -sum_j y_j log(clip(p_j / s)); unclipped terms contribute
                // -y_k/p_k to dp_k and +y_j/s to every dp_k.
                float common = 0.f;
                for (int64_t c = 0; c < cols; ++c) {
                    const float y =
                        k == LossKind::SparseXent ? (c == yi[r] ? 1.f : 0.f) : yf[r * cols + c];
                    const float q = p[c] / s;
                    const bool live = q > kEps && q < 1.f - kEps;
                    g[c] = live ? -y / p[c] : 0.f;
                    if (live) common += y;
                }
                for (int64_t c = 0; c < cols; ++c) g[c] = (g[c] + common / s) * scale;
                break;
            }
            case LossKind::SigmoidBce:
                for (int64_t c = 0; c < cols; ++c)
                    g[c] = (sigmoid(p[c]) - yf[r * cols + c]) * invCols * scale;
                break;
            case LossKind::Bce:
                for (int64_t c = 0; c < cols; ++c) {
                    const float y = yf[r * cols + c];
                    const bool live = p[c] > kEps && p[c] < 1.f - kEps;
                    g[c] = live ? (-y / p[c] + (1.f - y) / (1.f - p[c])) * invCols * scale : 0.f;
                }
                break;
            case LossKind::Mse:
                for (int64_t c = 0; c < cols; ++c)
                    g[c] = 2.f * (p[c] - yf[r * cols + c]) * invCols * scale;
                break;
        }
    }
}

void metric(MetricKind k, int64_t topK, bool onLogits, const float* pred, const void* labels,
            float* out, int64_t rows, int64_t cols) {
    const int32_t* yi = static_cast<const int32_t*>(labels);
    const float* yf = static_cast<const float*>(labels);
    double correct = 0.0;
    auto argmax = [cols](const float* v) {
        int64_t best = 0;
        for (int64_t c = 1; c < cols; ++c)
            if (v[c] > v[best]) best = c;
        return best;
    };
    for (int64_t r = 0; r < rows; ++r) {
        const float* p = pred + r * cols;
        switch (k) {
            case MetricKind::SparseCategorical:
                correct += argmax(p) == yi[r] ? 1 : 0;
                break;
            case MetricKind::Categorical:
                correct += argmax(p) == argmax(yf + r * cols) ? 1 : 0;
                break;
            case MetricKind::Binary: {
                const float thr = onLogits ? 0.f : 0.5f;
                int64_t ok = 0;
                for (int64_t c = 0; c < cols; ++c)
                    ok += (p[c] > thr) == (yf[r * cols + c] > 0.5f) ? 1 : 0;
                correct += static_cast<double>(ok) / static_cast<double>(cols);
                break;
            }
            case MetricKind::SparseTopK:
            case MetricKind::TopK: {
                const int64_t y = k == MetricKind::SparseTopK ? yi[r] : argmax(yf + r * cols);
                int64_t greater = 0;
                for (int64_t c = 0; c < cols; ++c) greater += p[c] > p[y] ? 1 : 0;
                correct += greater < topK ? 1 : 0;
                break;
            }
        }
    }
    out[0] = static_cast<float>(correct);
}

void regLoss(const float* w, int64_t n, float l1, float l2, float* out) {
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < n; ++i) {
        s1 += std::fabs(w[i]);
        s2 += static_cast<double>(w[i]) * w[i];
    }
    out[0] = static_cast<float>(l1 * s1 + l2 * s2);
}

void regGrad(const float* g, const float* w, float* out, int64_t n, float l1, float l2) {
    forEachSimd(n, [&](int64_t i) {
        const float sgn = w[i] > 0.f ? 1.f : (w[i] < 0.f ? -1.f : 0.f);
        out[i] = g[i] + l1 * sgn + 2.f * l2 * w[i];
    });
}

}  // namespace td::cpu
