// The parameters of an image preprocessing or augmentation op (resize, random_crop, random_flip,
// random_rotation, random_zoom, random_translation, random_contrast, random_brightness), decoded
// once: lower() stores them in each such instruction (Instr::augment); the CPU and CUDA kernels
// read them and nothing else (the CUDA kernels take the struct by value), and verifyGraph holds
// the graph's attributes and shapes to the same rules.
//
// Images are channels-last, x [B,H,W,C] -> y [B,OH,OW,C] (OH x OW = H x W but for resize and
// random_crop). The per-sample randomness (backend/augment_math.h) is keyed by (seed, the step,
// the global index of the sample), so it is the same on every device and replica layout.
#pragma once

#include <cstdint>

#include "engine/core/result.h"
#include "engine/graph/ir.h"

namespace td {

// A plain struct of numbers (a __global__ argument of the CUDA kernels).
struct AugmentSpec {
    int64_t B = 0, H = 0, W = 0, C = 0;  // the image x
    int64_t OH = 0, OW = 0;              // the result y
    // resize: the part of x resized, rows [boxTop, boxTop + boxH), columns [boxLeft, boxLeft +
    // boxW); positions outside x read fillValue.
    int64_t boxTop = 0, boxLeft = 0, boxH = 0, boxW = 0;
    Interp interp = Interp::Bilinear;
    FillMode fill = FillMode::Reflect;
    FlipMode flip = FlipMode::HorizontalAndVertical;
    float fillValue = 0.f;
    // The random factor's range: random_rotation (fractions of a full turn), random_zoom and
    // random_translation (the height's), random_contrast, random_brightness.
    float factorLo = 0.f, factorHi = 0.f;
    // random_zoom, random_translation: the width's range; random_zoom without one (ownWidth
    // false) zooms the width by the height's draw.
    float widthLo = 0.f, widthHi = 0.f;
    bool ownWidth = false;
    float valueLo = 0.f, valueHi = 0.f;  // random_contrast, random_brightness: the clip range
    uint64_t seed = 0;
};

// Whether nodes of `op` have an AugmentSpec (the eight ops above).
bool hasAugmentSpec(Op op);
// Whether `op` draws random numbers per sample (every one of them but resize).
bool isRandomAugment(Op op);

// The spec of node `n` (hasAugmentSpec(n.op)) from its operand's and its own shape and its
// attributes. Errors, as verifyGraph reports them: not an image, a result of another shape, a
// missing or invalid attribute ("missing attribute fill", "factor_lo 0.5 > factor_hi 0.2").
Result<AugmentSpec> augmentSpec(const Graph& g, const Node& n);

}  // namespace td
