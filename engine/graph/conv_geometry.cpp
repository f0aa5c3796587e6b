#include "engine/graph/conv_geometry.h"

#include <string>

namespace td {

namespace {

bool isConv(Op op) {
    return op == Op::Conv2D || op == Op::Conv2DGradInput || op == Op::Conv2DGradFilter;
}

bool isPool(Op op) {
    return op == Op::MaxPool || op == Op::MaxPoolGrad || op == Op::AvgPool || op == Op::AvgPoolGrad;
}

// Output size of one spatial axis: -1 when no window fits.
int64_t windowOut(int64_t in, int64_t k, int64_t stride, int64_t dil, int64_t padLo,
                  int64_t padHi) {
    const int64_t span = (k - 1) * dil + 1;
    const int64_t room = in + padLo + padHi - span;
    return room < 0 ? -1 : room / stride + 1;
}

}  // namespace

bool hasConvGeometry(Op op) {
    return isConv(op) || isPool(op) || op == Op::Pad2D || op == Op::Pad2DGrad;
}

ConvShapes convShapes(const Graph& g, const Node& n) {
    auto in = [&](size_t j) -> const Shape* { return &g.node(n.inputs.at(j)).shape; };
    switch (n.op) {
        case Op::Conv2D:
            return {in(0), in(1), &n.shape};
        case Op::Conv2DGradInput:
            return {&n.shape, in(1), in(0)};
        case Op::Conv2DGradFilter:
            return {in(0), &n.shape, in(1)};
        case Op::MaxPool:
        case Op::AvgPool:
        case Op::Pad2D:
            return {in(0), nullptr, &n.shape};
        case Op::MaxPoolGrad:
        case Op::AvgPoolGrad:
        case Op::Pad2DGrad:
            return {&n.shape, nullptr, in(0)};
        default:
            TD_ASSERT_MSG(false, "convShapes: not a window op");
            return {};
    }
}

Result<ConvGeometry> convGeometry(const Graph& g, const Node& n) {
    const NodeAttrs& a = n.attrs;
    const ConvShapes s = convShapes(g, n);
    const Shape& x = *s.x;
    const bool conv = isConv(n.op), pool = isPool(n.op);
    if (pool && !a.window) return err("missing attribute window");
    if (pool && a.dilation) return err("pooling has no dilation");
    if (x.size() != 4 || (conv && s.kernel->size() != 4))
        return err(conv ? "expects an image [B,H,W,C] and a kernel [KH,KW,C/groups,F]"
                        : "expects an image [B,H,W,C]");
    const auto st = a.stridesOr(), dl = a.dilationOr(), pd = a.padsOr();
    TD_ASSERT_MSG(
        st.size() == 2 && dl.size() == 2 && pd.size() == 4 && (!a.window || a.window->size() == 2),
        "convGeometry: attributes of the wrong arity (run verifyGraph first)");
    ConvGeometry geo;
    geo.B = x[0];
    geo.H = x[1];
    geo.W = x[2];
    geo.C = x[3];
    geo.F = geo.C;
    if (conv) {
        const Shape& k = *s.kernel;
        geo.kh = k[0];
        geo.kw = k[1];
        geo.F = k[3];
        geo.groups = a.groupsOr();
        if (geo.groups < 1 || geo.C % geo.groups != 0 || geo.F % geo.groups != 0 ||
            k[2] * geo.groups != geo.C)
            return err("kernel " + shapeToString(k) + " does not fit " + std::to_string(geo.C) +
                       " channels in " + std::to_string(geo.groups) + " groups");
    } else if (pool) {
        geo.kh = (*a.window)[0];
        geo.kw = (*a.window)[1];
    }
    geo.sh = st[0];
    geo.sw = st[1];
    geo.dh = dl[0];
    geo.dw = dl[1];
    geo.padTop = pd[0];
    geo.padBottom = pd[1];
    geo.padLeft = pd[2];
    geo.padRight = pd[3];
    if (!conv && !pool) {  // padding
        geo.OH = geo.H + geo.padTop + geo.padBottom;
        geo.OW = geo.W + geo.padLeft + geo.padRight;
        return geo;
    }
    geo.OH = windowOut(geo.H, geo.kh, geo.sh, geo.dh, geo.padTop, geo.padBottom);
    geo.OW = windowOut(geo.W, geo.kw, geo.sw, geo.dw, geo.padLeft, geo.padRight);
    if (geo.OH <= 0 || geo.OW <= 0)
        return err((conv ? "kernel " + shapeToString(*s.kernel) : std::string("window")) +
                   " larger than the padded input");
    return geo;
}

}  // namespace td
