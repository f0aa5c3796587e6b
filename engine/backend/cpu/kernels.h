// The CPU backend's own vectorised kernels (everything but matrix products, which go to oneDNN).
// Plain functions over raw f32 arrays; shapes in comments. `rows` x `cols` is a row-major
// [B, N] activation. Losses write sum_rows(loss_row) * scale into out[0].
#pragma once

#include <cstdint>

#include "engine/graph/ir.h"  // ActKind, LossKind, MetricKind

namespace td::cpu {

// y[rows, cols] = act(x)
void activation(ActKind k, float alpha, const float* x, float* y, int64_t rows, int64_t cols);
// dx = dy * act'(.) where saved is y (uses_output) or x.
void activationGrad(ActKind k, float alpha, bool usesOutput, const float* dy, const float* saved,
                    float* dx, int64_t rows, int64_t cols);
// y[rows, cols] = x + b[cols]
void biasAdd(const float* x, const float* b, float* y, int64_t rows, int64_t cols);
// db[cols] = sum_rows dy
void biasGrad(const float* dy, float* db, int64_t rows, int64_t cols);
// Inverted dropout keyed by (seed, step, sampleBase + row, col). Same mask forward and backward.
void dropout(const float* x, float* y, int64_t rows, int64_t cols, float rate, uint64_t seed,
             int64_t step, int64_t sampleBase);
void add(const float* a, const float* b, float* y, int64_t n);

// pred [rows, cols]; labels i32 [rows] (sparse kinds) or f32 [rows, cols].
void loss(LossKind k, const float* pred, const void* labels, float* out, int64_t rows, int64_t cols,
          float scale);
void lossGrad(LossKind k, const float* pred, const void* labels, float* dpred, int64_t rows,
              int64_t cols, float scale);
// out[0] = number of correct rows (binary: sum over rows of the fraction of correct units).
void metric(MetricKind k, int64_t topK, bool onLogits, const float* pred, const void* labels,
            float* out, int64_t rows, int64_t cols);

void regLoss(const float* w, int64_t n, float l1, float l2, float* out);
void regGrad(const float* g, const float* w, float* out, int64_t n, float l1, float l2);

// Keyed uniform in [0, 1) (exposed for tests).
float keyedUniform(uint64_t seed, int64_t step, int64_t sample, int64_t col);

}  // namespace td::cpu
