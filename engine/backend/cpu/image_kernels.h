// The CPU backend's own kernels for images and normalization (convolutions go to oneDNN).
// Images are channels-last: x[b, h, w, c] at ((b * H + h) * W + w) * C + c. Reductions over the
// batch (channel statistics, gamma gradients) add fixed blocks of rows in double and combine
// the blocks in order: the result does not depend on the thread count.
#pragma once

#include <cstdint>

#include "engine/graph/conv_geometry.h"
#include "engine/graph/image_augment.h"

namespace td::cpu {

// Pooling reads a window's geometry (graph/conv_geometry.h): x [B,H,W,C] -> y [B,OH,OW,C],
// window kh x kw, strides sh, sw, padTop and padLeft before the first window.

// y = the maximum of each window's positions inside the image (padding never wins).
void maxPool(const ConvGeometry& p, const float* x, float* y);
// dx = 0, then each dy added at the first maximum of its window (x read again). An image's
// H * W * C must be below 2^31. Windows that do not overlap (strides at least the window) write
// each position once instead, band by band.
void maxPoolGrad(const ConvGeometry& p, const float* dy, const float* x, float* dx);
// y = the mean over each window's positions inside the image (padding not counted).
void avgPool(const ConvGeometry& p, const float* x, float* y);
void avgPoolGrad(const ConvGeometry& p, const float* dy, float* dx);

// y [B, H + top + bottom, W + left + right, C]: x with zeros around it.
void pad2d(const float* x, float* y, int64_t B, int64_t H, int64_t W, int64_t C, int64_t top,
           int64_t bottom, int64_t left, int64_t right);
// dx [B,H,W,C] = the inner part of dy.
void pad2dGrad(const float* dy, float* dx, int64_t B, int64_t H, int64_t W, int64_t C, int64_t top,
               int64_t bottom, int64_t left, int64_t right);

// The fixed number of pieces a channel reduction splits its rows into (row r of `rows` in piece
// r * pieces / rows): each piece summed row by row in float, the pieces added in order in double.
constexpr int64_t kChannelSumBlocks = 64;
// sums[c] = the sum of x [rows, C] over its rows (the bias gradient of an image), by pieces.
void channelSums(const float* x, float* sums, int64_t rows, int64_t C);
// sums[c] = pieceSums[0][c] + ... + pieceSums[pieces - 1][c], added in order in double: the last
// step of a reduction by pieces run elsewhere (the CPU program's team rows).
void addPieceSums(const float* pieceSums, int64_t pieces, int64_t C, float* sums);

// y = x * scale + offset (n values).
void scale(const float* x, float* y, int64_t n, float scale, float offset);

// Over x [rows, C]: mean[c] and the biased variance var[c] (x - mean)^2 / rows.
void channelMean(const float* x, float* mean, int64_t rows, int64_t C);
void channelVar(const float* x, const float* mean, float* var, int64_t rows, int64_t C);
// y = (x - mean) / sqrt(var + eps) * gamma + beta per channel; gamma, beta may be null (1, 0).
void batchNorm(const float* x, const float* mean, const float* var, const float* gamma,
               const float* beta, float* y, int64_t rows, int64_t C, float eps);
// dx of batchNorm. batchStats: mean and var are x's own, so dx also carries their gradient:
// dx = gamma * inv * (dy - sum(dy) / rows - x_hat * sum(dy * x_hat) / rows); else
// dx = gamma * inv * dy.
// With batchStats, sumDy and sumDyXhat (when not null) receive sum(dy) and sum(dy * x_hat): the
// beta and gamma gradients, as channelSums and normGammaGrad compute them.
void batchNormGrad(const float* dy, const float* x, const float* mean, const float* var,
                   const float* gamma, float* dx, int64_t rows, int64_t C, float eps,
                   bool batchStats, float* sumDy = nullptr, float* sumDyXhat = nullptr);
// dgamma[c] = sum over rows of dy * x_hat.
void normGammaGrad(const float* dy, const float* x, const float* mean, const float* var,
                   float* dgamma, int64_t rows, int64_t C, float eps);
// param = param * momentum + stat * (1 - momentum)
void movingAvg(float* param, const float* stat, int64_t n, float momentum);

// Per row of x [rows, C]: (x - mean_row) / sqrt(var_row + eps) * gamma + beta.
void layerNorm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
               int64_t C, float eps);
void layerNormGrad(const float* dy, const float* x, const float* gamma, float* dx, int64_t rows,
                   int64_t C, float eps);
void layerNormGammaGrad(const float* dy, const float* x, float* dgamma, int64_t rows, int64_t C,
                        float eps);

// Image preprocessing and augmentation, x [B,H,W,C] -> y [B,OH,OW,C] as `a` says
// (graph/image_augment.h), with the per-element math every backend shares
// (backend/augment_math.h). The random ones draw sample b's transform from (a.seed, step,
// sampleBase + b): the same on any device and for any split of the batch across replicas.
void resize(const AugmentSpec& a, const float* x, float* y);
void randomCrop(const AugmentSpec& a, const float* x, float* y, int64_t step, int64_t sampleBase);
// Also its own gradient (the same flips of dy).
void randomFlip(const AugmentSpec& a, const float* x, float* y, int64_t step, int64_t sampleBase);
void randomRotation(const AugmentSpec& a, const float* x, float* y, int64_t step,
                    int64_t sampleBase);
void randomZoom(const AugmentSpec& a, const float* x, float* y, int64_t step, int64_t sampleBase);
void randomTranslation(const AugmentSpec& a, const float* x, float* y, int64_t step,
                       int64_t sampleBase);
// The channel means of each sample (over H and W, summed in double) for the contrast.
void randomContrast(const AugmentSpec& a, const float* x, float* y, int64_t step,
                    int64_t sampleBase);
void randomBrightness(const AugmentSpec& a, const float* x, float* y, int64_t step,
                      int64_t sampleBase);

}  // namespace td::cpu
