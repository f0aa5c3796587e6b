// The IR: a graph of single-output nodes in topological order. One node = one value. Prints to
// text and parses back, so tests can state a graph in a few lines:
//
//   graph train {
//     %0 = input() : f32[32,784]
//     %1 = param() {name="dense/kernel"} : f32[784,128]
//     %2 = matmul(%0, %1) {trans_a=0, trans_b=0} : f32[32,128]
//     ...
//     output loss = %9
//     grad %1 = %14
//   }
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/core/result.h"
#include "engine/core/tensor.h"

namespace td {

enum class Op : uint8_t {
    Input,    // the batch features, [B, ...]
    Label,    // the batch labels, i32 [B] or f32 [B, k]
    Param,    // a trainable (or frozen) variable; attrs name, trainable
    Reshape,  // a view with a new shape
    MatMul,   // [M,K] x [K,N] (with trans_a / trans_b on the stored operands)
    BiasAdd,  // x [B,N] + b [N]
    Act,      // elementwise (or row-wise softmax) activation; attrs act, alpha
    Dense,    // fused matmul + bias + act; inputs x, w, (b); attrs act, alpha, has_bias
    Dropout,  // inverted dropout keyed by (seed, step, sample index); attrs rate, seed
    Loss,     // scalar: sum over rows of the per-sample loss * scale; attrs loss, scale
    Metric,   // scalar: number of correct rows; attrs metric, k, on_logits
    RegLoss,  // scalar: l1*sum|w| + l2*sum w^2; attrs l1, l2
    // Backward ops
    LossGrad,     // d loss / d pred for inputs (pred, label)
    ActGrad,      // inputs (dy, x_or_y); attrs act, alpha, uses_output
    DropoutGrad,  // inputs (dy); same mask as the forward Dropout
    BiasGrad,     // column sums of dy [B,N] -> [N]
    RegGrad,      // inputs (g, w): g + d RegLoss/dw
    Add,          // a + b
    Cast,         // the value in the node's dtype (f32 <-> bf16 / f16), rounded to nearest even
    // Convolutional and normalization ops. Images are channels-last: [B,H,W,C]. Windows: strides,
    // dilation ([h,w]), pads ([top,bottom,left,right]) and window ([h,w], pooling).
    Conv2D,              // x [B,H,W,C], w [KH,KW,C/groups,F][, b [F]] -> [B,OH,OW,F]; strides,
                         // dilation, pads, groups; act, alpha, has_bias (fused post-ops)
    Conv2DGradInput,     // (dy, w) -> dx, the node's shape; same attributes as the conv
    Conv2DGradFilter,    // (x, dy) -> dw, the node's shape
    MaxPool,             // x [B,H,W,C] -> [B,OH,OW,C]; window, strides, pads (padding never wins)
    MaxPoolGrad,         // (dy, x) -> dx: dy to the first maximum of each window
    AvgPool,             // x -> mean over each window's elements inside the image
    AvgPoolGrad,         // (dy) -> dx, the node's shape
    Pad2D,               // x [B,H,W,C] -> zeros around; pads
    Pad2DGrad,           // (dy) -> dx: the inner part; pads
    Scale,               // x * scale + offset (Rescaling; its gradient: offset 0)
    ChannelMean,         // x [..., C] -> [C]: mean over every other axis
    ChannelVar,          // (x, mean) -> [C]: biased variance over every other axis
    BatchNorm,           // (x, mean, var[, gamma][, beta]) -> (x - mean) / sqrt(var + epsilon)
                         //   * gamma + beta per channel (last axis); epsilon, has_gamma, has_beta
    BatchNormGrad,       // (dy, x, mean, var[, gamma]) -> dx; batch_stats: mean and var are the
                         //   batch's own (their dependence on x is part of dx)
    NormGammaGrad,       // (dy, x, mean, var) -> [C]: sum of dy * x_hat per channel; epsilon
    MovingAvg,           // (param, stat) -> the param, updated in place:
                         //   param = param * momentum + stat * (1 - momentum); momentum
    LayerNorm,           // (x[, gamma][, beta]) -> normalized over the last axis per row; epsilon,
                         //   has_gamma, has_beta
    LayerNormGrad,       // (dy, x[, gamma]) -> dx; epsilon, has_gamma
    LayerNormGammaGrad,  // (dy, x) -> [C]: sum over rows of dy * x_hat; epsilon
    // Image preprocessing and augmentation, x [B,H,W,C] (graph/image_augment.h decodes their
    // attributes; backend/augment_math.h holds the math every backend shares). The random ones
    // draw each sample's transform from (seed, step, global sample index), as dropout its mask.
    Resize,             // x -> [B,OH,OW,C]: the part `box` (top x left x height x width, may
                        //   reach outside x: those positions read fill_value) resized as
                        //   tf.image.resize (half-pixel centres); interp, fill_value
    RandomCrop,         // x -> [B,OH,OW,C]: an OH x OW window at a random offset per sample; seed
    RandomFlip,         // each sample mirrored or not; flip, seed. Its own gradient (same flip)
    RandomRotation,     // rotated by (factor_lo..factor_hi) x 2 pi; fill, fill_value, interp, seed
    RandomZoom,         // zoomed by 1 + (factor_lo..factor_hi) (height), 1 + (width_lo..width_hi)
                        //   (width; absent: the height's zoom); fill, fill_value, interp, seed
    RandomTranslation,  // shifted by (factor_lo..factor_hi) x H and (width_lo..width_hi) x W;
                        //   fill, fill_value, interp, seed
    RandomContrast,     // (x - mean over H,W per channel) x f + mean, f in 1 - factor_lo ..
                        //   1 + factor_hi, clipped to value_lo..value_hi; seed
    RandomBrightness,   // x + d x (value_hi - value_lo), d in factor_lo..factor_hi, clipped to
                        //   value_lo..value_hi; seed
};

// Ops whose value is a view of their first operand's storage (no buffer of their own): reshape,
// and moving_avg (it writes the parameter it updates).
inline bool aliasesOperand(Op op) {
    return op == Op::Reshape || op == Op::MovingAvg;
}

const char* opName(Op op);
Result<Op> parseOp(const std::string& s);

// Activation of act, act_grad and dense.
enum class ActKind : uint8_t { Linear, Relu, LeakyRelu, Elu, Gelu, Sigmoid, Tanh, Softmax };
// The loss kernel of loss and loss_grad: which probabilities (or logits) meet which labels.
enum class LossKind : uint8_t {
    SparseSoftmaxXent,  // logits [B,N], class ids i32 [B]
    SoftmaxXent,        // logits [B,N], one-hot f32 [B,N]
    SparseXent,         // probabilities [B,N], class ids
    Xent,               // probabilities [B,N], one-hot
    SigmoidBce,         // logits [B,N], f32 targets
    Bce,                // probabilities [B,N], f32 targets
    Mse                 // predictions [B,N], f32 targets
};
// The metric kernel: number of correct rows (binary: fraction of correct units per row).
enum class MetricKind : uint8_t { SparseCategorical, Categorical, Binary, SparseTopK, TopK };
// The image ops' options (Keras' names in the text form: "bilinear", "reflect", "horizontal").
enum class Interp : uint8_t { Bilinear, Nearest };
enum class FillMode : uint8_t { Reflect, Wrap, Constant, Nearest };  // as ImageProjectiveTransform
enum class FlipMode : uint8_t { HorizontalAndVertical, Horizontal, Vertical };
// Where a value lives after MemoryPlanPass.
// Shadow: a 16-bit copy of a parameter kept across steps, written by the optimizer update (a cast
// folded into the update) instead of being recomputed at the start of every step.
enum class BufKind : uint8_t { Param, Grad, Input, Label, Arena, Alias, Shadow };

// Text names ("relu", "sparse_softmax_xent", "top_k", "arena") and their inverses. The parse
// functions list the accepted names in their errors.
const char* actName(ActKind k);
Result<ActKind> parseActKind(const std::string& s);
const char* lossKindName(LossKind k);
Result<LossKind> parseLossKind(const std::string& s);
const char* metricKindName(MetricKind k);
Result<MetricKind> parseMetricKind(const std::string& s);
const char* bufKindName(BufKind k);
Result<BufKind> parseBufKind(const std::string& s);
const char* interpName(Interp k);
Result<Interp> parseInterp(const std::string& s);
const char* fillName(FillMode k);
Result<FillMode> parseFill(const std::string& s);
const char* flipName(FlipMode k);
Result<FlipMode> parseFlip(const std::string& s);

// Typed attributes of a node. Every field is optional: a set field is printed in the text form
// (sorted by its text name, shown after each field), an unset one is not, so text round-trips
// exactly. Readers use the *Or() accessors for the default an op assumes.
struct NodeAttrs {
    std::optional<std::string> name;   // name: param
    std::optional<bool> trainable;     // trainable: param (absent = trainable)
    std::optional<bool> transA;        // trans_a: matmul, operand stored transposed
    std::optional<bool> transB;        // trans_b: matmul
    std::optional<ActKind> act;        // act: act, act_grad, dense
    std::optional<double> alpha;       // alpha: leaky_relu slope, elu alpha
    std::optional<bool> usesOutput;    // uses_output: act_grad reads y (1) or x (0)
    std::optional<bool> hasBias;       // has_bias: dense
    std::optional<double> rate;        // rate: dropout, dropout_grad
    std::optional<uint64_t> seed;      // seed: dropout, dropout_grad
    std::optional<LossKind> loss;      // loss: loss, loss_grad
    std::optional<double> scale;       // scale: loss, loss_grad (1 / global batch)
    std::optional<MetricKind> metric;  // metric: metric
    std::optional<int64_t> k;          // k: metric (top-k)
    std::optional<bool> onLogits;      // on_logits: metric reads logits
    std::optional<double> l1, l2;      // l1, l2: reg_loss, reg_grad
    std::optional<BufKind> buf;        // buf: every node after MemoryPlanPass
    std::optional<int64_t> off;        // off: arena byte offset
    // Fused forms (graph/passes.h):
    std::optional<bool> biasGrad;      // bias_grad: act_grad also writes its bias_grad user
    std::optional<bool> byProducer;    // by_producer: bias_grad computed by its act_grad input
    std::optional<bool> dynamicScale;  // dynamic_scale: loss_grad x the loss scale (fp16)
    // Convolution, pooling and normalization (printed as "2x2", "0x1x0x1"):
    std::optional<std::vector<int64_t>> window;    // window: pooling [h,w]
    std::optional<std::vector<int64_t>> strides;   // strides: [h,w] (absent: 1x1)
    std::optional<std::vector<int64_t>> dilation;  // dilation: conv [h,w] (absent: 1x1)
    std::optional<std::vector<int64_t>> pads;      // pads: [top,bottom,left,right] (absent: 0)
    std::optional<int64_t> groups;                 // groups: conv (absent: 1)
    std::optional<double> offset;                  // offset: scale
    std::optional<double> epsilon;                 // epsilon: batch_norm, layer_norm, grads
    std::optional<double> momentum;                // momentum: moving_avg
    std::optional<bool> hasGamma, hasBeta;         // has_gamma, has_beta: batch/layer_norm
    std::optional<bool> batchStats;                // batch_stats: batch_norm_grad
    // Image preprocessing and augmentation:
    std::optional<std::vector<int64_t>> box;   // box: resize [top,left,height,width]
    std::optional<Interp> interp;              // interp: resize, random_rotation/zoom/transl.
    std::optional<FillMode> fill;              // fill: random_rotation/zoom/translation
    std::optional<double> fillValue;           // fill_value: the constant fill (absent: 0)
    std::optional<FlipMode> flip;              // flip: random_flip
    std::optional<double> factorLo, factorHi;  // factor_lo, factor_hi: a random factor's range
    std::optional<double> widthLo, widthHi;    // width_lo, width_hi: zoom, translation widths
    std::optional<double> valueLo, valueHi;    // value_lo, value_hi: contrast, brightness

    bool trainableOr() const { return trainable.value_or(true); }
    ActKind actOr() const { return act.value_or(ActKind::Linear); }
    double alphaOr() const { return alpha.value_or(0.0); }
    double scaleOr() const { return scale.value_or(1.0); }
    int64_t kOr() const { return k.value_or(1); }
    // Window geometry with its defaults.
    std::vector<int64_t> stridesOr() const { return strides.value_or(std::vector<int64_t>{1, 1}); }
    std::vector<int64_t> dilationOr() const {
        return dilation.value_or(std::vector<int64_t>{1, 1});
    }
    std::vector<int64_t> padsOr() const { return pads.value_or(std::vector<int64_t>{0, 0, 0, 0}); }
    int64_t groupsOr() const { return groups.value_or(1); }

    bool operator==(const NodeAttrs&) const = default;
};

struct Node {
    int id = -1;  // == index in Graph::nodes
    Op op = Op::Input;
    std::vector<int> inputs;
    NodeAttrs attrs;
    DType dtype = DType::F32;
    Shape shape;
    // The model layer it computes or differentiates ("dense_1"), for reports in the model's
    // names; "the loss" for the loss and metrics, empty for nodes of no layer. Not part of the
    // text form.
    std::string layer;

    size_t bytes() const { return static_cast<size_t>(numElements(shape)) * dtypeSize(dtype); }
};

struct Graph {
    std::string name = "g";
    std::vector<Node> nodes;                           // topological order
    std::vector<std::pair<std::string, int>> outputs;  // named results ("loss", "accuracy", ...)
    std::map<int, int> grads;                          // param node -> its gradient node
    // The passes turned off by name when the graph was planned (PassManager::run records its
    // own): lowering hands them on (LoweredProgram::passesOff) to the device, whose own passes
    // (cpuPassNames, passes.h) read them. Not part of the text form.
    std::set<std::string> passesOff;
    // The layer that nodes added now belong to (Node::layer): the builder sets it per layer,
    // autodiff per node it differentiates.
    std::string layerScope;

    int add(Op op, std::vector<int> inputs, DType dtype, Shape shape, NodeAttrs attrs = {});
    const Node& node(int id) const { return nodes.at(static_cast<size_t>(id)); }
    Node& node(int id) { return nodes.at(static_cast<size_t>(id)); }
    int output(const std::string& outputName) const;  // -1 when absent
    std::vector<int> params() const;                  // Param node ids in order
    // Users of each node (computed on demand).
    std::vector<std::vector<int>> users() const;
};

std::string printGraph(const Graph& g);
Result<Graph> parseGraph(const std::string& text);

// Structural checks after every pass: ids, topological order, operand counts, shape rules of each
// op. Errors name the node ("%7 = bias_add: bias shape [64] does not match [32,128]").
Status verifyGraph(const Graph& g);

// Numbers as the text form prints them (%.9g).
std::string fmtNum(double v);
// The number the text form holds for v (v rounded to fmtNum's 9 significant digits). Builders
// store attribute values through it, so a graph and its printed-and-parsed copy are equal.
double textNumber(double v);

}  // namespace td
