// Image and normalization kernels of the CUDA device (cuda_kernels.h), f32, channels-last, with
// the CPU backend's semantics (cpu/image_kernels.cpp): pooling windows clipped to the image,
// the first maximum of a window takes its gradient, channel statistics summed in fixed row
// blocks. Gradients of windowed ops are gathered (each input position sums what reaches it), so
// nothing is added atomically and results do not depend on timing.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "engine/backend/augment_math.h"
#include "engine/backend/cuda/cuda_common.cuh"
#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/kernel_math.h"

namespace td::cuda {

using namespace detail;

namespace {

// The window of output position (oh, ow) clipped to the image: rows [h0, h1), columns [w0, w1).
struct Clip {
    int64_t h0, h1, w0, w1;
};
__device__ inline Clip clipWindow(const ConvGeometry& p, int64_t oh, int64_t ow) {
    const int64_t hs = oh * p.sh - p.padTop, ws = ow * p.sw - p.padLeft;
    return {hs > 0 ? hs : 0, hs + p.kh < p.H ? hs + p.kh : p.H, ws > 0 ? ws : 0,
            ws + p.kw < p.W ? ws + p.kw : p.W};
}

// Output positions along one axis whose window (start o * stride - pad, length k) holds i.
__device__ inline void windowsHolding(int64_t i, int64_t pad, int64_t k, int64_t stride,
                                      int64_t outLen, int64_t& lo, int64_t& hi) {
    const int64_t t = i + pad - k + 1;  // o * stride >= t
    lo = t <= 0 ? 0 : (t + stride - 1) / stride;
    hi = (i + pad) / stride;  // o * stride <= i + pad
    if (hi > outLen - 1) hi = outLen - 1;
}

__global__ void maxPoolKernel(ConvGeometry p, const float* x, float* y) {
    TD_GRID_STRIDE(i, p.B * p.OH * p.OW * p.C) {
        const int64_t c = i % p.C;
        int64_t t = i / p.C;
        const int64_t ow = t % p.OW;
        t /= p.OW;
        const int64_t oh = t % p.OH, b = t / p.OH;
        const Clip w = clipWindow(p, oh, ow);
        float m = -INFINITY;
        for (int64_t h = w.h0; h < w.h1; ++h)
            for (int64_t ww = w.w0; ww < w.w1; ++ww)
                m = fmaxf(m, x[((b * p.H + h) * p.W + ww) * p.C + c]);
        y[i] = m;
    }
}

// dx[b,h,w,c]: the dy of every window whose first maximum (row-major) is this position.
__global__ void maxPoolGradKernel(ConvGeometry p, const float* dy, const float* x, float* dx) {
    TD_GRID_STRIDE(i, p.B * p.H * p.W * p.C) {
        const int64_t c = i % p.C;
        int64_t t = i / p.C;
        const int64_t w0 = t % p.W;
        t /= p.W;
        const int64_t h0 = t % p.H, b = t / p.H;
        int64_t ohLo, ohHi, owLo, owHi;
        windowsHolding(h0, p.padTop, p.kh, p.sh, p.OH, ohLo, ohHi);
        windowsHolding(w0, p.padLeft, p.kw, p.sw, p.OW, owLo, owHi);
        float sum = 0.f;
        for (int64_t oh = ohLo; oh <= ohHi; ++oh)
            for (int64_t ow = owLo; ow <= owHi; ++ow) {
                const Clip w = clipWindow(p, oh, ow);
                float best = 0.f;
                int64_t bh = -1, bw = -1;
                for (int64_t h = w.h0; h < w.h1; ++h)
                    for (int64_t ww = w.w0; ww < w.w1; ++ww) {
                        const float v = x[((b * p.H + h) * p.W + ww) * p.C + c];
                        if (bh < 0 || v > best) {
                            best = v;
                            bh = h;
                            bw = ww;
                        }
                    }
                if (bh == h0 && bw == w0) sum += dy[((b * p.OH + oh) * p.OW + ow) * p.C + c];
            }
        dx[i] = sum;
    }
}

__global__ void avgPoolKernel(ConvGeometry p, const float* x, float* y) {
    TD_GRID_STRIDE(i, p.B * p.OH * p.OW * p.C) {
        const int64_t c = i % p.C;
        int64_t t = i / p.C;
        const int64_t ow = t % p.OW;
        t /= p.OW;
        const int64_t oh = t % p.OH, b = t / p.OH;
        const Clip w = clipWindow(p, oh, ow);
        float s = 0.f;
        for (int64_t h = w.h0; h < w.h1; ++h)
            for (int64_t ww = w.w0; ww < w.w1; ++ww) s += x[((b * p.H + h) * p.W + ww) * p.C + c];
        y[i] = s * (1.0f / static_cast<float>((w.h1 - w.h0) * (w.w1 - w.w0)));
    }
}

__global__ void avgPoolGradKernel(ConvGeometry p, const float* dy, float* dx) {
    TD_GRID_STRIDE(i, p.B * p.H * p.W * p.C) {
        const int64_t c = i % p.C;
        int64_t t = i / p.C;
        const int64_t w0 = t % p.W;
        t /= p.W;
        const int64_t h0 = t % p.H, b = t / p.H;
        int64_t ohLo, ohHi, owLo, owHi;
        windowsHolding(h0, p.padTop, p.kh, p.sh, p.OH, ohLo, ohHi);
        windowsHolding(w0, p.padLeft, p.kw, p.sw, p.OW, owLo, owHi);
        float sum = 0.f;
        for (int64_t oh = ohLo; oh <= ohHi; ++oh)
            for (int64_t ow = owLo; ow <= owHi; ++ow) {
                const Clip w = clipWindow(p, oh, ow);
                const float inv = 1.0f / static_cast<float>((w.h1 - w.h0) * (w.w1 - w.w0));
                sum += dy[((b * p.OH + oh) * p.OW + ow) * p.C + c] * inv;
            }
        dx[i] = sum;
    }
}

__global__ void pad2dKernel(const float* x, float* y, int64_t B, int64_t H, int64_t W, int64_t C,
                            int64_t top, int64_t left, int64_t OH, int64_t OW) {
    TD_GRID_STRIDE(i, B * OH * OW * C) {
        const int64_t c = i % C;
        int64_t t = i / C;
        const int64_t ow = t % OW;
        t /= OW;
        const int64_t oh = t % OH, b = t / OH;
        const int64_t h = oh - top, w = ow - left;
        y[i] = h >= 0 && h < H && w >= 0 && w < W ? x[((b * H + h) * W + w) * C + c] : 0.f;
    }
}

__global__ void pad2dGradKernel(const float* dy, float* dx, int64_t B, int64_t H, int64_t W,
                                int64_t C, int64_t top, int64_t left, int64_t OH, int64_t OW) {
    TD_GRID_STRIDE(i, B * H * W * C) {
        const int64_t c = i % C;
        int64_t t = i / C;
        const int64_t w = t % W;
        t /= W;
        const int64_t h = t % H, b = t / H;
        dx[i] = dy[((b * OH + h + top) * OW + w + left) * C + c];
    }
}

__global__ void scaleKernel(const float* x, float* y, int64_t n, float scale, float offset) {
    TD_GRID_STRIDE(i, n) {
        y[i] = x[i] * scale + offset;
    }
}

__global__ void batchNormKernel(const float* x, const float* mean, const float* var,
                                const float* gamma, const float* beta, float* y, int64_t rows,
                                int64_t C, float eps) {
    TD_GRID_STRIDE(i, rows * C) {
        const int64_t c = i % C;
        const float a = (gamma ? gamma[c] : 1.0f) / sqrtf(var[c] + eps);
        const float b = (beta ? beta[c] : 0.0f) - mean[c] * a;
        y[i] = x[i] * a + b;
    }
}

// k[0..C): sum(dy) / rows, k[C..2C): sum(dy * x_hat) / rows (batchStats), else zeros.
__global__ void batchNormGradKernel(const float* dy, const float* x, const float* mean,
                                    const float* var, const float* gamma, float* dx, int64_t rows,
                                    int64_t C, float eps, const float* k) {
    TD_GRID_STRIDE(i, rows * C) {
        const int64_t c = i % C;
        const float inv = 1.0f / sqrtf(var[c] + eps);
        const float gi = (gamma ? gamma[c] : 1.0f) * inv;
        const float xhat = (x[i] - mean[c]) * inv;
        const float k1 = k ? k[c] : 0.f, k2 = k ? k[C + c] : 0.f;
        dx[i] = gi * (dy[i] - k1 - xhat * k2);
    }
}

__global__ void movingAvgKernel(float* param, const float* stat, int64_t n, float momentum) {
    TD_GRID_STRIDE(i, n) {
        param[i] = param[i] * momentum + stat[i] * (1.0f - momentum);
    }
}

// Mean and 1 / sqrt(var + eps) of one row, by one warp (as the CPU's rowStats: double sums).
__device__ inline void warpRowStats(const float* xr, int64_t C, float eps, float& mean,
                                    float& inv) {
    const int lane = threadIdx.x % 32;
    double s = 0;
    for (int64_t c = lane; c < C; c += 32) s += xr[c];
    const double m = warpSumD(s) / static_cast<double>(C);
    double v = 0;
    for (int64_t c = lane; c < C; c += 32) v += (xr[c] - m) * (xr[c] - m);
    v = warpSumD(v);
    mean = static_cast<float>(m);
    inv = 1.0f / sqrtf(static_cast<float>(v / static_cast<double>(C)) + eps);
}

__global__ void layerNormKernel(const float* x, const float* gamma, const float* beta, float* y,
                                int64_t rows, int64_t C, float eps) {
    const int lane = threadIdx.x % 32;
    TD_FOR_ROWS(r, rows) {
        const float* xr = x + r * C;
        float mean, inv;
        warpRowStats(xr, C, eps, mean, inv);
        for (int64_t c = lane; c < C; c += 32)
            y[r * C + c] =
                (xr[c] - mean) * inv * (gamma ? gamma[c] : 1.0f) + (beta ? beta[c] : 0.0f);
    }
}

__global__ void layerNormGradKernel(const float* dy, const float* x, const float* gamma, float* dx,
                                    int64_t rows, int64_t C, float eps) {
    const int lane = threadIdx.x % 32;
    TD_FOR_ROWS(r, rows) {
        const float* xr = x + r * C;
        const float* g = dy + r * C;
        float mean, inv;
        warpRowStats(xr, C, eps, mean, inv);
        double s1 = 0, s2 = 0;  // sums of dy * gamma and of dy * gamma * x_hat
        for (int64_t c = lane; c < C; c += 32) {
            const double gg = static_cast<double>(g[c]) * (gamma ? gamma[c] : 1.0f);
            s1 += gg;
            s2 += gg * (xr[c] - mean) * inv;
        }
        s1 = warpSumD(s1);
        s2 = warpSumD(s2);
        const float m1 = static_cast<float>(s1 / static_cast<double>(C));
        const float m2 = static_cast<float>(s2 / static_cast<double>(C));
        for (int64_t c = lane; c < C; c += 32) {
            const float gg = g[c] * (gamma ? gamma[c] : 1.0f);
            dx[r * C + c] = inv * (gg - m1 - (xr[c] - mean) * inv * m2);
        }
    }
}

// stats[2r], stats[2r + 1]: mean and 1 / sqrt(var + eps) of row r.
__global__ void rowStatsKernel(const float* x, float* stats, int64_t rows, int64_t C, float eps) {
    TD_FOR_ROWS(r, rows) {
        float mean, inv;
        warpRowStats(x + r * C, C, eps, mean, inv);
        if (threadIdx.x % 32 == 0) {
            stats[2 * r] = mean;
            stats[2 * r + 1] = inv;
        }
    }
}

// ---- direct convolutions ------------------------------------------------------------------

__global__ void conv2dKernel(ConvGeometry g, const float* x, const float* w, const float* bias,
                             float* y, ActKind act, float alpha) {
    const int64_t Cg = g.C / g.groups, Fg = g.F / g.groups;
    TD_GRID_STRIDE(i, g.B * g.OH * g.OW * g.F) {
        const int64_t f = i % g.F;
        int64_t t = i / g.F;
        const int64_t ox = t % g.OW;
        t /= g.OW;
        const int64_t oy = t % g.OH, b = t / g.OH;
        const int64_t c0 = f / Fg * Cg;  // the group's first input channel
        float s = 0.f;
        for (int64_t ky = 0; ky < g.kh; ++ky) {
            const int64_t iy = oy * g.sh - g.padTop + ky * g.dh;
            if (iy < 0 || iy >= g.H) continue;
            for (int64_t kx = 0; kx < g.kw; ++kx) {
                const int64_t ix = ox * g.sw - g.padLeft + kx * g.dw;
                if (ix < 0 || ix >= g.W) continue;
                const float* xp = x + ((b * g.H + iy) * g.W + ix) * g.C + c0;
                const float* wp = w + (ky * g.kw + kx) * Cg * g.F + f;
                for (int64_t ci = 0; ci < Cg; ++ci) s += xp[ci] * wp[ci * g.F];
            }
        }
        if (bias) s += bias[f];
        y[i] = kmath::activate(act, alpha, s);
    }
}

__global__ void conv2dGradInputKernel(ConvGeometry g, const float* dy, const float* w, float* dx) {
    const int64_t Cg = g.C / g.groups, Fg = g.F / g.groups;
    TD_GRID_STRIDE(i, g.B * g.H * g.W * g.C) {
        const int64_t c = i % g.C;
        int64_t t = i / g.C;
        const int64_t ix = t % g.W;
        t /= g.W;
        const int64_t iy = t % g.H, b = t / g.H;
        const int64_t grp = c / Cg, ci = c % Cg, f0 = grp * Fg;
        float s = 0.f;
        for (int64_t ky = 0; ky < g.kh; ++ky) {
            const int64_t ny = iy + g.padTop - ky * g.dh;  // oy * sh
            if (ny < 0 || ny % g.sh != 0) continue;
            const int64_t oy = ny / g.sh;
            if (oy >= g.OH) continue;
            for (int64_t kx = 0; kx < g.kw; ++kx) {
                const int64_t nx = ix + g.padLeft - kx * g.dw;
                if (nx < 0 || nx % g.sw != 0) continue;
                const int64_t ox = nx / g.sw;
                if (ox >= g.OW) continue;
                const float* gp = dy + ((b * g.OH + oy) * g.OW + ox) * g.F + f0;
                const float* wp = w + ((ky * g.kw + kx) * Cg + ci) * g.F + f0;
                for (int64_t f = 0; f < Fg; ++f) s += gp[f] * wp[f];
            }
        }
        dx[i] = s;
    }
}

// One block per kernel value dw[ky, kx, ci, f]: its threads split the (b, oy, ox) positions, a
// shared-memory tree adds their sums.
constexpr int kFilterThreads = 128;
__global__ void conv2dGradFilterKernel(ConvGeometry g, const float* x, const float* dy, float* dw) {
    __shared__ float part[kFilterThreads];
    const int64_t Cg = g.C / g.groups, Fg = g.F / g.groups;
    const int64_t total = g.kh * g.kw * Cg * g.F;
    const int64_t positions = g.B * g.OH * g.OW;
    for (int64_t k = blockIdx.x; k < total; k += gridDim.x) {
        const int64_t f = k % g.F;
        int64_t t = k / g.F;
        const int64_t ci = t % Cg;
        t /= Cg;
        const int64_t kx = t % g.kw, ky = t / g.kw;
        const int64_t c = f / Fg * Cg + ci;
        float s = 0.f;
        for (int64_t p = threadIdx.x; p < positions; p += kFilterThreads) {
            const int64_t ox = p % g.OW;
            const int64_t oy = (p / g.OW) % g.OH, b = p / (g.OW * g.OH);
            const int64_t iy = oy * g.sh - g.padTop + ky * g.dh;
            const int64_t ix = ox * g.sw - g.padLeft + kx * g.dw;
            if (iy < 0 || iy >= g.H || ix < 0 || ix >= g.W) continue;
            s += x[((b * g.H + iy) * g.W + ix) * g.C + c] * dy[p * g.F + f];
        }
        part[threadIdx.x] = s;
        __syncthreads();
        for (int w = kFilterThreads / 2; w > 0; w >>= 1) {
            if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
            __syncthreads();
        }
        if (threadIdx.x == 0) dw[k] = part[0];
        __syncthreads();
    }
}

// dst[f, ky, kx, ci] = src[ky, kx, ci, f] (toKrsc), or back.
template <class T>
__global__ void filterTransposeKernel(const T* src, T* dst, int64_t kh, int64_t kw, int64_t cg,
                                      int64_t f, bool toKrsc) {
    TD_GRID_STRIDE(i, kh * kw * cg * f) {
        // i indexes the Keras layout: ((ky * kw + kx) * cg + ci) * f + o.
        const int64_t o = i % f;
        const int64_t spatialCi = i / f;  // (ky * kw + kx) * cg + ci
        const int64_t j = o * kh * kw * cg + spatialCi;
        if (toKrsc)
            dst[j] = src[i];
        else
            dst[i] = src[j];
    }
}

}  // namespace

// The filter transposes move values of 4 bytes (f32) or 2 (bf16, f16) without reading them.
static cudaError_t filterTranspose(cudaStream_t s, const void* src, void* dst, int64_t kh,
                                   int64_t kw, int64_t cg, int64_t f, int elementBytes,
                                   bool toKrsc) {
    const int64_t n = kh * kw * cg * f;
    if (elementBytes == 2)
        filterTransposeKernel<<<blocksFor(n), kThreads, 0, s>>>(
            static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), kh, kw, cg, f, toKrsc);
    else
        filterTransposeKernel<<<blocksFor(n), kThreads, 0, s>>>(
            static_cast<const float*>(src), static_cast<float*>(dst), kh, kw, cg, f, toKrsc);
    return cudaGetLastError();
}

cudaError_t kerasToKrsc(cudaStream_t s, const float* src, float* dst, int64_t kh, int64_t kw,
                        int64_t cg, int64_t f) {
    return filterTranspose(s, src, dst, kh, kw, cg, f, 4, true);
}

cudaError_t krscToKeras(cudaStream_t s, const float* src, float* dst, int64_t kh, int64_t kw,
                        int64_t cg, int64_t f) {
    return filterTranspose(s, src, dst, kh, kw, cg, f, 4, false);
}

cudaError_t kerasToKrsc(cudaStream_t s, const void* src, void* dst, int64_t kh, int64_t kw,
                        int64_t cg, int64_t f, int elementBytes) {
    return filterTranspose(s, src, dst, kh, kw, cg, f, elementBytes, true);
}

cudaError_t krscToKeras(cudaStream_t s, const void* src, void* dst, int64_t kh, int64_t kw,
                        int64_t cg, int64_t f, int elementBytes) {
    return filterTranspose(s, src, dst, kh, kw, cg, f, elementBytes, false);
}

cudaError_t maxPool(cudaStream_t s, const ConvGeometry& p, const float* x, float* y) {
    maxPoolKernel<<<blocksFor(p.B * p.OH * p.OW * p.C), kThreads, 0, s>>>(p, x, y);
    return cudaGetLastError();
}

cudaError_t maxPoolGrad(cudaStream_t s, const ConvGeometry& p, const float* dy, const float* x,
                        float* dx) {
    maxPoolGradKernel<<<blocksFor(p.B * p.H * p.W * p.C), kThreads, 0, s>>>(p, dy, x, dx);
    return cudaGetLastError();
}

cudaError_t avgPool(cudaStream_t s, const ConvGeometry& p, const float* x, float* y) {
    avgPoolKernel<<<blocksFor(p.B * p.OH * p.OW * p.C), kThreads, 0, s>>>(p, x, y);
    return cudaGetLastError();
}

cudaError_t avgPoolGrad(cudaStream_t s, const ConvGeometry& p, const float* dy, float* dx) {
    avgPoolGradKernel<<<blocksFor(p.B * p.H * p.W * p.C), kThreads, 0, s>>>(p, dy, dx);
    return cudaGetLastError();
}

cudaError_t pad2d(cudaStream_t s, const float* x, float* y, int64_t B, int64_t H, int64_t W,
                  int64_t C, int64_t top, int64_t bottom, int64_t left, int64_t right) {
    const int64_t OH = H + top + bottom, OW = W + left + right;
    pad2dKernel<<<blocksFor(B * OH * OW * C), kThreads, 0, s>>>(x, y, B, H, W, C, top, left, OH,
                                                                OW);
    return cudaGetLastError();
}

cudaError_t pad2dGrad(cudaStream_t s, const float* dy, float* dx, int64_t B, int64_t H, int64_t W,
                      int64_t C, int64_t top, int64_t bottom, int64_t left, int64_t right) {
    const int64_t OH = H + top + bottom, OW = W + left + right;
    pad2dGradKernel<<<blocksFor(B * H * W * C), kThreads, 0, s>>>(dy, dx, B, H, W, C, top, left, OH,
                                                                  OW);
    return cudaGetLastError();
}

cudaError_t scale(cudaStream_t s, const float* x, float* y, int64_t n, float scale, float offset) {
    scaleKernel<<<blocksFor(n), kThreads, 0, s>>>(x, y, n, scale, offset);
    return cudaGetLastError();
}

int64_t normScratchFloats(int64_t rows, int64_t C) {
    // Two column reductions' partial sums and their 2C results (batch_norm_grad), or the row
    // statistics (2 per row) and one reduction's partial sums (layer_norm_gamma_grad).
    return 2 * reducePieces(rows) * C + 2 * C + 2 * rows;
}

cudaError_t channelMean(cudaStream_t s, const float* x, float* mean, int64_t rows, int64_t C,
                        float* scratch) {
    return reduceColumns(
        s, rows, C, scratch, [=] __device__(int64_t r, int64_t c) { return x[r * C + c]; },
        [=] __device__(int64_t c, double sum) {
            mean[c] = static_cast<float>(sum / static_cast<double>(rows));
        });
}

cudaError_t channelVar(cudaStream_t s, const float* x, const float* mean, float* var, int64_t rows,
                       int64_t C, float* scratch) {
    return reduceColumns(
        s, rows, C, scratch,
        [=] __device__(int64_t r, int64_t c) {
            const float d = x[r * C + c] - mean[c];
            return d * d;
        },
        [=] __device__(int64_t c, double sum) {
            var[c] = static_cast<float>(sum / static_cast<double>(rows));
        });
}

cudaError_t batchNorm(cudaStream_t s, const float* x, const float* mean, const float* var,
                      const float* gamma, const float* beta, float* y, int64_t rows, int64_t C,
                      float eps) {
    batchNormKernel<<<blocksFor(rows * C), kThreads, 0, s>>>(x, mean, var, gamma, beta, y, rows, C,
                                                             eps);
    return cudaGetLastError();
}

cudaError_t batchNormGrad(cudaStream_t s, const float* dy, const float* x, const float* mean,
                          const float* var, const float* gamma, float* dx, int64_t rows, int64_t C,
                          float eps, bool batchStats, float* scratch) {
    const float* k = nullptr;
    if (batchStats) {
        // scratch: [partials of sum(dy)], [partials of sum(dy * x_hat)], then k1[C], k2[C].
        float* parts = scratch;
        float* kk = scratch + 2 * reducePieces(rows) * C;
        cudaError_t e = reduceColumns(
            s, rows, C, parts, [=] __device__(int64_t r, int64_t c) { return dy[r * C + c]; },
            [=] __device__(int64_t c, double sum) {
                kk[c] = static_cast<float>(sum / static_cast<double>(rows));
            });
        if (e != cudaSuccess) return e;
        e = reduceColumns(
            s, rows, C, parts + reducePieces(rows) * C,
            [=] __device__(int64_t r, int64_t c) {
                const float inv = 1.0f / sqrtf(var[c] + eps);
                return dy[r * C + c] * (x[r * C + c] - mean[c]) * inv;
            },
            [=] __device__(int64_t c, double sum) {
                kk[C + c] = static_cast<float>(sum / static_cast<double>(rows));
            });
        if (e != cudaSuccess) return e;
        k = kk;
    }
    batchNormGradKernel<<<blocksFor(rows * C), kThreads, 0, s>>>(dy, x, mean, var, gamma, dx, rows,
                                                                 C, eps, k);
    return cudaGetLastError();
}

cudaError_t normGammaGrad(cudaStream_t s, const float* dy, const float* x, const float* mean,
                          const float* var, float* dgamma, int64_t rows, int64_t C, float eps,
                          float* scratch) {
    return reduceColumns(
        s, rows, C, scratch,
        [=] __device__(int64_t r, int64_t c) {
            const float inv = 1.0f / sqrtf(var[c] + eps);
            return dy[r * C + c] * (x[r * C + c] - mean[c]) * inv;
        },
        [=] __device__(int64_t c, double sum) { dgamma[c] = static_cast<float>(sum); });
}

cudaError_t movingAvg(cudaStream_t s, float* param, const float* stat, int64_t n, float momentum) {
    movingAvgKernel<<<blocksFor(n), kThreads, 0, s>>>(param, stat, n, momentum);
    return cudaGetLastError();
}

cudaError_t layerNorm(cudaStream_t s, const float* x, const float* gamma, const float* beta,
                      float* y, int64_t rows, int64_t C, float eps) {
    layerNormKernel<<<rowBlocks(rows), kThreads, 0, s>>>(x, gamma, beta, y, rows, C, eps);
    return cudaGetLastError();
}

cudaError_t layerNormGrad(cudaStream_t s, const float* dy, const float* x, const float* gamma,
                          float* dx, int64_t rows, int64_t C, float eps) {
    layerNormGradKernel<<<rowBlocks(rows), kThreads, 0, s>>>(dy, x, gamma, dx, rows, C, eps);
    return cudaGetLastError();
}

cudaError_t layerNormGammaGrad(cudaStream_t s, const float* dy, const float* x, float* dgamma,
                               int64_t rows, int64_t C, float eps, float* scratch) {
    float* stats = scratch;  // 2 per row, then the column partials
    rowStatsKernel<<<rowBlocks(rows), kThreads, 0, s>>>(x, stats, rows, C, eps);
    return reduceColumns(
        s, rows, C, scratch + 2 * rows,
        [=] __device__(int64_t r, int64_t c) {
            return dy[r * C + c] * (x[r * C + c] - stats[2 * r]) * stats[2 * r + 1];
        },
        [=] __device__(int64_t c, double sum) { dgamma[c] = static_cast<float>(sum); });
}

cudaError_t conv2d(cudaStream_t s, const ConvGeometry& g, const float* x, const float* w,
                   const float* bias, float* y, ActKind act, float alpha) {
    conv2dKernel<<<blocksFor(g.B * g.OH * g.OW * g.F), kThreads, 0, s>>>(g, x, w, bias, y, act,
                                                                         alpha);
    return cudaGetLastError();
}

cudaError_t conv2dGradInput(cudaStream_t s, const ConvGeometry& g, const float* dy, const float* w,
                            float* dx) {
    conv2dGradInputKernel<<<blocksFor(g.B * g.H * g.W * g.C), kThreads, 0, s>>>(g, dy, w, dx);
    return cudaGetLastError();
}

cudaError_t conv2dGradFilter(cudaStream_t s, const ConvGeometry& g, const float* x, const float* dy,
                             float* dw) {
    const int64_t total = g.kh * g.kw * (g.C / g.groups) * g.F;
    const int blocks = static_cast<int>(total < 65535 ? (total < 1 ? 1 : total) : 65535);
    conv2dGradFilterKernel<<<blocks, kFilterThreads, 0, s>>>(g, x, dy, dw);
    return cudaGetLastError();
}

// ---- image preprocessing and augmentation: one thread per output value ----------------------

namespace {

// Output value i of y [B,OH,OW,C] as (b, oy, ox, c).
struct OutPos {
    int64_t b, oy, ox, c;
};
__device__ inline OutPos outPos(const AugmentSpec& a, int64_t i) {
    OutPos p;
    p.c = i % a.C;
    int64_t t = i / a.C;
    p.ox = t % a.OW;
    t /= a.OW;
    p.oy = t % a.OH;
    p.b = t / a.OH;
    return p;
}

__device__ inline uint32_t sampleKey(kmath::AugmentSalt salt, const AugmentSpec& a,
                                     const StepValues* sv, int64_t b) {
    return kmath::augmentKey(salt, a.seed, sv->step, sv->sampleBase + b);
}

__global__ void resizeKernel(AugmentSpec a, const float* x, float* y) {
    TD_GRID_STRIDE(i, a.B * a.OH * a.OW * a.C) {
        const OutPos p = outPos(a, i);
        y[i] = kmath::resizeSample(a, x + p.b * a.H * a.W * a.C, p.oy, p.ox, p.c);
    }
}

__global__ void randomCropKernel(AugmentSpec a, const float* x, float* y, const StepValues* sv) {
    TD_GRID_STRIDE(i, a.B * a.OH * a.OW * a.C) {
        const OutPos p = outPos(a, i);
        int64_t top = 0, left = 0;
        kmath::cropOffset(a, sampleKey(kmath::kSaltCrop, a, sv, p.b), top, left);
        y[i] = x[((p.b * a.H + top + p.oy) * a.W + left + p.ox) * a.C + p.c];
    }
}

__global__ void randomFlipKernel(AugmentSpec a, const float* x, float* y, const StepValues* sv) {
    TD_GRID_STRIDE(i, a.B * a.OH * a.OW * a.C) {
        const OutPos p = outPos(a, i);
        const bool flip = kmath::flipDrawn(sampleKey(kmath::kSaltFlip, a, sv, p.b));
        const int64_t sy = flip && a.flip != FlipMode::Horizontal ? a.H - 1 - p.oy : p.oy;
        const int64_t sx = flip && a.flip != FlipMode::Vertical ? a.W - 1 - p.ox : p.ox;
        y[i] = x[((p.b * a.H + sy) * a.W + sx) * a.C + p.c];
    }
}

__global__ void randomRotationKernel(AugmentSpec a, const float* x, float* y,
                                     const StepValues* sv) {
    TD_GRID_STRIDE(i, a.B * a.OH * a.OW * a.C) {
        const OutPos p = outPos(a, i);
        const kmath::Affine m = kmath::rotationFor(a, sampleKey(kmath::kSaltRotation, a, sv, p.b));
        y[i] = kmath::affineSample(a, m, x + p.b * a.H * a.W * a.C, p.ox, p.oy, p.c);
    }
}

__global__ void randomZoomKernel(AugmentSpec a, const float* x, float* y, const StepValues* sv) {
    TD_GRID_STRIDE(i, a.B * a.OH * a.OW * a.C) {
        const OutPos p = outPos(a, i);
        const kmath::Affine m = kmath::zoomFor(a, sampleKey(kmath::kSaltZoom, a, sv, p.b));
        y[i] = kmath::affineSample(a, m, x + p.b * a.H * a.W * a.C, p.ox, p.oy, p.c);
    }
}

__global__ void randomTranslationKernel(AugmentSpec a, const float* x, float* y,
                                        const StepValues* sv) {
    TD_GRID_STRIDE(i, a.B * a.OH * a.OW * a.C) {
        const OutPos p = outPos(a, i);
        const kmath::Affine m =
            kmath::translationFor(a, sampleKey(kmath::kSaltTranslation, a, sv, p.b));
        y[i] = kmath::affineSample(a, m, x + p.b * a.H * a.W * a.C, p.ox, p.oy, p.c);
    }
}

// One warp per (sample, channel): the mean over the image's positions, summed in double in a
// fixed order (each lane its stride of positions, then the warp's sum).
__global__ void channelMeansKernel(AugmentSpec a, const float* x, float* means) {
    const int64_t pixels = a.H * a.W;
    TD_FOR_ROWS(r, a.B * a.C) {
        const int64_t b = r / a.C, c = r % a.C;
        const float* img = x + b * pixels * a.C;
        double s = 0.0;
        for (int64_t q = threadIdx.x % 32; q < pixels; q += 32) s += img[q * a.C + c];
        s = warpSumD(s);
        if (threadIdx.x % 32 == 0) means[r] = static_cast<float>(s / static_cast<double>(pixels));
    }
}

__global__ void randomContrastKernel(AugmentSpec a, const float* x, const float* means, float* y,
                                     const StepValues* sv) {
    TD_GRID_STRIDE(i, a.B * a.H * a.W * a.C) {
        const OutPos p = outPos(a, i);
        const float factor = kmath::contrastFactor(a, sampleKey(kmath::kSaltContrast, a, sv, p.b));
        y[i] = kmath::contrast(a, x[i], means[p.b * a.C + p.c], factor);
    }
}

__global__ void randomBrightnessKernel(AugmentSpec a, const float* x, float* y,
                                       const StepValues* sv) {
    TD_GRID_STRIDE(i, a.B * a.H * a.W * a.C) {
        const OutPos p = outPos(a, i);
        const float delta =
            kmath::brightnessDelta(a, sampleKey(kmath::kSaltBrightness, a, sv, p.b));
        y[i] = kmath::brightness(a, x[i], delta);
    }
}

}  // namespace

cudaError_t resize(cudaStream_t s, const AugmentSpec& a, const float* x, float* y) {
    resizeKernel<<<blocksFor(a.B * a.OH * a.OW * a.C), kThreads, 0, s>>>(a, x, y);
    return cudaGetLastError();
}

cudaError_t randomCrop(cudaStream_t s, const AugmentSpec& a, const float* x, float* y,
                       const StepValues* sv) {
    randomCropKernel<<<blocksFor(a.B * a.OH * a.OW * a.C), kThreads, 0, s>>>(a, x, y, sv);
    return cudaGetLastError();
}

cudaError_t randomFlip(cudaStream_t s, const AugmentSpec& a, const float* x, float* y,
                       const StepValues* sv) {
    randomFlipKernel<<<blocksFor(a.B * a.OH * a.OW * a.C), kThreads, 0, s>>>(a, x, y, sv);
    return cudaGetLastError();
}

cudaError_t randomRotation(cudaStream_t s, const AugmentSpec& a, const float* x, float* y,
                           const StepValues* sv) {
    randomRotationKernel<<<blocksFor(a.B * a.OH * a.OW * a.C), kThreads, 0, s>>>(a, x, y, sv);
    return cudaGetLastError();
}

cudaError_t randomZoom(cudaStream_t s, const AugmentSpec& a, const float* x, float* y,
                       const StepValues* sv) {
    randomZoomKernel<<<blocksFor(a.B * a.OH * a.OW * a.C), kThreads, 0, s>>>(a, x, y, sv);
    return cudaGetLastError();
}

cudaError_t randomTranslation(cudaStream_t s, const AugmentSpec& a, const float* x, float* y,
                              const StepValues* sv) {
    randomTranslationKernel<<<blocksFor(a.B * a.OH * a.OW * a.C), kThreads, 0, s>>>(a, x, y, sv);
    return cudaGetLastError();
}

int64_t contrastScratchFloats(const AugmentSpec& a) {
    return a.B * a.C;
}

cudaError_t randomContrast(cudaStream_t s, const AugmentSpec& a, const float* x, float* y,
                           float* scratch, const StepValues* sv) {
    channelMeansKernel<<<rowBlocks(a.B * a.C), kThreads, 0, s>>>(a, x, scratch);
    randomContrastKernel<<<blocksFor(a.B * a.H * a.W * a.C), kThreads, 0, s>>>(a, x, scratch, y,
                                                                               sv);
    return cudaGetLastError();
}

cudaError_t randomBrightness(cudaStream_t s, const AugmentSpec& a, const float* x, float* y,
                             const StepValues* sv) {
    randomBrightnessKernel<<<blocksFor(a.B * a.H * a.W * a.C), kThreads, 0, s>>>(a, x, y, sv);
    return cudaGetLastError();
}

}  // namespace td::cuda
