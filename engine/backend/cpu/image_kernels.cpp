#include "engine/backend/cpu/image_kernels.h"

#include "engine/backend/augment_math.h"
#include "engine/backend/cpu/simd_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace td::cpu {

namespace {

// The window of output position (oh, ow) clipped to the image: rows [h0, h1), columns [w0, w1).
struct Clip {
    int64_t h0, h1, w0, w1;
};
Clip clipWindow(const ConvGeometry& p, int64_t oh, int64_t ow) {
    const int64_t hs = oh * p.sh - p.padTop, ws = ow * p.sw - p.padLeft;
    return {std::max<int64_t>(hs, 0), std::min(hs + p.kh, p.H), std::max<int64_t>(ws, 0),
            std::min(ws + p.kw, p.W)};
}

constexpr int64_t kReduceBlocks = kChannelSumBlocks;

// sums[c] = the sum of f(row, c) over every row: kReduceBlocks blocks of rows, each summed in
// float (a few hundred rows of the CNN's activations), the blocks added in order in double.
template <class F>
void reduceRows(int64_t rows, int64_t C, double* sums, F f) {
    const int64_t blocks = std::min(kReduceBlocks, std::max<int64_t>(rows, 1));
    std::vector<float> part(static_cast<size_t>(blocks * C), 0.0f);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        float* s = part.data() + b * C;
        const int64_t r0 = rows * b / blocks, r1 = rows * (b + 1) / blocks;
        for (int64_t r = r0; r < r1; ++r)
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) s[c] += f(r, c);
    }
    for (int64_t c = 0; c < C; ++c) sums[c] = 0;
    for (int64_t b = 0; b < blocks; ++b)
        for (int64_t c = 0; c < C; ++c) sums[c] += part[static_cast<size_t>(b * C + c)];
}

// Two sums in one pass: f(row, c, a, b) adds to both.
template <class F>
void reduceRows2(int64_t rows, int64_t C, double* sumsA, double* sumsB, F f) {
    const int64_t blocks = std::min(kReduceBlocks, std::max<int64_t>(rows, 1));
    std::vector<float> part(static_cast<size_t>(2 * blocks * C), 0.0f);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        float* sa = part.data() + 2 * b * C;
        float* sb = sa + C;
        const int64_t r0 = rows * b / blocks, r1 = rows * (b + 1) / blocks;
        for (int64_t r = r0; r < r1; ++r)
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) f(r, c, sa[c], sb[c]);
    }
    for (int64_t c = 0; c < C; ++c) sumsA[c] = sumsB[c] = 0;
    for (int64_t b = 0; b < blocks; ++b)
        for (int64_t c = 0; c < C; ++c) {
            sumsA[c] += part[static_cast<size_t>(2 * b * C + c)];
            sumsB[c] += part[static_cast<size_t>(2 * b * C + C + c)];
        }
}

}  // namespace

void maxPool(const ConvGeometry& p, const float* x, float* y) {
    const auto window = simd::activeKernels().maxWindow;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < p.B; ++b)
        for (int64_t oh = 0; oh < p.OH; ++oh)
            for (int64_t ow = 0; ow < p.OW; ++ow) {
                const Clip w = clipWindow(p, oh, ow);
                float* out = y + ((b * p.OH + oh) * p.OW + ow) * p.C;
                if (w.h0 >= w.h1 || w.w0 >= w.w1) {
                    std::fill(out, out + p.C, -std::numeric_limits<float>::infinity());
                    continue;
                }
                window(x + ((b * p.H + w.h0) * p.W + w.w0) * p.C, out, w.h1 - w.h0, w.w1 - w.w0,
                       p.W * p.C, p.C);
            }
}

namespace {

// Max pooling's gradient where windows do not overlap (strides at least the window): every
// position of dx is written once, by the window that holds it (maxWindowGrad) or as a zero, one
// band of rows per (image, output row) in parallel; no clearing pass, no scatter.
void maxPoolGradDisjoint(const ConvGeometry& p, const float* dy, const float* x, float* dx) {
    const auto windowGrad = simd::activeKernels().maxWindowGrad;
    const int64_t rowElems = p.W * p.C;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < p.B; ++b)
        for (int64_t oh = 0; oh < p.OH; ++oh) {
            // The rows this output row owns: its stride's band, the first band from row 0 and the
            // last to the image's end.
            const int64_t bandTop = oh == 0 ? 0 : std::max<int64_t>(oh * p.sh - p.padTop, 0);
            const int64_t bandEnd =
                oh == p.OH - 1 ? p.H : std::min((oh + 1) * p.sh - p.padTop, p.H);
            const Clip rowsOf = clipWindow(p, oh, 0);
            const float* xb = x + b * p.H * rowElems;
            float* dxb = dx + b * p.H * rowElems;
            for (int64_t h = bandTop; h < bandEnd; ++h) {
                float* row = dxb + h * rowElems;
                if (h < rowsOf.h0 || h >= rowsOf.h1) {
                    std::memset(row, 0, static_cast<size_t>(rowElems) * sizeof(float));
                    continue;
                }
                // Columns of this row in no window: before the first, between two, after the last.
                int64_t covered = 0;
                for (int64_t ow = 0; ow < p.OW; ++ow) {
                    const Clip w = clipWindow(p, oh, ow);
                    if (w.w0 > covered)
                        std::memset(row + covered * p.C, 0,
                                    static_cast<size_t>((w.w0 - covered) * p.C) * sizeof(float));
                    covered = std::max(covered, w.w1);
                }
                if (covered < p.W)
                    std::memset(row + covered * p.C, 0,
                                static_cast<size_t>((p.W - covered) * p.C) * sizeof(float));
            }
            if (rowsOf.h0 >= rowsOf.h1) continue;
            for (int64_t ow = 0; ow < p.OW; ++ow) {
                const Clip w = clipWindow(p, oh, ow);
                if (w.w0 >= w.w1) continue;
                const int64_t at = (rowsOf.h0 * p.W + w.w0) * p.C;
                windowGrad(xb + at, dy + ((b * p.OH + oh) * p.OW + ow) * p.C, dxb + at,
                           rowsOf.h1 - rowsOf.h0, w.w1 - w.w0, rowElems, p.C);
            }
        }
}

}  // namespace

void maxPoolGrad(const ConvGeometry& p, const float* dy, const float* x, float* dx) {
    if (p.sh >= p.kh && p.sw >= p.kw) return maxPoolGradDisjoint(p, dy, x, dx);
    // One image per thread: windows of one image may overlap, images never do. Per window, the
    // running maximum and its position for every channel at once (the channels are contiguous);
    // a later position wins only when strictly greater: the first maximum in row-major order.
    const auto step = simd::activeKernels().maxArgStep;
#pragma omp parallel
    {
        std::vector<float> best(static_cast<size_t>(p.C));
        std::vector<int32_t> at(static_cast<size_t>(p.C));  // within the image
        float* bst = best.data();
        int32_t* pos = at.data();
#pragma omp for schedule(static)
        for (int64_t b = 0; b < p.B; ++b) {
            float* dxb = dx + b * p.H * p.W * p.C;
            std::memset(dxb, 0, static_cast<size_t>(p.H * p.W * p.C) * sizeof(float));
            for (int64_t oh = 0; oh < p.OH; ++oh)
                for (int64_t ow = 0; ow < p.OW; ++ow) {
                    const Clip w = clipWindow(p, oh, ow);
                    if (w.h0 >= w.h1 || w.w0 >= w.w1) continue;
                    bool first = true;
                    for (int64_t h = w.h0; h < w.h1; ++h)
                        for (int64_t ww = w.w0; ww < w.w1; ++ww) {
                            const auto base = static_cast<int32_t>((h * p.W + ww) * p.C);
                            const float* in = x + b * p.H * p.W * p.C + base;
                            if (first) {
#pragma omp simd
                                for (int64_t c = 0; c < p.C; ++c) {
                                    bst[c] = in[c];
                                    pos[c] = base + static_cast<int32_t>(c);
                                }
                                first = false;
                                continue;
                            }
                            step(in, bst, pos, p.C, base);
                        }
                    const float* g = dy + ((b * p.OH + oh) * p.OW + ow) * p.C;
                    for (int64_t c = 0; c < p.C; ++c) dxb[pos[c]] += g[c];
                }
        }
    }
}

void avgPool(const ConvGeometry& p, const float* x, float* y) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < p.B; ++b)
        for (int64_t oh = 0; oh < p.OH; ++oh)
            for (int64_t ow = 0; ow < p.OW; ++ow) {
                const Clip w = clipWindow(p, oh, ow);
                float* out = y + ((b * p.OH + oh) * p.OW + ow) * p.C;
                for (int64_t c = 0; c < p.C; ++c) out[c] = 0;
                for (int64_t h = w.h0; h < w.h1; ++h)
                    for (int64_t ww = w.w0; ww < w.w1; ++ww) {
                        const float* in = x + ((b * p.H + h) * p.W + ww) * p.C;
                        for (int64_t c = 0; c < p.C; ++c) out[c] += in[c];
                    }
                const float inv = 1.0f / static_cast<float>((w.h1 - w.h0) * (w.w1 - w.w0));
                for (int64_t c = 0; c < p.C; ++c) out[c] *= inv;
            }
}

void avgPoolGrad(const ConvGeometry& p, const float* dy, float* dx) {
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < p.B; ++b) {
        float* dxb = dx + b * p.H * p.W * p.C;
        std::memset(dxb, 0, static_cast<size_t>(p.H * p.W * p.C) * sizeof(float));
        for (int64_t oh = 0; oh < p.OH; ++oh)
            for (int64_t ow = 0; ow < p.OW; ++ow) {
                const Clip w = clipWindow(p, oh, ow);
                const float* g = dy + ((b * p.OH + oh) * p.OW + ow) * p.C;
                const float inv = 1.0f / static_cast<float>((w.h1 - w.h0) * (w.w1 - w.w0));
                for (int64_t h = w.h0; h < w.h1; ++h)
                    for (int64_t ww = w.w0; ww < w.w1; ++ww) {
                        float* d = dxb + (h * p.W + ww) * p.C;
                        for (int64_t c = 0; c < p.C; ++c) d[c] += g[c] * inv;
                    }
            }
    }
}

void pad2d(const float* x, float* y, int64_t B, int64_t H, int64_t W, int64_t C, int64_t top,
           int64_t bottom, int64_t left, int64_t right) {
    const int64_t OH = H + top + bottom, OW = W + left + right;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
        for (int64_t oh = 0; oh < OH; ++oh) {
            float* out = y + (b * OH + oh) * OW * C;
            const int64_t h = oh - top;
            if (h < 0 || h >= H) {
                std::memset(out, 0, static_cast<size_t>(OW * C) * sizeof(float));
                continue;
            }
            std::memset(out, 0, static_cast<size_t>(left * C) * sizeof(float));
            std::memcpy(out + left * C, x + (b * H + h) * W * C,
                        static_cast<size_t>(W * C) * sizeof(float));
            std::memset(out + (left + W) * C, 0, static_cast<size_t>(right * C) * sizeof(float));
        }
}

void pad2dGrad(const float* dy, float* dx, int64_t B, int64_t H, int64_t W, int64_t C, int64_t top,
               int64_t bottom, int64_t left, int64_t right) {
    const int64_t OH = H + top + bottom, OW = W + left + right;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
            std::memcpy(dx + (b * H + h) * W * C, dy + ((b * OH + h + top) * OW + left) * C,
                        static_cast<size_t>(W * C) * sizeof(float));
}

void addPieceSums(const float* pieceSums, int64_t pieces, int64_t C, float* sums) {
    for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int64_t b = 0; b < pieces; ++b) s += pieceSums[b * C + c];
        sums[c] = static_cast<float>(s);
    }
}

void channelSums(const float* x, float* sums, int64_t rows, int64_t C) {
    std::vector<double> s(static_cast<size_t>(C));
    reduceRows(rows, C, s.data(), [&](int64_t r, int64_t c) { return x[r * C + c]; });
    for (int64_t c = 0; c < C; ++c) sums[c] = static_cast<float>(s[static_cast<size_t>(c)]);
}

void scale(const float* x, float* y, int64_t n, float scale, float offset) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale + offset;
}

void channelMean(const float* x, float* mean, int64_t rows, int64_t C) {
    std::vector<double> s(static_cast<size_t>(C));
    reduceRows(rows, C, s.data(), [&](int64_t r, int64_t c) { return x[r * C + c]; });
    for (int64_t c = 0; c < C; ++c) mean[c] = static_cast<float>(s[static_cast<size_t>(c)] / rows);
}

void channelVar(const float* x, const float* mean, float* var, int64_t rows, int64_t C) {
    std::vector<double> s(static_cast<size_t>(C));
    reduceRows(rows, C, s.data(), [&](int64_t r, int64_t c) {
        const float d = x[r * C + c] - mean[c];
        return d * d;
    });
    for (int64_t c = 0; c < C; ++c) var[c] = static_cast<float>(s[static_cast<size_t>(c)] / rows);
}

void batchNorm(const float* x, const float* mean, const float* var, const float* gamma,
               const float* beta, float* y, int64_t rows, int64_t C, float eps) {
    // y = x * a + b with a = gamma / sqrt(var + eps), b = beta - mean * a.
    std::vector<float> a(static_cast<size_t>(C)), b(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
        a[static_cast<size_t>(c)] = (gamma ? gamma[c] : 1.0f) / std::sqrt(var[c] + eps);
        b[static_cast<size_t>(c)] = (beta ? beta[c] : 0.0f) - mean[c] * a[static_cast<size_t>(c)];
    }
    const float* pa = a.data();
    const float* pb = b.data();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * C;
        float* yr = y + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * pa[c] + pb[c];
    }
}

void batchNormGrad(const float* dy, const float* x, const float* mean, const float* var,
                   const float* gamma, float* dx, int64_t rows, int64_t C, float eps,
                   bool batchStats, float* sumDy, float* sumDyXhat) {
    std::vector<float> inv(static_cast<size_t>(C)), gi(static_cast<size_t>(C)),
        k1(static_cast<size_t>(C), 0.f), k2(static_cast<size_t>(C), 0.f);
    for (int64_t c = 0; c < C; ++c) {
        inv[size_t(c)] = 1.0f / std::sqrt(var[c] + eps);
        gi[size_t(c)] = (gamma ? gamma[c] : 1.0f) * inv[size_t(c)];
    }
    if (batchStats) {
        // sum(dy) and sum(dy * x_hat) in one pass over dy and x.
        std::vector<double> sdy(static_cast<size_t>(C)), sdyx(static_cast<size_t>(C));
        reduceRows2(rows, C, sdy.data(), sdyx.data(),
                    [&](int64_t r, int64_t c, float& a, float& b) {
                        const float g = dy[r * C + c];
                        a += g;
                        b += g * (x[r * C + c] - mean[c]) * inv[size_t(c)];
                    });
        for (int64_t c = 0; c < C; ++c) {
            k1[size_t(c)] = static_cast<float>(sdy[size_t(c)] / rows);
            k2[size_t(c)] = static_cast<float>(sdyx[size_t(c)] / rows);
            if (sumDy) sumDy[c] = static_cast<float>(sdy[size_t(c)]);
            if (sumDyXhat) sumDyXhat[c] = static_cast<float>(sdyx[size_t(c)]);
        }
    }
    const float* pi = inv.data();
    const float* pg = gi.data();
    const float* p1 = k1.data();
    const float* p2 = k2.data();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* g = dy + r * C;
        const float* xr = x + r * C;
        float* d = dx + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
            const float xhat = (xr[c] - mean[c]) * pi[c];
            d[c] = pg[c] * (g[c] - p1[c] - xhat * p2[c]);
        }
    }
}

void normGammaGrad(const float* dy, const float* x, const float* mean, const float* var,
                   float* dgamma, int64_t rows, int64_t C, float eps) {
    std::vector<float> inv(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) inv[static_cast<size_t>(c)] = 1.0f / std::sqrt(var[c] + eps);
    std::vector<double> s(static_cast<size_t>(C));
    reduceRows(rows, C, s.data(), [&](int64_t r, int64_t c) {
        return dy[r * C + c] * (x[r * C + c] - mean[c]) * inv[size_t(c)];
    });
    for (int64_t c = 0; c < C; ++c) dgamma[c] = static_cast<float>(s[static_cast<size_t>(c)]);
}

void movingAvg(float* param, const float* stat, int64_t n, float momentum) {
    for (int64_t i = 0; i < n; ++i) param[i] = param[i] * momentum + stat[i] * (1.0f - momentum);
}

namespace {
// Mean and 1 / sqrt(var + eps) of one row.
void rowStats(const float* x, int64_t C, float eps, float& mean, float& inv) {
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += x[c];
    const double m = s / C;
    double v = 0;
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    mean = static_cast<float>(m);
    inv = 1.0f / std::sqrt(static_cast<float>(v / C) + eps);
}
}  // namespace

void layerNorm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
               int64_t C, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        float mean, inv;
        rowStats(x + r * C, C, eps, mean, inv);
        const float* xr = x + r * C;
        float* yr = y + r * C;
        for (int64_t c = 0; c < C; ++c)
            yr[c] = (xr[c] - mean) * inv * (gamma ? gamma[c] : 1.0f) + (beta ? beta[c] : 0.0f);
    }
}

void layerNormGrad(const float* dy, const float* x, const float* gamma, float* dx, int64_t rows,
                   int64_t C, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        float mean, inv;
        const float* xr = x + r * C;
        const float* g = dy + r * C;
        rowStats(xr, C, eps, mean, inv);
        double s1 = 0, s2 = 0;  // mean of dy * gamma and of dy * gamma * x_hat
        for (int64_t c = 0; c < C; ++c) {
            const double gg = double(g[c]) * (gamma ? gamma[c] : 1.0f);
            s1 += gg;
            s2 += gg * (xr[c] - mean) * inv;
        }
        const float m1 = static_cast<float>(s1 / C), m2 = static_cast<float>(s2 / C);
        float* d = dx + r * C;
        for (int64_t c = 0; c < C; ++c) {
            const float gg = g[c] * (gamma ? gamma[c] : 1.0f);
            d[c] = inv * (gg - m1 - (xr[c] - mean) * inv * m2);
        }
    }
}

void layerNormGammaGrad(const float* dy, const float* x, float* dgamma, int64_t rows, int64_t C,
                        float eps) {
    std::vector<float> mean(static_cast<size_t>(rows)), inv(static_cast<size_t>(rows));
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
        rowStats(x + r * C, C, eps, mean[static_cast<size_t>(r)], inv[static_cast<size_t>(r)]);
    std::vector<double> s(static_cast<size_t>(C));
    reduceRows(rows, C, s.data(), [&](int64_t r, int64_t c) {
        return dy[r * C + c] * (x[r * C + c] - mean[size_t(r)]) * inv[size_t(r)];
    });
    for (int64_t c = 0; c < C; ++c) dgamma[c] = static_cast<float>(s[static_cast<size_t>(c)]);
}

// ---- image preprocessing and augmentation --------------------------------------------------

namespace {

// The samples are split over the OpenMP team only where the work pays for it: a batch of 64
// Fashion-MNIST images (50K values) takes well under a millisecond on one thread, and a team
// of two measured several times slower on a loaded two-core machine (its barrier waits for
// whichever thread another process displaced).
constexpr int64_t kTeamValues = int64_t(1) << 20;

template <class F>
void perSample(const AugmentSpec& a, F f) {
    const bool team = a.B * a.OH * a.OW * a.C >= kTeamValues;
#pragma omp parallel for schedule(static) if (team)
    for (int64_t b = 0; b < a.B; ++b) f(b);
}

// An affine augmentation: each sample's matrix from its key, then every output position sampled.
template <class MatrixFor>
void affine(const AugmentSpec& a, const float* x, float* y, int64_t step, int64_t sampleBase,
            kmath::AugmentSalt salt, MatrixFor matrixFor) {
    perSample(a, [&](int64_t b) {
        const kmath::Affine m = matrixFor(a, kmath::augmentKey(salt, a.seed, step, sampleBase + b));
        const float* img = x + b * a.H * a.W * a.C;
        float* out = y + b * a.OH * a.OW * a.C;
        if (m.a1 != 0.f || m.b0 != 0.f) {  // a rotation: every position its own taps
            for (int64_t oy = 0; oy < a.OH; ++oy)
                for (int64_t ox = 0; ox < a.OW; ++ox)
                    for (int64_t c = 0; c < a.C; ++c)
                        *out++ = kmath::affineSample(a, m, img, ox, oy, c);
            return;
        }
        // Zoom, translation: each column's and each row's taps once.
        std::vector<kmath::AxisTap> cols(static_cast<size_t>(a.OW));
        for (int64_t ox = 0; ox < a.OW; ++ox)
            cols[static_cast<size_t>(ox)] = kmath::axisTap(a, kmath::sourceX(m, ox, 0), a.W);
        for (int64_t oy = 0; oy < a.OH; ++oy) {
            const kmath::AxisTap row = kmath::axisTap(a, kmath::sourceY(m, 0, oy), a.H);
            for (int64_t ox = 0; ox < a.OW; ++ox)
                for (int64_t c = 0; c < a.C; ++c)
                    *out++ = kmath::tapSample(a, img, cols[static_cast<size_t>(ox)], row, c);
        }
    });
}

}  // namespace

void resize(const AugmentSpec& a, const float* x, float* y) {
    perSample(a, [&](int64_t b) {
        const float* img = x + b * a.H * a.W * a.C;
        float* out = y + b * a.OH * a.OW * a.C;
        for (int64_t oy = 0; oy < a.OH; ++oy)
            for (int64_t ox = 0; ox < a.OW; ++ox)
                for (int64_t c = 0; c < a.C; ++c) *out++ = kmath::resizeSample(a, img, oy, ox, c);
    });
}

void randomCrop(const AugmentSpec& a, const float* x, float* y, int64_t step, int64_t sampleBase) {
    perSample(a, [&](int64_t b) {
        int64_t top = 0, left = 0;
        kmath::cropOffset(a, kmath::augmentKey(kmath::kSaltCrop, a.seed, step, sampleBase + b), top,
                          left);
        for (int64_t oy = 0; oy < a.OH; ++oy)
            std::memcpy(y + (b * a.OH + oy) * a.OW * a.C,
                        x + ((b * a.H + top + oy) * a.W + left) * a.C,
                        static_cast<size_t>(a.OW * a.C) * sizeof(float));
    });
}

void randomFlip(const AugmentSpec& a, const float* x, float* y, int64_t step, int64_t sampleBase) {
    const bool horizontal = a.flip != FlipMode::Vertical, vertical = a.flip != FlipMode::Horizontal;
    const int64_t row = a.W * a.C;
    perSample(a, [&](int64_t b) {
        const bool flip =
            kmath::flipDrawn(kmath::augmentKey(kmath::kSaltFlip, a.seed, step, sampleBase + b));
        const float* img = x + b * a.H * row;
        float* out = y + b * a.H * row;
        if (!flip) {
            std::memcpy(out, img, static_cast<size_t>(a.H * row) * sizeof(float));
            return;
        }
        for (int64_t oy = 0; oy < a.H; ++oy) {
            const float* src = img + (vertical ? a.H - 1 - oy : oy) * row;
            float* dst = out + oy * row;
            if (!horizontal)
                std::memcpy(dst, src, static_cast<size_t>(row) * sizeof(float));
            else
                for (int64_t ox = 0; ox < a.W; ++ox)
                    for (int64_t c = 0; c < a.C; ++c)
                        dst[ox * a.C + c] = src[(a.W - 1 - ox) * a.C + c];
        }
    });
}

void randomRotation(const AugmentSpec& a, const float* x, float* y, int64_t step,
                    int64_t sampleBase) {
    affine(a, x, y, step, sampleBase, kmath::kSaltRotation, kmath::rotationFor);
}

void randomZoom(const AugmentSpec& a, const float* x, float* y, int64_t step, int64_t sampleBase) {
    affine(a, x, y, step, sampleBase, kmath::kSaltZoom, kmath::zoomFor);
}

void randomTranslation(const AugmentSpec& a, const float* x, float* y, int64_t step,
                       int64_t sampleBase) {
    affine(a, x, y, step, sampleBase, kmath::kSaltTranslation, kmath::translationFor);
}

void randomContrast(const AugmentSpec& a, const float* x, float* y, int64_t step,
                    int64_t sampleBase) {
    const int64_t pixels = a.H * a.W, n = pixels * a.C;
    perSample(a, [&](int64_t b) {
        const float* img = x + b * n;
        float* out = y + b * n;
        std::vector<double> sums(static_cast<size_t>(a.C), 0.0);
        for (int64_t p = 0; p < pixels; ++p)
            for (int64_t c = 0; c < a.C; ++c) sums[static_cast<size_t>(c)] += img[p * a.C + c];
        std::vector<float> mean(static_cast<size_t>(a.C));
        for (int64_t c = 0; c < a.C; ++c)
            mean[static_cast<size_t>(c)] =
                static_cast<float>(sums[static_cast<size_t>(c)] / static_cast<double>(pixels));
        const float factor = kmath::contrastFactor(
            a, kmath::augmentKey(kmath::kSaltContrast, a.seed, step, sampleBase + b));
        for (int64_t p = 0; p < pixels; ++p)
            for (int64_t c = 0; c < a.C; ++c)
                out[p * a.C + c] =
                    kmath::contrast(a, img[p * a.C + c], mean[static_cast<size_t>(c)], factor);
    });
}

void randomBrightness(const AugmentSpec& a, const float* x, float* y, int64_t step,
                      int64_t sampleBase) {
    const int64_t n = a.H * a.W * a.C;
    perSample(a, [&](int64_t b) {
        const float delta = kmath::brightnessDelta(
            a, kmath::augmentKey(kmath::kSaltBrightness, a.seed, step, sampleBase + b));
        for (int64_t i = b * n; i < (b + 1) * n; ++i) y[i] = kmath::brightness(a, x[i], delta);
    });
}

}  // namespace td::cpu
