// Builds the forward graph of a Sequential model (with loss and metrics), and its training graph
// by reverse-mode autodiff.
#pragma once

#include <string>
#include <vector>

#include "engine/graph/ir.h"
#include "engine/model/layers.h"
#include "engine/train/train_config.h"

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

// Forward graph. Outputs: "loss" and one per metric (Train/Eval), "predictions" (always).
// Parameter nodes are named "<layer>/kernel" and "<layer>/bias".
Result<Graph> buildGraph(const ModelSpec& model, const ModelInfo& info, const BuildOptions& opt);

// Appends the backward nodes for output "loss" and binds a gradient to every trainable param.
// Supports losses that are sums (add) of loss and reg_loss terms.
Status autodiff(Graph& g);

}  // namespace td
