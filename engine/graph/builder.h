// Builds the forward graph of a Sequential model (with loss and metrics), and its training graph
// by reverse-mode autodiff.
#pragma once

#include <string>
#include <vector>

#include "engine/core/train_config.h"
#include "engine/graph/ir.h"
#include "engine/model/layers.h"

namespace td {

enum class GraphMode { Train, Eval, Predict };

struct BuildOptions {
    int64_t batch = 32;  // rows of this program's batch (this replica's slice)
    // Replica-aware losses (tf.distribute): the loss is the sum over this replica's rows divided
    // by the global batch (0 = batch), each regularization term is divided by the replicas, so the
    // sum over replicas of loss and gradients equals one device running the global batch.
    int64_t globalBatch = 0;
    int replicas = 1;
    GraphMode mode = GraphMode::Train;
    LossConfig loss;
    std::vector<std::string> metrics;  // as in TrainConfig
    uint64_t seed = 0;                 // keys dropout masks of layers without their own seed
    // Mixed precision (Keras' mixed_bfloat16 / mixed_float16): matrix products and the
    // elementwise ops between them compute in this dtype (bf16 or f16); parameters stay f32 and
    // are cast where a product reads them; softmax, loss, metrics and the model's output are f32.
    // F32: no casts.
    DType compute = DType::F32;
    // Convolutions compute in `compute` too, as Keras' mixed policies compute them: their image
    // and kernel are cast; their result stays f32 (the products accumulate in f32, and the
    // normalization and pooling after them compute in f32), their gradients read dy cast to
    // `compute`. Set where the device has 16-bit convolutions (Device::halfConvolutions);
    // otherwise they compute in f32 with the other image ops.
    bool halfConv = false;
    // A trailing softmax (sigmoid) that meets the matching cross-entropy is computed as one stable
    // softmax-cross-entropy from the logits (the fusion `fuse_softmax_xent`); off: the loss reads
    // the probabilities (clipped to [1e-7, 1 - 1e-7] as Keras does).
    bool fuseSoftmaxXent = true;
    // Train/Eval: also output "predictions". The trainer's training and evaluation programs never
    // read them, so they build without: the passes then drop what only the predictions needed (a
    // trailing softmax whose loss reads the logits, the output's cast). Predict always has them.
    bool predictions = true;
};

// How a metric name resolves for a loss (Keras' "accuracy" depends on the loss).
struct MetricSpec {
    std::string key;  // name in logs: "accuracy", "sparse_top_k_categorical_accuracy", ...
    MetricKind kind = MetricKind::SparseCategorical;
    int64_t k = 1;
};
Result<std::vector<MetricSpec>> resolveMetrics(const std::vector<std::string>& names,
                                               const LossConfig& loss);

// Label dtype/shape (without batch) the loss expects for this model output shape.
struct LabelSpec {
    DType dtype = DType::I32;
    Shape shape;  // {} for class ids
};
Result<LabelSpec> labelSpecFor(const LossConfig& loss, const Shape& modelOutput);

// Forward graph. Outputs: "loss" and one per metric (Train/Eval), "predictions" (Predict, and
// Train/Eval with BuildOptions::predictions).
// Parameter nodes are named "<layer>/kernel" and "<layer>/bias".
Result<Graph> buildGraph(const ModelSpec& model, const ModelInfo& info, const BuildOptions& opt);

// Mixed precision's cast insertion on a forward graph: every matrix product (and, with
// `halfConv`, every convolution) reads its operands in `compute` (casts inserted once per value),
// the elementwise ops after it keep that dtype, and the other image ops, softmax, loss, metrics
// and the predictions read f32. Called by buildGraph; exposed for tests.
Graph insertCasts(const Graph& forward, DType compute, bool halfConv = false);

// Appends the backward nodes for output "loss" and binds a gradient to every trainable param.
// Supports losses that are sums (add) of loss and reg_loss terms.
// dynamicLossScale (mixed_float16): the loss gradients carry dynamic_scale=1 (multiplied by the
// loss scale, which the update divides out again).
Status autodiff(Graph& g, bool dynamicLossScale = false);

}  // namespace td
