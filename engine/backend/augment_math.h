// Per-element math of the image preprocessing and augmentation kernels, the one definition the
// CPU (cpu/image_kernels.cpp) and CUDA (cuda/cuda_image_kernels.cu) backends share:
//
// - each sample's random draws, keyed like dropout's mask (kernel_math.h, dropout_hash.h) by the
//   layer's seed, the step and the sample's global index, salted per op, so that N replicas equal
//   one device with the same global batch and a resumed run draws what the uninterrupted one did;
// - the transform Keras 3 builds from the draws (RandomRotation, RandomZoom, RandomTranslation:
//   the matrices of its affine layers; RandomContrast and RandomBrightness: their formulas);
// - TensorFlow's sampling: tf.image.resize (half-pixel centres, no antialiasing) and
//   ImageProjectiveTransformV3 (its fill modes and interpolations), which Keras' TensorFlow
//   backend runs (checked against TensorFlow 2.21 by tests/graph/test_augment.cpp).
//
// The CUDA kernels are compiled without fused multiply-add (--fmad=false) and the rotation's sine
// and cosine are taken in double, so both backends sample the same positions.
#pragma once

#include <math.h>

#include <cstdint>

#include "engine/backend/dropout_hash.h"
#include "engine/backend/kernel_math.h"
#include "engine/core/host_device.h"
#include "engine/graph/image_augment.h"

namespace td::kmath {

// ---- keyed draws -------------------------------------------------------------------------------

// Which op draws: two layers with the same seed still draw apart.
enum AugmentSalt : uint32_t {
    kSaltCrop = 1,
    kSaltFlip = 2,
    kSaltRotation = 3,
    kSaltZoom = 4,
    kSaltTranslation = 5,
    kSaltContrast = 6,
    kSaltBrightness = 7,
};

// The key of one sample (its global index) at one step.
TD_HOST_DEVICE inline uint32_t augmentKey(AugmentSalt salt, uint64_t seed, int64_t step,
                                          int64_t sample) {
    return dropoutRowBase(mix64(seed ^ (static_cast<uint64_t>(salt) << 56)), step, sample);
}

// Draw k of a sample: 24 uniform bits.
TD_HOST_DEVICE inline uint32_t augmentBits(uint32_t key, uint32_t k) {
    return dropoutHash24(key, k);
}

// Draw k as a float uniform in [lo, hi).
TD_HOST_DEVICE inline float augmentUniform(uint32_t key, uint32_t k, float lo, float hi) {
    const float u = static_cast<float>(augmentBits(key, k)) * (1.0f / 16777216.0f);
    return lo + u * (hi - lo);
}

// Draw k as an integer uniform in [0, n), n <= 2^31.
TD_HOST_DEVICE inline int64_t augmentBelow(uint32_t key, uint32_t k, int64_t n) {
    return static_cast<int64_t>(
        (static_cast<uint64_t>(augmentBits(key, k)) * static_cast<uint64_t>(n)) >> 24);
}

// RandomFlip: the sample is flipped when its draw is below one half (Keras: uniform <= 0.5).
// In "horizontal_and_vertical" mode Keras flips both ways on the same draw.
TD_HOST_DEVICE inline bool flipDrawn(uint32_t key) {
    return augmentBits(key, 0) < (1u << 23);
}

// RandomCrop: the window's top-left corner, uniform over the positions that fit (Keras draws
// the row first).
TD_HOST_DEVICE inline void cropOffset(const AugmentSpec& a, uint32_t key, int64_t& top,
                                      int64_t& left) {
    top = augmentBelow(key, 0, a.H - a.OH + 1);
    left = augmentBelow(key, 1, a.W - a.OW + 1);
}

// ---- the affine augmentations ------------------------------------------------------------------

// ImageProjectiveTransform's matrix without its projective row: the output position (x, y)
// samples the input at (a0 x + a1 y + a2, b0 x + b1 y + b2).
struct Affine {
    float a0 = 1.f, a1 = 0.f, a2 = 0.f, b0 = 0.f, b1 = 1.f, b2 = 0.f;
};

// RandomRotation: an angle of factor (fractions of a full turn) about the image's centre
// ((W - 1) / 2, (H - 1) / 2), Keras' _compute_affine_matrix without shear, scale or shift.
TD_HOST_DEVICE inline Affine rotationFor(const AugmentSpec& a, uint32_t key) {
    const float degrees = augmentUniform(key, 0, a.factorLo * 360.f, a.factorHi * 360.f);
    const double radians = static_cast<double>(degrees) * (3.14159265358979323846 / 180.0);
    const float c = static_cast<float>(cos(radians)), s = static_cast<float>(sin(radians));
    const float cx = 0.5f * static_cast<float>(a.W - 1);
    const float cy = 0.5f * static_cast<float>(a.H - 1);
    Affine m;
    m.a0 = c;
    m.a1 = -s;
    m.a2 = cx - cx * c + cy * s;  // cx - cx * a0 - cy * a1
    m.b0 = s;
    m.b1 = c;
    m.b2 = cy - cx * s - cy * c;  // cy - cx * b0 - cy * b1
    return m;
}

// RandomZoom: the height by 1 + (factorLo..factorHi), the width by 1 + (widthLo..widthHi) or by
// the height's draw, about the centre (Keras' _get_zoom_matrix).
TD_HOST_DEVICE inline Affine zoomFor(const AugmentSpec& a, uint32_t key) {
    const float zy = augmentUniform(key, 0, 1.f + a.factorLo, 1.f + a.factorHi);
    const float zx = a.ownWidth ? augmentUniform(key, 1, 1.f + a.widthLo, 1.f + a.widthHi) : zy;
    Affine m;
    m.a0 = zx;
    m.a2 = (static_cast<float>(a.W) - 1.f) / 2.f * (1.f - zx);
    m.b1 = zy;
    m.b2 = (static_cast<float>(a.H) - 1.f) / 2.f * (1.f - zy);
    return m;
}

// RandomTranslation: shifted down by (factorLo..factorHi) x H and right by (widthLo..widthHi) x W
// (Keras' _get_translation_matrix).
TD_HOST_DEVICE inline Affine translationFor(const AugmentSpec& a, uint32_t key) {
    const float ty = augmentUniform(key, 0, a.factorLo, a.factorHi) * static_cast<float>(a.H);
    const float tx = augmentUniform(key, 1, a.widthLo, a.widthHi) * static_cast<float>(a.W);
    Affine m;
    m.a2 = -tx;
    m.b2 = -ty;
    return m;
}

// ImageProjectiveTransform's MapCoordinate: an input coordinate outside [0, len - 1] taken back
// inside by the fill mode (reflect: dcba|abcd|dcba, wrap: abcd|abcd|abcd, nearest: the edge;
// constant: left as it is, read as fill_value).
TD_HOST_DEVICE inline float mapCoordinate(FillMode mode, float c, int64_t len) {
    const float last = static_cast<float>(len - 1);
    if (mode == FillMode::Constant) return c;
    if (mode == FillMode::Reflect) {
        if (c < 0.f) {
            if (len <= 1) {
                c = 0.f;
            } else {
                const int64_t sz2 = 2 * len;
                if (c < static_cast<float>(sz2))
                    c = static_cast<float>(sz2 *
                                           static_cast<int64_t>(-c / static_cast<float>(sz2))) +
                        c;
                c = c < static_cast<float>(-len) ? c + static_cast<float>(sz2) : -c - 1.f;
            }
        } else if (c > last) {
            if (len <= 1) {
                c = 0.f;
            } else {
                const int64_t sz2 = 2 * len;
                c -= static_cast<float>(sz2 * static_cast<int64_t>(c / static_cast<float>(sz2)));
                if (c >= static_cast<float>(len)) c = static_cast<float>(sz2) - c - 1.f;
            }
        }
    } else if (mode == FillMode::Wrap) {
        if (c < 0.f) {
            if (len <= 1)
                c = 0.f;
            else
                c += static_cast<float>(
                    len * (static_cast<int64_t>(-c / static_cast<float>(len - 1)) + 1));
        } else if (c > last) {
            if (len <= 1)
                c = 0.f;
            else
                c -=
                    static_cast<float>(len * static_cast<int64_t>(c / static_cast<float>(len - 1)));
        }
    }
    return c < 0.f ? 0.f : (c > last ? last : c);
}

// Pixel (y, x), channel ch of one sample's image [H, W, C], or fill outside it.
TD_HOST_DEVICE inline float readOrFill(const float* img, int64_t H, int64_t W, int64_t C, int64_t y,
                                       int64_t x, int64_t ch, float fill) {
    return (y >= 0 && y < H && x >= 0 && x < W) ? img[(y * W + x) * C + ch] : fill;
}

// Where one output position samples along one axis (x or y): its input coordinate taken back
// inside by the fill mode, and the taps read there. Bilinear reads i0 and i0 + 1 with weights w0
// and w1; nearest reads i0 (rounded half away from zero). `outside`: every tap lies outside the
// image ("constant" only), so the value is fill_value.
struct AxisTap {
    int64_t i0 = 0;
    float w0 = 1.f, w1 = 0.f;
    bool outside = false;
};
TD_HOST_DEVICE inline AxisTap axisTap(const AugmentSpec& a, float coord, int64_t len) {
    const float s = mapCoordinate(a.fill, coord, len);
    AxisTap t;
    // Only "constant" leaves a position outside; one partly inside blends its pixels with
    // fill_value (TensorFlow 2.21, which Keras 3 runs), one wholly outside is fill_value.
    t.outside = s <= -1.f || s >= static_cast<float>(len);
    if (a.interp == Interp::Nearest) {
        t.i0 = static_cast<int64_t>(roundf(s));
        return t;
    }
    const float f = floorf(s);
    t.i0 = static_cast<int64_t>(f);
    t.w0 = (f + 1.f) - s;
    t.w1 = s - f;
    return t;
}

// Channel ch of one sample's image [H, W, C] sampled at the taps tx, ty:
// ImageProjectiveTransformV3's interpolation (bilinear: along x in the rows y0 and y0 + 1, then
// along y).
TD_HOST_DEVICE inline float tapSample(const AugmentSpec& a, const float* img, const AxisTap& tx,
                                      const AxisTap& ty, int64_t ch) {
    if (tx.outside || ty.outside) return a.fillValue;
    auto at = [&](int64_t yy, int64_t xx) {
        return readOrFill(img, a.H, a.W, a.C, yy, xx, ch, a.fillValue);
    };
    if (a.interp == Interp::Nearest) return at(ty.i0, tx.i0);
    const float top = tx.w0 * at(ty.i0, tx.i0) + tx.w1 * at(ty.i0, tx.i0 + 1);
    const float bottom = tx.w0 * at(ty.i0 + 1, tx.i0) + tx.w1 * at(ty.i0 + 1, tx.i0 + 1);
    return ty.w0 * top + ty.w1 * bottom;
}

// The input position an affine augmentation's output position (x, y) samples.
TD_HOST_DEVICE inline float sourceX(const Affine& m, int64_t x, int64_t y) {
    return m.a0 * static_cast<float>(x) + m.a1 * static_cast<float>(y) + m.a2;
}
TD_HOST_DEVICE inline float sourceY(const Affine& m, int64_t x, int64_t y) {
    return m.b0 * static_cast<float>(x) + m.b1 * static_cast<float>(y) + m.b2;
}

// The output position (x, y) of an affine augmentation, channel ch, from one sample's image:
// ImageProjectiveTransformV3's projective generator. Zoom and translation keep the axes apart
// (a1 = b0 = 0): a kernel may then take each column's and each row's taps once (the same numbers:
// a1 * y and b0 * x are +0 for every position).
TD_HOST_DEVICE inline float affineSample(const AugmentSpec& a, const Affine& m, const float* img,
                                         int64_t x, int64_t y, int64_t ch) {
    return tapSample(a, img, axisTap(a, sourceX(m, x, y), a.W), axisTap(a, sourceY(m, x, y), a.H),
                     ch);
}

// ---- resize ------------------------------------------------------------------------------------

// tf.image.resize's source taps of output index i along an axis of `in` positions resized to
// `out`: bilinear reads lo and hi with weight frac on hi (half-pixel centres: position
// (i + 0.5) * in / out - 0.5, clamped to the ends); nearest reads lo.
struct ResizeTap {
    int64_t lo = 0, hi = 0;
    float frac = 0.f;
};
TD_HOST_DEVICE inline ResizeTap resizeTap(Interp interp, int64_t i, int64_t in, int64_t out) {
    const float scale = static_cast<float>(in) / static_cast<float>(out);
    ResizeTap t;
    if (interp == Interp::Nearest) {
        const auto n = static_cast<int64_t>(floorf((static_cast<float>(i) + 0.5f) * scale));
        t.lo = t.hi = n < in - 1 ? n : in - 1;
        return t;
    }
    const float p = (static_cast<float>(i) + 0.5f) * scale - 0.5f;
    const float f = floorf(p);
    const auto lo = static_cast<int64_t>(f), hi = static_cast<int64_t>(ceilf(p));
    t.lo = lo > 0 ? lo : 0;
    t.hi = hi < in - 1 ? hi : in - 1;
    t.frac = p - f;
    return t;
}

// Output position (oy, ox), channel ch, of a resize of the box of one sample's image; the box's
// positions outside the image read fillValue.
TD_HOST_DEVICE inline float resizeSample(const AugmentSpec& a, const float* img, int64_t oy,
                                         int64_t ox, int64_t ch) {
    const ResizeTap ty = resizeTap(a.interp, oy, a.boxH, a.OH);
    const ResizeTap tx = resizeTap(a.interp, ox, a.boxW, a.OW);
    auto at = [&](int64_t yy, int64_t xx) {
        return readOrFill(img, a.H, a.W, a.C, a.boxTop + yy, a.boxLeft + xx, ch, a.fillValue);
    };
    if (a.interp == Interp::Nearest) return at(ty.lo, tx.lo);
    const float tl = at(ty.lo, tx.lo), tr = at(ty.lo, tx.hi);
    const float bl = at(ty.hi, tx.lo), br = at(ty.hi, tx.hi);
    const float top = tl + (tr - tl) * tx.frac;
    const float bottom = bl + (br - bl) * tx.frac;
    return top + (bottom - top) * ty.frac;
}

// ---- colour ------------------------------------------------------------------------------------

TD_HOST_DEVICE inline float clipTo(float v, float lo, float hi) {
    return v < lo ? lo : (v > hi ? hi : v);
}

// RandomContrast: the sample's factor, uniform in [1 - factorLo, 1 + factorHi) (Keras 3).
TD_HOST_DEVICE inline float contrastFactor(const AugmentSpec& a, uint32_t key) {
    return augmentUniform(key, 0, 1.f - a.factorLo, 1.f + a.factorHi);
}
// (x - mean) * factor + mean, clipped to the value range.
TD_HOST_DEVICE inline float contrast(const AugmentSpec& a, float x, float mean, float factor) {
    return clipTo((x - mean) * factor + mean, a.valueLo, a.valueHi);
}

// RandomBrightness: the sample's shift, uniform in [factorLo, factorHi) x the value range's width.
TD_HOST_DEVICE inline float brightnessDelta(const AugmentSpec& a, uint32_t key) {
    return augmentUniform(key, 0, a.factorLo, a.factorHi) * (a.valueHi - a.valueLo);
}
// x + delta, clipped to the value range.
TD_HOST_DEVICE inline float brightness(const AugmentSpec& a, float x, float delta) {
    return clipTo(x + delta, a.valueLo, a.valueHi);
}

}  // namespace td::kmath
