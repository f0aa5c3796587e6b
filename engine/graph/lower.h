// Lowering: a planned Graph (MemoryPlanPass ran) becomes a LoweredProgram, the one form every
// backend compiles. It is a flat list of instructions in execution order whose operands say which
// buffer they live in (param i, grad i, input, label, arena offset, accumulator slot, optimizer
// slot, the flat gradient buffer), with shape and dtype, and whose parameters are typed. Besides
// the graph's ops it holds what the step does around them: the accumulation of loss and metrics,
// the all-reduce of gradient buckets, and the optimizer update.
//
//   program train (arena 1536 bytes)
//     0: dense %5 arena+0 f32[4,3] <- input f32[4,6], param0 f32[6,3], param1 f32[3] {act=relu}
//     ...
//     9: all_reduce_start bucket 0 <- flat+0 f32[18]
//    12: accumulate acc[0] <- arena+64 f32[1] {factor=4}
//    13: all_reduce_wait bucket 0
//    14: update sgd (2 tensors)
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/core/result.h"
#include "engine/graph/conv_geometry.h"
#include "engine/graph/image_augment.h"
#include "engine/graph/ir.h"
#include "engine/graph/update_spec.h"

namespace td {

// A contiguous range of the flat gradient buffer that is all-reduced as one piece, started as
// soon as the backward pass has written the last gradient in it.
struct GradBucket {
    int64_t offset = 0;  // in f32 elements from the start of the flat gradient buffer
    int64_t count = 0;   // f32 elements

    bool operator==(const GradBucket&) const = default;
};

// Where the gradients of a training graph live in one flat f32 buffer, and its buckets.
struct GradientPlan {
    // Per Graph::params() entry: the offset (f32 elements, a multiple of 16) of its gradient in
    // the flat buffer; -1 for a frozen parameter.
    std::vector<int64_t> offsets;
    // In the order the backward pass completes them (the last layer's gradients first); each is
    // contiguous and holds whole parameters. The flat buffer is laid out in this order.
    std::vector<GradBucket> buckets;
    int64_t elements = 0;  // length of the flat buffer in f32 elements

    size_t bytes() const { return static_cast<size_t>(elements) * sizeof(float); }
};

// Lays out the gradient of every trainable parameter in readiness order (when the backward pass
// last touches it) and groups them into buckets: a bucket closes once it holds at least
// `bucketBytes` (0: one bucket per parameter).
GradientPlan planGradients(const Graph& planned, size_t bucketBytes);

// Which buffer an operand lives in.
enum class Space : uint8_t {
    None,
    Input,        // the batch features
    Label,        // the batch labels
    Param,        // ProgramBindings::params[index]
    Grad,         // ProgramBindings::grads[index]
    Arena,        // the program's arena, at offset
    Accumulator,  // ProgramBindings::accumulators: f64 slot `index`, at offset 8 * index
    FlatGrad,     // ProgramBindings::flatGrads, at offset
    Slot,         // ProgramBindings::optimizerSlots[index]
    Shadow,       // ProgramBindings::shadows[index]: the 16-bit copy of param `index`
    LossScale,    // ProgramBindings::lossScale: the LossScaleState (graph/update_spec.h)
};
const char* spaceName(Space s);

struct Operand {
    Space space = Space::None;
    int index = 0;       // Param, Grad, Slot: which buffer; Accumulator: which slot
    int64_t offset = 0;  // bytes from the start of that buffer
    DType dtype = DType::F32;
    Shape shape;

    int64_t elements() const { return numElements(shape); }
    size_t bytes() const { return static_cast<size_t>(elements()) * dtypeSize(dtype); }
};

enum class InstrOp : uint8_t {
    // The graph's ops (see Op): in = operands in graph order, out = the value.
    MatMul,  // in a, b; transA, transB
    Dense,   // in x, w[, bias]; transA, transB, act, alpha (matmul + bias + eltwise post-op)
    BiasAdd,
    Act,      // act, alpha
    ActGrad,  // in dy, saved (y when usesOutput, else x); act, alpha, usesOutput
    Dropout,  // rate, seed; keyed by StepArgs::step and sampleBase
    DropoutGrad,
    Loss,      // in pred, label; loss, scale
    LossGrad,  // in pred, label; loss, scale
    Metric,    // in pred, label; metric, k, onLogits
    RegLoss,   // in w; l1, l2
    RegGrad,   // in g, w; l1, l2
    BiasGrad,
    Add,
    Cast,  // in x; out in the node's dtype (refreshOnly: a parameter's shadow, see Instr)
    // Images [B,H,W,C] (see Op for operands); sizes, strides and pads in Instr::geometry.
    Conv2D,            // in x, w[, bias]; act, alpha (bias and eltwise post-ops)
    Conv2DGradInput,   // in dy, w
    Conv2DGradFilter,  // in x, dy
    MaxPool,
    MaxPoolGrad,  // in dy, x
    AvgPool,
    AvgPoolGrad,  // in dy
    Pad2D,
    Pad2DGrad,
    Scale,               // scale, offset
    ChannelMean,         // in x
    ChannelVar,          // in x, mean
    BatchNorm,           // in x, mean, var[, gamma][, beta]; epsilon, hasGamma, hasBeta
    BatchNormGrad,       // in dy, x, mean, var[, gamma]; epsilon, hasGamma, batchStats
    NormGammaGrad,       // in dy, x, mean, var; epsilon
    MovingAvg,           // in param, stat; out = the param; momentum
    LayerNorm,           // in x[, gamma][, beta]; epsilon, hasGamma, hasBeta
    LayerNormGrad,       // in dy, x[, gamma]; epsilon, hasGamma
    LayerNormGammaGrad,  // in dy, x; epsilon
    // Image preprocessing and augmentation (in x; Instr::augment). The random ones key each
    // sample's draws by (augment.seed, StepArgs::step, StepArgs::sampleBase + row).
    Resize,
    RandomCrop,
    RandomFlip,
    RandomRotation,
    RandomZoom,
    RandomTranslation,
    RandomContrast,
    RandomBrightness,
    // The step around the graph.
    Accumulate,      // out (Accumulator) += double(in[0] scalar) * factor
    AllReduceStart,  // collectives->allReduceStart(bucket, out (FlatGrad) data, elements)
    AllReduceWait,   // collectives->allReduceWait(bucket)
    Update,  // the optimizer update over LoweredProgram::update (tensor -1: every tensor in one
             // pass; else that one), StepArgs::update scalars
};
const char* instrOpName(InstrOp op);

struct Instr {
    InstrOp op = InstrOp::Add;
    int node = -1;  // the graph value it computes (-1 for the step's own instructions)
    std::vector<Operand> in;
    Operand out;
    // Typed parameters (which ones an op reads: see InstrOp).
    bool transA = false, transB = false;
    ActKind act = ActKind::Linear;
    float alpha = 0;
    bool usesOutput = false;
    float rate = 0;
    uint64_t seed = 0;
    LossKind loss = LossKind::Mse;
    float scale = 1;
    MetricKind metric = MetricKind::SparseCategorical;
    int64_t k = 1;
    bool onLogits = false;
    float l1 = 0, l2 = 0;
    double factor = 1;  // Accumulate
    int bucket = -1;    // AllReduceStart / AllReduceWait
    int tensor = -1;    // Update: which of LoweredProgram::updateTensors (-1: all)
    // Cast into a parameter's shadow that the update keeps current: runs only when
    // StepArgs::refreshShadows says the parameters were written outside the program.
    bool refreshOnly = false;
    // ActGrad with bias_grad: the column sums of its result also go here (the bias gradient).
    Operand out2;
    // Act / ActGrad with a dropout mask fused in (rate > 0): Act masks its result, ActGrad its dy.
    // LossGrad: multiply by the loss scale (Space::LossScale) as well.
    bool dynamicScale = false;
    // Conv2D: the fused bias (in[2]); BatchNorm / LayerNorm: gamma and beta operands present.
    bool hasBias = false, hasGamma = false, hasBeta = false;
    bool batchStats = false;  // BatchNormGrad
    ConvGeometry geometry;    // convolution, pooling, padding (graph/conv_geometry.h)
    AugmentSpec augment;      // the image preprocessing ops (graph/image_augment.h)
    float epsilon = 0, momentum = 0, offset = 0;
};

// One trainable parameter of the update instruction.
struct UpdateOperands {
    int param = -1;  // index into ProgramBindings::params
    Operand value, grad;
    std::vector<Operand> slot;  // UpdateSpec::slotsPerParam() of them (Space::Slot)
    Operand shadow;             // Space::Shadow when the parameter has a 16-bit shadow, else None
};

struct LoweredProgram {
    std::string name;
    std::vector<Instr> code;      // in execution order
    std::vector<Operand> values;  // per graph node: where its value lives (Executable::valuePtr)
    size_t arenaBytes = 0;
    int params = 0;             // ProgramBindings::params entries the program reads
    std::vector<bool> hasGrad;  // per param: the program writes ProgramBindings::grads[i]
    // Names of the accumulator slots: "loss", then the metric outputs in Graph::outputs order.
    // Empty when the program does not accumulate.
    std::vector<std::string> accumulators;
    std::vector<GradBucket> buckets;            // all-reduced when non-empty
    std::optional<UpdateSpec> update;           // the update instruction's spec
    std::vector<UpdateOperands> updateTensors;  // the trainable parameters, in params() order
    int slotBuffers = 0;      // ProgramBindings::optimizerSlots entries the update reads
    bool lossScaled = false;  // reads and updates ProgramBindings::lossScale
    // Why the update stays one multi-tensor pass although fuse_update was turned off (empty: it
    // did not).
    std::string updateNote;
    // The pass names turned off (Graph::passesOff): the device skips its own passes named here.
    std::set<std::string> passesOff;
};

struct LowerOptions {
    // Add the Accumulate instructions: [0] += loss x global batch (the loss op's 1 / scale),
    // [1 + m] += metric m.
    bool accumulate = false;
    // Gradient all-reduce: the buckets and, per Graph::params() entry, the offset of its gradient
    // in the flat buffer in f32 elements (-1: none). Empty buckets: no all-reduce.
    std::vector<GradBucket> buckets;
    std::vector<int64_t> gradOffsets;
    // The optimizer update that ends the step (null: none).
    const UpdateSpec* update = nullptr;
    // fuse_update: every parameter in one multi-tensor pass (else one update per parameter,
    // except where global clipping or loss scaling needs every gradient at once).
    bool fuseUpdate = true;
    // mixed_float16: the loss gradient is scaled and the update unscales, skips and adjusts.
    bool lossScale = false;
};

// Errors name the node ("%7 = act: no buffer assigned (run the memory pass)").
Result<LoweredProgram> lower(const Graph& planned, const LowerOptions& options = {});

// The instruction list as text (tests, debugging), one instruction a line.
std::string printProgram(const LoweredProgram& p);

}  // namespace td
