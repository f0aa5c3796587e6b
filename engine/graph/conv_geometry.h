// The geometry of a 2-D window over channels-last images, decoded once: a convolution and its two
// gradients, max and average pooling and their gradients, and zero padding (a 1x1 window with
// pads). lower() stores it in each such instruction (Instr::geometry); the CPU and CUDA backends
// read their sizes, strides and pads from it and nothing else, and the CUDA kernels take it by
// value. verifyGraph holds the graph's shapes to the same arithmetic.
//
// Keras' padding names are resolved before the graph exists: "same" / "valid" become explicit
// pads in the builder (model/layers.h windowGeometry), so here the pads are numbers.
#pragma once

#include <cstdint>

#include "engine/core/result.h"
#include "engine/graph/ir.h"

namespace td {

// x [B,H,W,C] -> y [B,OH,OW,F]; a convolution's kernel is [kh,kw,C/groups,F] (Keras' layout).
// Pooling and padding keep the channels (F = C) and have no dilation; padding has a 1x1 window.
// A plain struct of integers (the CUDA kernels take it as a __global__ argument).
struct ConvGeometry {
    int64_t B = 0, H = 0, W = 0, C = 0;  // the image x
    int64_t OH = 0, OW = 0, F = 0;       // the result y
    int64_t kh = 1, kw = 1;              // kernel or pooling window
    int64_t sh = 1, sw = 1;              // strides
    int64_t dh = 1, dw = 1;              // dilation
    int64_t padTop = 0, padBottom = 0, padLeft = 0, padRight = 0;
    int64_t groups = 1;  // C and F each split into `groups` independent convolutions
};

// Whether nodes of `op` have a ConvGeometry: conv2d, conv2d_grad_input, conv2d_grad_filter,
// max_pool, max_pool_grad, avg_pool, avg_pool_grad, pad2d, pad2d_grad.
bool hasConvGeometry(Op op);

// Which of such a node's shapes is which: the image x, the kernel (convolutions; else null) and
// the result-side image y. The forward ops read x (and the kernel) and write y; conv2d_grad_input
// reads dy (shaped y) and the kernel and writes dx (shaped x); conv2d_grad_filter reads x and dy
// and writes the kernel's gradient; the pooling and padding gradients read dy and write dx.
struct ConvShapes {
    const Shape* x = nullptr;
    const Shape* kernel = nullptr;
    const Shape* y = nullptr;
};
ConvShapes convShapes(const Graph& g, const Node& n);

// The geometry of node `n` (hasConvGeometry(n.op)) from its shapes and attributes: sizes from x
// and the kernel (or the window attribute), strides, dilation, pads and groups from the
// attributes (absent: 1, 1, 0, 1), and OH/OW = (in + pads - ((k - 1) * dilation + 1)) / stride + 1
// (padding: in + pads).
// The result shape y is not read: verifyGraph checks that it is [B,OH,OW,F]. The attributes must
// have their arities (verifyGraph checks those first). Errors, as verifyGraph reports them: not an
// image or kernel, channels that do not split into the groups, a missing pooling window, pooling
// with dilation, a window larger than the padded input.
Result<ConvGeometry> convGeometry(const Graph& g, const Node& n);

}  // namespace td
