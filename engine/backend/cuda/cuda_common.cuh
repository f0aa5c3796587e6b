// Helpers of the CUDA device's kernels (cuda_kernels.cu, cuda_image_kernels.cu,
// cuda_update.cu): typed loads and stores, grid-stride and warp-per-row loops, warp sums and
// the fixed-order column reduction.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/kernel_math.h"
#include "engine/core/half.h"

namespace td::cuda::detail {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;
constexpr float kEps = 1e-7f;       // Keras backend epsilon
constexpr int kFinalThreads = 256;  // threads of a final reduction over partial sums

inline int blocksFor(int64_t n) {
    const int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<int>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

__device__ inline float ld(const Ten& t, int64_t i) {
    switch (t.dt) {
        case Dt::BF16:
            return bf16ToFloat(static_cast<const uint16_t*>(t.p)[i]);
        case Dt::F16:
            return f16ToFloat(static_cast<const uint16_t*>(t.p)[i]);
        case Dt::I32:
            return static_cast<float>(static_cast<const int32_t*>(t.p)[i]);
        default:
            return static_cast<const float*>(t.p)[i];
    }
}

__device__ inline void st(const Ten& t, int64_t i, float v) {
    switch (t.dt) {
        case Dt::BF16:
            static_cast<uint16_t*>(t.p)[i] = floatToBf16(v);
            break;
        case Dt::F16:
            static_cast<uint16_t*>(t.p)[i] = floatToF16(v);
            break;
        case Dt::I32:
            static_cast<int32_t*>(t.p)[i] = static_cast<int32_t>(v);
            break;
        default:
            static_cast<float*>(t.p)[i] = v;
    }
}

__device__ inline int32_t ldLabel(const Ten& t, int64_t r) {
    return static_cast<const int32_t*>(t.p)[r];
}

// The dropout of element (r, c): x * keepScale when kept, else 0.
__device__ inline float dropped(const DropMask& d, const StepValues* sv, int64_t r, int64_t c,
                                float x) {
    if (d.rate <= 0) return x;
    const uint32_t base = kmath::dropoutRowBase(d.seed, sv->step, sv->sampleBase + r);
    const float keepScale = 1.0f / (1.0f - d.rate);
    return kmath::dropoutHash24(base, c) >= kmath::dropoutThreshold(d.rate) ? x * keepScale : 0.f;
}

// The dropout of one row, its hash key computed once: apply(c, x) is dropped(d, sv, r, c, x).
struct RowDrop {
    uint32_t base = 0, threshold = 0;
    float keepScale = 1.f;
    bool on = false;
    __device__ float apply(int64_t c, float x) const {
        if (!on) return x;
        return kmath::dropoutHash24(base, c) >= threshold ? x * keepScale : 0.f;
    }
};
__device__ inline RowDrop rowDrop(const DropMask& d, const StepValues* sv, int64_t r) {
    RowDrop rd;
    if (d.rate <= 0) return rd;
    rd.on = true;
    rd.base = kmath::dropoutRowBase(d.seed, sv->step, sv->sampleBase + r);
    rd.threshold = kmath::dropoutThreshold(d.rate);
    rd.keepScale = 1.0f / (1.0f - d.rate);
    return rd;
}

// Element-wise work over a [rows, cols] matrix in spans of kRowSpan neighbouring columns of one
// row per warp: each lane takes every 32nd column of the span (kRowChunk of them), so the warp's
// accesses are side by side, the row's values (its dropout key) are computed once per lane and
// span, and the span's row is found with a 32-bit division instead of a 64-bit one per element.
// rowChunkItems() is the number of thread items (32 per span); callers use it when it fits in 31
// bits (rowChunkFits), else an element loop.
constexpr int kRowChunk = 8;
constexpr int64_t kRowSpan = 32 * kRowChunk;
inline int64_t rowChunkItems(int64_t rows, int64_t cols) {
    return rows * ((cols + kRowSpan - 1) / kRowSpan) * 32;
}
inline bool rowChunkFits(int64_t rows, int64_t cols) {
    return cols > 0 && rowChunkItems(rows, cols) < (int64_t{1} << 31);
}
// Runs BODY for each lane's columns c0, c0 + 32, ... below c1 of a span of row r, with r, c0 and
// c1 declared for it (BODY steps its column by 32). The grid-stride step is a multiple of 32
// (blocks of whole warps), so a thread keeps its lane.
#define TD_FOR_ROW_CHUNKS(r, c0, c1, rows, cols, BODY)                                     \
    do {                                                                                   \
        const uint32_t spans_ = static_cast<uint32_t>(((cols) + kRowSpan - 1) / kRowSpan); \
        const uint32_t items_ = static_cast<uint32_t>((rows)*spans_ * 32);                 \
        for (uint32_t it_ = blockIdx.x * blockDim.x + threadIdx.x; it_ < items_;           \
             it_ += gridDim.x * blockDim.x) {                                              \
            const uint32_t w_ = it_ / 32, rq_ = w_ / spans_;                               \
            const int64_t r = rq_;                                                         \
            const int64_t s0_ = static_cast<int64_t>(w_ - rq_ * spans_) * kRowSpan;        \
            const int64_t c0 = s0_ + (it_ % 32);                                           \
            const int64_t c1 = s0_ + kRowSpan < (cols) ? s0_ + kRowSpan : (cols);          \
            BODY                                                                           \
        }                                                                                  \
    } while (0)
__device__ inline float warpSum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ inline double warpSumD(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ inline float warpMax(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// One warp per row: grid of warps over rows.
constexpr int kWarpsPerBlock = kThreads / 32;
inline int rowBlocks(int64_t rows) {
    const int64_t b = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    return static_cast<int>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}
#define TD_FOR_ROWS(r, rows)                                                                 \
    for (int64_t r = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32); \
         r < (rows); r += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock)
#define TD_GRID_STRIDE(i, n)                                                               \
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---- column reductions: fixed row pieces summed in f32, the pieces added in order in double ---
//
// A column reduction over [rows, C] splits the rows into reducePieces(rows) pieces of about
// kRowsPerPiece rows. Phase 1 gives each piece and each 32 columns one block: its 8 warps take
// every 8th row of the piece, a lane per column (a warp's loads side by side), each summing in
// f32, and the 8 lane sums are added in warp order. Phase 2 adds a column's pieces in order in
// double. Which thread adds which value depends on rows and C alone: the same bits on every run
// and every GPU, and enough blocks to fill the GPU when C is small (a BatchNormalization over an
// image's 32 channels and its B*H*W rows).
constexpr int kColLanes = kThreads / 32;
constexpr int64_t kRowsPerPiece = 256;
constexpr int64_t kMaxPieces = 1024;
inline int64_t reducePieces(int64_t rows) {
    const int64_t p = (rows + kRowsPerPiece - 1) / kRowsPerPiece;
    return p < 1 ? 1 : (p > kMaxPieces ? kMaxPieces : p);
}

// Phase 1: part[p * C + c] = sum over the rows of piece p of f(r, c).
template <class F>
__global__ void colPartialKernel(int64_t rows, int64_t C, int64_t pieces, float* part, F f) {
    __shared__ float lane[kColLanes][32];
    const int tx = static_cast<int>(threadIdx.x % 32), ty = static_cast<int>(threadIdx.x / 32);
    const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + tx;
    const int64_t p = blockIdx.y;
    const int64_t r0 = rows * p / pieces, r1 = rows * (p + 1) / pieces;
    float s = 0.f;
    if (c < C)
        for (int64_t r = r0 + ty; r < r1; r += kColLanes) s += f(r, c);
    lane[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && c < C) {
        float t = lane[0][tx];
        for (int k = 1; k < kColLanes; ++k) t += lane[k][tx];
        part[p * C + c] = t;
    }
}

// Phase 2: per column, the double sum of the pieces, handed to fin(c, sum).
template <class G>
__global__ void colFinalKernel(int64_t C, int64_t pieces, const float* part, G fin) {
    TD_GRID_STRIDE(c, C) {
        double s = 0.0;
        for (int64_t p = 0; p < pieces; ++p) s += part[p * C + c];
        fin(c, s);
    }
}

// `scratch`: reducePieces(rows) * C floats.
template <class F, class G>
cudaError_t reduceColumns(cudaStream_t s, int64_t rows, int64_t C, float* scratch, F f, G fin) {
    const int64_t pieces = reducePieces(rows);
    const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(pieces));
    colPartialKernel<<<grid, kThreads, 0, s>>>(rows, C, pieces, scratch, f);
    colFinalKernel<<<blocksFor(C), kThreads, 0, s>>>(C, pieces, scratch, fin);
    return cudaGetLastError();
}

}  // namespace td::cuda::detail
