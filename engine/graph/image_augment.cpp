#include "engine/graph/image_augment.h"

#include <cmath>
#include <limits>

namespace td {

bool hasAugmentSpec(Op op) {
    return op == Op::Resize || isRandomAugment(op);
}

bool isRandomAugment(Op op) {
    switch (op) {
        case Op::RandomCrop:
        case Op::RandomFlip:
        case Op::RandomRotation:
        case Op::RandomZoom:
        case Op::RandomTranslation:
        case Op::RandomContrast:
        case Op::RandomBrightness:
            return true;
        default:
            return false;
    }
}

namespace {

// A float attribute as the kernels read it: finite and representable in f32.
Result<float> finiteFloat(const std::optional<double>& v, const char* name, bool required,
                          double fallback = 0.0) {
    if (!v && required) return err(std::string("missing attribute ") + name);
    const double d = v.value_or(fallback);
    if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max())
        return err(std::string(name) + " must be a finite f32 number");
    return static_cast<float>(d);
}

// A range attribute pair (lo <= hi).
Status range(const NodeAttrs& a, const std::optional<double> NodeAttrs::*lo,
             const std::optional<double> NodeAttrs::*hi, const char* loName, const char* hiName,
             float& outLo, float& outHi) {
    TD_ASSIGN_OR_RETURN(outLo, finiteFloat(a.*lo, loName, true));
    TD_ASSIGN_OR_RETURN(outHi, finiteFloat(a.*hi, hiName, true));
    if (outLo > outHi)
        return err(std::string(loName) + " " + fmtNum(*(a.*lo)) + " > " + hiName + " " +
                   fmtNum(*(a.*hi)));
    return Status::success();
}

}  // namespace

Result<AugmentSpec> augmentSpec(const Graph& g, const Node& n) {
    if (n.inputs.size() != 1) return err("takes one image");
    const Shape& x = g.node(n.inputs[0]).shape;
    const Shape& y = n.shape;
    if (x.size() != 4) return err("expects an image [B,H,W,C], got " + shapeToString(x));
    if (y.size() != 4 || y[0] != x[0] || y[3] != x[3])
        return err("result shape " + shapeToString(y) + " must be [" + std::to_string(x[0]) +
                   ",OH,OW," + std::to_string(x[3]) + "]");
    AugmentSpec s;
    s.B = x[0];
    s.H = x[1];
    s.W = x[2];
    s.C = x[3];
    s.OH = y[1];
    s.OW = y[2];
    if (s.H * s.W * s.C >= (int64_t(1) << 31) || s.OH * s.OW * s.C >= (int64_t(1) << 31))
        return err("an image of 2^31 values or more");
    const NodeAttrs& a = n.attrs;
    s.seed = a.seed.value_or(0);
    TD_ASSIGN_OR_RETURN(s.fillValue, finiteFloat(a.fillValue, "fill_value", false));
    const bool sameSize = s.OH == s.H && s.OW == s.W;
    switch (n.op) {
        case Op::Resize: {
            if (!a.box || a.box->size() != 4)
                return err("box must be four sizes (top x left x height x width)");
            if (!a.interp) return err("missing attribute interp");
            const std::vector<int64_t>& b = *a.box;
            s.boxTop = b[0];
            s.boxLeft = b[1];
            s.boxH = b[2];
            s.boxW = b[3];
            s.interp = *a.interp;
            if (s.boxH < 1 || s.boxW < 1) return err("box height and width must be >= 1");
            // The box may reach outside the image (padding), but must hold some of it.
            if (s.boxTop >= s.H || s.boxLeft >= s.W || s.boxTop + s.boxH <= 0 ||
                s.boxLeft + s.boxW <= 0)
                return err("box " + std::to_string(s.boxTop) + "x" + std::to_string(s.boxLeft) +
                           "x" + std::to_string(s.boxH) + "x" + std::to_string(s.boxW) +
                           " does not fit the image " + std::to_string(s.H) + "x" +
                           std::to_string(s.W));
            return s;
        }
        case Op::RandomCrop:
            if (s.OH > s.H || s.OW > s.W)
                return err("crops " + std::to_string(s.OH) + "x" + std::to_string(s.OW) +
                           " out of a smaller image " + std::to_string(s.H) + "x" +
                           std::to_string(s.W));
            return s;
        case Op::RandomFlip:
            if (!sameSize) return err("result shape differs from input");
            if (!a.flip) return err("missing attribute flip");
            s.flip = *a.flip;
            return s;
        case Op::RandomRotation:
        case Op::RandomZoom:
        case Op::RandomTranslation:
            if (!sameSize) return err("result shape differs from input");
            if (!a.fill) return err("missing attribute fill");
            if (!a.interp) return err("missing attribute interp");
            s.fill = *a.fill;
            s.interp = *a.interp;
            TD_RETURN_IF_ERROR(range(a, &NodeAttrs::factorLo, &NodeAttrs::factorHi, "factor_lo",
                                     "factor_hi", s.factorLo, s.factorHi));
            if (n.op == Op::RandomRotation) return s;
            if (a.widthLo || a.widthHi || n.op == Op::RandomTranslation) {
                TD_RETURN_IF_ERROR(range(a, &NodeAttrs::widthLo, &NodeAttrs::widthHi, "width_lo",
                                         "width_hi", s.widthLo, s.widthHi));
                s.ownWidth = true;
            }
            return s;
        case Op::RandomContrast:
        case Op::RandomBrightness:
            if (!sameSize) return err("result shape differs from input");
            TD_RETURN_IF_ERROR(range(a, &NodeAttrs::factorLo, &NodeAttrs::factorHi, "factor_lo",
                                     "factor_hi", s.factorLo, s.factorHi));
            TD_RETURN_IF_ERROR(range(a, &NodeAttrs::valueLo, &NodeAttrs::valueHi, "value_lo",
                                     "value_hi", s.valueLo, s.valueHi));
            return s;
        default:
            return err(std::string(opName(n.op)) + " is not an image augmentation op");
    }
}

}  // namespace td
