// The CUDA device's own kernels (cuda_kernels.h). Simple, obviously correct forms first:
// grid-stride loops over elements, one warp per row for row-wise work (softmax, losses, layer
// normalization), and reductions in fixed blocks combined in a fixed order, so results do not
// depend on timing. The per-element math is the CPU backend's (shared headers).
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "engine/backend/cuda/cuda_common.cuh"
#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/kernel_math.h"
#include "engine/backend/update_math.h"
#include "engine/core/half.h"

namespace td::cuda {

using namespace detail;

namespace {

// ---- elementwise ---------------------------------------------------------------------------

// The three element-wise kernels of a dense layer's forward and backward passes come in two
// loops: spans of a row per warp (TD_FOR_ROW_CHUNKS; when the item count fits in 31 bits, always
// in practice) and, for larger matrices, elements with 64-bit indices. Same values either way.
__device__ inline float biasActOne(const Ten& x, const Ten& bias, ActKind act, float alpha,
                                   const RowDrop& rd, int64_t i, int64_t c) {
    float v = ld(x, i);
    if (bias.p) v += ld(bias, c);
    return rd.apply(c, kmath::activate(act, alpha, v));
}

__global__ void biasActKernel(Ten x, Ten bias, Ten y, int64_t rows, int64_t cols, ActKind act,
                              float alpha, DropMask drop, const StepValues* sv, bool chunked) {
    if (chunked) {
        TD_FOR_ROW_CHUNKS(r, c0, c1, rows, cols, {
            const RowDrop rd = rowDrop(drop, sv, r);
            for (int64_t c = c0; c < c1; c += 32)
                st(y, r * cols + c, biasActOne(x, bias, act, alpha, rd, r * cols + c, c));
        });
        return;
    }
    TD_GRID_STRIDE(i, rows * cols) {
        const int64_t r = i / cols, c = i % cols;
        st(y, i, biasActOne(x, bias, act, alpha, rowDrop(drop, sv, r), i, c));
    }
}

__global__ void dropoutKernel(Ten x, Ten y, int64_t rows, int64_t cols, DropMask drop,
                              const StepValues* sv, bool chunked) {
    if (chunked) {
        TD_FOR_ROW_CHUNKS(r, c0, c1, rows, cols, {
            const RowDrop rd = rowDrop(drop, sv, r);
            for (int64_t c = c0; c < c1; c += 32)
                st(y, r * cols + c, rd.apply(c, ld(x, r * cols + c)));
        });
        return;
    }
    TD_GRID_STRIDE(i, rows * cols) {
        st(y, i, dropped(drop, sv, i / cols, i % cols, ld(x, i)));
    }
}

__global__ void actGradKernel(Ten dy, Ten saved, Ten dx, int64_t rows, int64_t cols, ActKind act,
                              float alpha, bool usesOutput, DropMask drop, const StepValues* sv,
                              bool chunked) {
    if (chunked) {
        TD_FOR_ROW_CHUNKS(r, c0, c1, rows, cols, {
            const RowDrop rd = rowDrop(drop, sv, r);
            for (int64_t c = c0; c < c1; c += 32) {
                const int64_t i = r * cols + c;
                st(dx, i,
                   kmath::activateGrad(act, alpha, usesOutput, rd.apply(c, ld(dy, i)),
                                       ld(saved, i)));
            }
        });
        return;
    }
    TD_GRID_STRIDE(i, rows * cols) {
        const float g = dropped(drop, sv, i / cols, i % cols, ld(dy, i));
        st(dx, i, kmath::activateGrad(act, alpha, usesOutput, g, ld(saved, i)));
    }
}

// Blocks for a row-chunk launch, else for an element launch.
int elementwiseBlocks(int64_t rows, int64_t cols) {
    return rowChunkFits(rows, cols) ? blocksFor(rowChunkItems(rows, cols)) : blocksFor(rows * cols);
}

__global__ void sumSharedKernel(SharedBuckets b, int64_t count) {
    TD_GRID_STRIDE(i, count) {
        float s = b.p[0][i];
        for (int r = 1; r < b.n; ++r) s += b.p[r][i];
        for (int r = 0; r < b.n; ++r) b.p[r][i] = s;
    }
}

__global__ void addKernel(Ten a, Ten b, Ten y, int64_t n) {
    TD_GRID_STRIDE(i, n) {
        st(y, i, ld(a, i) + ld(b, i));
    }
}

__global__ void castKernel(Ten src, Ten dst, int64_t n, bool onlyWhenRefresh,
                           const StepValues* sv) {
    if (onlyWhenRefresh && !sv->refreshShadows) return;
    TD_GRID_STRIDE(i, n) {
        st(dst, i, ld(src, i));
    }
}

__global__ void regGradKernel(Ten g, Ten w, Ten out, int64_t n, float l1, float l2) {
    TD_GRID_STRIDE(i, n) {
        st(out, i, kmath::regGrad(ld(g, i), ld(w, i), l1, l2));
    }
}

__global__ void accumulateKernel(const float* x, double* acc, double factor) {
    acc[0] += static_cast<double>(x[0]) * factor;
}

// ---- row-wise (one warp per row) -------------------------------------------------------------

__global__ void softmaxKernel(Ten x, Ten y, int64_t rows, int64_t cols) {
    const int lane = threadIdx.x % 32;
    TD_FOR_ROWS(r, rows) {
        const int64_t o = r * cols;
        float m = -INFINITY;
        for (int64_t c = lane; c < cols; c += 32) m = fmaxf(m, ld(x, o + c));
        m = warpMax(m);
        float s = 0.f;
        for (int64_t c = lane; c < cols; c += 32) s += expf(ld(x, o + c) - m);
        s = warpSum(s);
        const float inv = 1.0f / s;
        for (int64_t c = lane; c < cols; c += 32) st(y, o + c, expf(ld(x, o + c) - m) * inv);
    }
}

__global__ void softmaxGradKernel(Ten dy, Ten y, Ten dx, int64_t rows, int64_t cols, DropMask drop,
                                  const StepValues* sv) {
    const int lane = threadIdx.x % 32;
    TD_FOR_ROWS(r, rows) {
        const int64_t o = r * cols;
        float dot = 0.f;
        for (int64_t c = lane; c < cols; c += 32)
            dot += dropped(drop, sv, r, c, ld(dy, o + c)) * ld(y, o + c);
        dot = warpSum(dot);
        for (int64_t c = lane; c < cols; c += 32) {
            const float g = dropped(drop, sv, r, c, ld(dy, o + c));
            st(dx, o + c, ld(y, o + c) * (g - dot));
        }
    }
}

__device__ inline float clampP(float p) {
    return fminf(fmaxf(p, kEps), 1.f - kEps);
}

// The loss of each row (as cpu::loss), in double, into rowLoss[r].
__global__ void lossRowsKernel(LossKind k, Ten pred, Ten labels, int64_t rows, int64_t cols,
                               double* rowLoss) {
    const int lane = threadIdx.x % 32;
    TD_FOR_ROWS(r, rows) {
        const int64_t o = r * cols;
        double l = 0.0;
        switch (k) {
            case LossKind::SparseSoftmaxXent:
            case LossKind::SoftmaxXent: {
                float m = -INFINITY;
                for (int64_t c = lane; c < cols; c += 32) m = fmaxf(m, ld(pred, o + c));
                m = warpMax(m);
                float s = 0.f;
                for (int64_t c = lane; c < cols; c += 32) s += expf(ld(pred, o + c) - m);
                s = warpSum(s);
                const float lse = m + logf(s);
                if (k == LossKind::SparseSoftmaxXent) {
                    l = lse - ld(pred, o + ldLabel(labels, r));
                } else {
                    double part = 0.0;
                    for (int64_t c = lane; c < cols; c += 32)
                        part += ld(labels, o + c) * (lse - ld(pred, o + c));
                    l = warpSumD(part);
                }
                break;
            }
            case LossKind::SparseXent:
            case LossKind::Xent: {
                float s = 0.f;
                for (int64_t c = lane; c < cols; c += 32) s += ld(pred, o + c);
                s = warpSum(s);
                if (k == LossKind::SparseXent) {
                    l = -logf(clampP(ld(pred, o + ldLabel(labels, r)) / s));
                } else {
                    double part = 0.0;
                    for (int64_t c = lane; c < cols; c += 32)
                        part -= ld(labels, o + c) * logf(clampP(ld(pred, o + c) / s));
                    l = warpSumD(part);
                }
                break;
            }
            case LossKind::SigmoidBce:
            case LossKind::Bce:
            case LossKind::Mse: {
                double part = 0.0;
                for (int64_t c = lane; c < cols; c += 32) {
                    const float x = ld(pred, o + c), y = ld(labels, o + c);
                    if (k == LossKind::SigmoidBce) {
                        part += fmaxf(x, 0.f) - x * y + log1pf(expf(-fabsf(x)));
                    } else if (k == LossKind::Bce) {
                        const float q = clampP(x);
                        part -= y * logf(q) + (1.f - y) * logf(1.f - q);
                    } else {
                        const double d = static_cast<double>(x) - y;
                        part += d * d;
                    }
                }
                l = warpSumD(part) / static_cast<double>(cols);
                break;
            }
        }
        if (lane == 0) rowLoss[r] = l;
    }
}

// out[0] = float(sum of v[0, n) * scale), summed by one block in a fixed order.
__global__ void finalSumKernel(const double* v, int64_t n, double scale, float* out) {
    __shared__ double part[kFinalThreads];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += kFinalThreads) s += v[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = kFinalThreads / 2; w > 0; w >>= 1) {
        if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = static_cast<float>(part[0] * scale);
}

__global__ void lossGradKernel(LossKind k, Ten pred, Ten labels, Ten dp, int64_t rows, int64_t cols,
                               float scale0, const LossScaleState* dyn) {
    const int lane = threadIdx.x % 32;
    const float scale = dyn ? scale0 * dyn->scale : scale0;
    const float invCols = 1.0f / static_cast<float>(cols);
    TD_FOR_ROWS(r, rows) {
        const int64_t o = r * cols;
        switch (k) {
            case LossKind::SparseSoftmaxXent:
            case LossKind::SoftmaxXent: {
                float m = -INFINITY;
                for (int64_t c = lane; c < cols; c += 32) m = fmaxf(m, ld(pred, o + c));
                m = warpMax(m);
                float s = 0.f;
                for (int64_t c = lane; c < cols; c += 32) s += expf(ld(pred, o + c) - m);
                s = warpSum(s);
                const float inv = scale / s;
                if (k == LossKind::SparseSoftmaxXent) {
                    const int64_t y = ldLabel(labels, r);
                    for (int64_t c = lane; c < cols; c += 32) {
                        float g = expf(ld(pred, o + c) - m) * inv;
                        if (c == y) g -= scale;
                        st(dp, o + c, g);
                    }
                } else {
                    float ysum = 0.f;
                    for (int64_t c = lane; c < cols; c += 32) ysum += ld(labels, o + c);
                    ysum = warpSum(ysum);
                    for (int64_t c = lane; c < cols; c += 32)
                        st(dp, o + c,
                           expf(ld(pred, o + c) - m) * inv * ysum - scale * ld(labels, o + c));
                }
                break;
            }
            case LossKind::SparseXent:
            case LossKind::Xent: {
                float s = 0.f;
                for (int64_t c = lane; c < cols; c += 32) s += ld(pred, o + c);
                s = warpSum(s);
                const int64_t yi = k == LossKind::SparseXent ? ldLabel(labels, r) : -1;
                auto yOf = [&](int64_t c) {
                    return k == LossKind::SparseXent ? (c == yi ? 1.f : 0.f) : ld(labels, o + c);
                };
                // loss = -sum_j y_j log(clip(p_j / s)): unclipped terms give -y_k/p_k to dp_k
                // and +y_j/s to every dp_k.
                float common = 0.f;
                for (int64_t c = lane; c < cols; c += 32) {
                    const float q = ld(pred, o + c) / s;
                    if (q > kEps && q < 1.f - kEps) common += yOf(c);
                }
                common = warpSum(common);
                for (int64_t c = lane; c < cols; c += 32) {
                    const float p = ld(pred, o + c);
                    const float q = p / s;
                    const bool live = q > kEps && q < 1.f - kEps;
                    const float g = live ? -yOf(c) / p : 0.f;
                    st(dp, o + c, (g + common / s) * scale);
                }
                break;
            }
            case LossKind::SigmoidBce:
                for (int64_t c = lane; c < cols; c += 32)
                    st(dp, o + c,
                       (kmath::sigmoid(ld(pred, o + c)) - ld(labels, o + c)) * invCols * scale);
                break;
            case LossKind::Bce:
                for (int64_t c = lane; c < cols; c += 32) {
                    const float p = ld(pred, o + c), y = ld(labels, o + c);
                    const bool live = p > kEps && p < 1.f - kEps;
                    st(dp, o + c, live ? (-y / p + (1.f - y) / (1.f - p)) * invCols * scale : 0.f);
                }
                break;
            case LossKind::Mse:
                for (int64_t c = lane; c < cols; c += 32)
                    st(dp, o + c, 2.f * (ld(pred, o + c) - ld(labels, o + c)) * invCols * scale);
                break;
        }
    }
}

// The first index of the row maximum (ties: the lowest index, as the CPU's argmax).
__device__ inline int64_t warpArgmax(const Ten& v, int64_t o, int64_t cols) {
    float best = -INFINITY;
    int64_t at = -1;
    for (int64_t c = threadIdx.x % 32; c < cols; c += 32) {
        const float x = ld(v, o + c);
        if (at < 0 || x > best) {
            best = x;
            at = c;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, off);
        const int64_t oa = __shfl_xor_sync(0xffffffffu, at, off);
        const bool take = oa >= 0 && (at < 0 || ob > best || (ob == best && oa < at));
        if (take) {
            best = ob;
            at = oa;
        }
    }
    return at < 0 ? 0 : at;
}

__global__ void metricRowsKernel(MetricKind k, int64_t topK, bool onLogits, Ten pred, Ten labels,
                                 int64_t rows, int64_t cols, double* rowCorrect) {
    const int lane = threadIdx.x % 32;
    TD_FOR_ROWS(r, rows) {
        const int64_t o = r * cols;
        double correct = 0.0;
        switch (k) {
            case MetricKind::SparseCategorical:
                correct = warpArgmax(pred, o, cols) == ldLabel(labels, r) ? 1 : 0;
                break;
            case MetricKind::Categorical:
                correct = warpArgmax(pred, o, cols) == warpArgmax(labels, o, cols) ? 1 : 0;
                break;
            case MetricKind::Binary: {
                const float thr = onLogits ? 0.f : 0.5f;
                float ok = 0.f;
                for (int64_t c = lane; c < cols; c += 32)
                    ok += (ld(pred, o + c) > thr) == (ld(labels, o + c) > 0.5f) ? 1.f : 0.f;
                ok = warpSum(ok);  // exact: integer counts below 2^24
                correct = static_cast<double>(ok) / static_cast<double>(cols);
                break;
            }
            case MetricKind::SparseTopK:
            case MetricKind::TopK: {
                const int64_t y =
                    k == MetricKind::SparseTopK ? ldLabel(labels, r) : warpArgmax(labels, o, cols);
                const float py = ld(pred, o + y);
                float greater = 0.f;
                for (int64_t c = lane; c < cols; c += 32)
                    greater += ld(pred, o + c) > py ? 1.f : 0.f;
                greater = warpSum(greater);
                correct = greater < static_cast<float>(topK) ? 1 : 0;
                break;
            }
        }
        if (lane == 0) rowCorrect[r] = correct;
    }
}

// Partial sums of |w| and w^2 per block (fixed grid), then one block adds them in order.
constexpr int kRegBlocks = 256;
__global__ void regPartialKernel(Ten w, int64_t n, double* part) {
    __shared__ double s1[kThreads], s2[kThreads];
    double a = 0, b = 0;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
         i += static_cast<int64_t>(kRegBlocks) * kThreads) {
        const float v = ld(w, i);
        a += fabsf(v);
        b += static_cast<double>(v) * v;
    }
    s1[threadIdx.x] = a;
    s2[threadIdx.x] = b;
    __syncthreads();
    for (int k = kThreads / 2; k > 0; k >>= 1) {
        if (static_cast<int>(threadIdx.x) < k) {
            s1[threadIdx.x] += s1[threadIdx.x + k];
            s2[threadIdx.x] += s2[threadIdx.x + k];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        part[blockIdx.x] = s1[0];
        part[kRegBlocks + blockIdx.x] = s2[0];
    }
}

__global__ void regFinalKernel(const double* part, float l1, float l2, float* out) {
    double a = 0, b = 0;
    for (int i = 0; i < kRegBlocks; ++i) {
        a += part[i];
        b += part[kRegBlocks + i];
    }
    out[0] = static_cast<float>(l1 * a + l2 * b);
}

}  // namespace

// ---- launch functions --------------------------------------------------------------------------

cudaError_t biasAct(cudaStream_t s, Ten x, Ten bias, Ten y, int64_t rows, int64_t cols, ActKind act,
                    float alpha, DropMask drop, const StepValues* sv) {
    biasActKernel<<<elementwiseBlocks(rows, cols), kThreads, 0, s>>>(
        x, bias, y, rows, cols, act, alpha, drop, sv, rowChunkFits(rows, cols));
    return cudaGetLastError();
}

cudaError_t softmax(cudaStream_t s, Ten x, Ten y, int64_t rows, int64_t cols) {
    softmaxKernel<<<rowBlocks(rows), kThreads, 0, s>>>(x, y, rows, cols);
    return cudaGetLastError();
}

cudaError_t actGrad(cudaStream_t s, Ten dy, Ten saved, Ten dx, int64_t rows, int64_t cols,
                    ActKind act, float alpha, bool usesOutput, DropMask drop,
                    const StepValues* sv) {
    if (act == ActKind::Softmax)
        softmaxGradKernel<<<rowBlocks(rows), kThreads, 0, s>>>(dy, saved, dx, rows, cols, drop, sv);
    else
        actGradKernel<<<elementwiseBlocks(rows, cols), kThreads, 0, s>>>(
            dy, saved, dx, rows, cols, act, alpha, usesOutput, drop, sv, rowChunkFits(rows, cols));
    return cudaGetLastError();
}

int64_t colSumsScratchFloats(int64_t rows, int64_t cols) {
    return reducePieces(rows) * cols;
}

cudaError_t colSums(cudaStream_t s, Ten x, Ten out, int64_t rows, int64_t cols, float* scratch) {
    return reduceColumns(
        s, rows, cols, scratch,
        [=] __device__(int64_t r, int64_t c) { return ld(x, r * cols + c); },
        [=] __device__(int64_t c, double sum) { st(out, c, static_cast<float>(sum)); });
}

cudaError_t add(cudaStream_t s, Ten a, Ten b, Ten y, int64_t n) {
    addKernel<<<blocksFor(n), kThreads, 0, s>>>(a, b, y, n);
    return cudaGetLastError();
}

cudaError_t dropout(cudaStream_t s, Ten x, Ten y, int64_t rows, int64_t cols, DropMask drop,
                    const StepValues* sv) {
    dropoutKernel<<<elementwiseBlocks(rows, cols), kThreads, 0, s>>>(x, y, rows, cols, drop, sv,
                                                                     rowChunkFits(rows, cols));
    return cudaGetLastError();
}

cudaError_t sumShared(cudaStream_t s, SharedBuckets buckets, int64_t count) {
    if (count <= 0 || buckets.n <= 0) return cudaSuccess;
    sumSharedKernel<<<blocksFor(count), kThreads, 0, s>>>(buckets, count);
    return cudaGetLastError();
}

cudaError_t cast(cudaStream_t s, Ten src, Ten dst, int64_t n, bool onlyWhenRefresh,
                 const StepValues* sv) {
    castKernel<<<blocksFor(n), kThreads, 0, s>>>(src, dst, n, onlyWhenRefresh, sv);
    return cudaGetLastError();
}

int64_t lossScratchDoubles(int64_t rows) {
    return rows < 2 * kRegBlocks ? 2 * kRegBlocks : rows;
}

cudaError_t loss(cudaStream_t s, LossKind k, Ten pred, Ten labels, float* out, int64_t rows,
                 int64_t cols, float scale, double* scratch) {
    lossRowsKernel<<<rowBlocks(rows), kThreads, 0, s>>>(k, pred, labels, rows, cols, scratch);
    finalSumKernel<<<1, kFinalThreads, 0, s>>>(scratch, rows, scale, out);
    return cudaGetLastError();
}

cudaError_t lossGrad(cudaStream_t s, LossKind k, Ten pred, Ten labels, Ten dpred, int64_t rows,
                     int64_t cols, float scale, const LossScaleState* dynScale) {
    lossGradKernel<<<rowBlocks(rows), kThreads, 0, s>>>(k, pred, labels, dpred, rows, cols, scale,
                                                        dynScale);
    return cudaGetLastError();
}

cudaError_t metric(cudaStream_t s, MetricKind k, int64_t topK, bool onLogits, Ten pred, Ten labels,
                   float* out, int64_t rows, int64_t cols, double* scratch) {
    metricRowsKernel<<<rowBlocks(rows), kThreads, 0, s>>>(k, topK, onLogits, pred, labels, rows,
                                                          cols, scratch);
    finalSumKernel<<<1, kFinalThreads, 0, s>>>(scratch, rows, 1.0, out);
    return cudaGetLastError();
}

cudaError_t regLoss(cudaStream_t s, Ten w, int64_t n, float l1, float l2, float* out,
                    double* scratch) {
    regPartialKernel<<<kRegBlocks, kThreads, 0, s>>>(w, n, scratch);
    regFinalKernel<<<1, 1, 0, s>>>(scratch, l1, l2, out);
    return cudaGetLastError();
}

cudaError_t regGrad(cudaStream_t s, Ten g, Ten w, Ten out, int64_t n, float l1, float l2) {
    regGradKernel<<<blocksFor(n), kThreads, 0, s>>>(g, w, out, n, l1, l2);
    return cudaGetLastError();
}

cudaError_t accumulate(cudaStream_t s, const float* x, double* acc, double factor) {
    accumulateKernel<<<1, 1, 0, s>>>(x, acc, factor);
    return cudaGetLastError();
}

}  // namespace td::cuda
