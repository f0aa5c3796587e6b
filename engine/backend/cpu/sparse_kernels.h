// Products that skip the zeros of one f32 operand: images with a background, one-hot features and
// activations after ReLU hold many exact zeros, and a zero contributes nothing to a sum of
// products. Each kernel takes the sparse operand's rows (or columns) two at a time and lists the
// positions where either is nonzero (AVX-512 compresses, AVX2 packs with one permutation from a
// table; no branch per element); then each listed row of the dense operand is loaded once for
// both, with the dense operand's block in L1 while the lists run over it, and the two values are
// read from the sparse operand itself at that position. The sums
// run in index order, so a result differs from a dense product's only in the order of the additions
// (and a zero times an infinite or NaN value, which a dense product turns into NaN, is skipped).
// The work is the listed positions: both kernels return how many there were, for the caller to
// compare with the dense product's (the pairs times the shared dimension).
//
// With them, one dense product oneDNN handles poorly: a narrow one (an output of at most two
// vectors' width, such as a classifier's ten classes), which oneDNN's AVX2 kernels pad to their
// own tile. Private to engine/backend/cpu, its tests and bench/bench_sparse.cpp.
#pragma once

#include <cstdint>

#include "engine/core/cpu_isa.h"

namespace td::cpu::sparse {

// The lists hold the dense operand's row indices in 32 bits: its rows (K, B) must stay below 2^31.
struct Kernels {
    // y[M,N] (row stride ldy) = x[M,K] (row stride ldx) . w[K,N] (row stride ldw).
    // x's rows are grouped in pairRows' order. Returns the positions listed (of
    // ceil(M / rowsGroup) groups' K each).
    int64_t (*rowsTimesDense)(const float* x, int64_t ldx, int64_t M, int64_t K, const float* w,
                              int64_t ldw, int64_t N, float* y, int64_t ldy);
    // dw[K,N] (row stride lddw) = x[B,K]^T (x's row stride ldx) . dy[B,N] (row stride ldy): the
    // weight gradient of a product whose input x skips its zeros. Returns the positions listed (of
    // ceil(K / colsGroup) groups' B each).
    int64_t (*transposedTimesDense)(const float* x, int64_t ldx, int64_t B, int64_t K,
                                    const float* dy, int64_t ldy, int64_t N, float* dw,
                                    int64_t lddw);
    // The order in which rowsTimesDense groups x's rows (order[rowsGroup * p + g], M entries, a
    // permutation of [0, M)): rows with zeros in the same places together. For the tests and
    // the benchmark; the kernel computes it itself.
    void (*pairRows)(const float* x, int64_t ldx, int64_t M, int64_t K, int32_t* order);
    // c[M,N] (row stride ldc) = a . b[K,N] (row stride ldb) + bias (null: none) for N up to
    // narrowMaxCols, where a's element (r, k) is a[r * sr + k * sk] (a row-major [M,K] or a
    // transposed [K,M]): several rows at a time, the sums over k in order with explicit
    // multiply-adds, the bias added after the last.
    void (*narrowProduct)(const float* a, int64_t sr, int64_t sk, int64_t M, int64_t K,
                          const float* b, int64_t ldb, int64_t N, const float* bias, float* c,
                          int64_t ldc);
    int64_t narrowMaxCols = 0;
    // How many rows (columns) of x each list covers; the dense product's work in the kernels'
    // count is ceil(M / rowsGroup) * K (ceil(K / colsGroup) * B).
    int rowsGroup = 2;
    int colsGroup = 2;
    // c[M,N] (row stride ldc) = a[M,K] (row stride lda) . b^T, b a row-major [N,K] (row stride
    // ldb), for K up to shortMaxInner: the input gradient of a layer with few outputs (a
    // classifier's ten classes), which oneDNN's kernels run at a fraction of their rate. b is
    // transposed into a [K,N] buffer of the calling thread's, then two rows of c at a time, the
    // sums over k in order with explicit multiply-adds.
    void (*shortProduct)(const float* a, int64_t lda, int64_t M, int64_t K, const float* b,
                         int64_t ldb, int64_t N, float* c, int64_t ldc) = nullptr;
    int64_t shortMaxInner = 0;
};

// The kernels for the level activeCpuIsa() chose, or null at the generic level: the products
// then stay dense. Read when a program is built (the CPU device's passes cpu_skip_zeros and
// cpu_narrow_kernel decide where they run).
const Kernels* active();
// The kernels of `isa` whatever the environment says: null for the generic level and for a level
// this CPU lacks (AVX2 also needs FMA). For the tests and the benchmark.
const Kernels* forIsa(CpuIsa isa);

}  // namespace td::cpu::sparse
