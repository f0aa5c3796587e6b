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
#include <string>
#include <vector>

#include "engine/core/result.h"
#include "engine/core/tensor.h"

namespace td {

enum class Op : uint8_t {
    Input,    // the batch features, [B, ...]
    Label,    // the batch labels, i32 [B] or f32 [B, k]
    Param,    // a trainable (or frozen) variable; attr name
    Reshape,  // a view with a new shape
    MatMul,   // [M,K] x [K,N] (with trans_a / trans_b on the stored operands)
    BiasAdd,  // x [B,N] + b [N]
    Act,      // elementwise (or row-wise softmax) activation; attrs act, alpha
    Dense,    // fused matmul + bias + act; inputs x, w, (b); attrs act, alpha, has_bias
    Dropout,  // inverted dropout keyed by (seed, step, sample index); attrs rate, seed
    Loss,     // scalar: sum over rows of the per-sample loss / batch; attrs loss, from_logits
    Metric,   // scalar: number of correct rows; attrs metric, k
    RegLoss,  // scalar: l1*sum|w| + l2*sum w^2; attrs l1, l2
    // Backward ops
    LossGrad,     // d loss / d pred for inputs (pred, label)
    ActGrad,      // inputs (dy, x_or_y); attrs act, alpha, uses_output
    DropoutGrad,  // inputs (dy); same mask as the forward Dropout
    BiasGrad,     // column sums of dy [B,N] -> [N]
    RegGrad,      // inputs (g, w): g + d RegLoss/dw
    Add,          // a + b
};

const char* opName(Op op);
Result<Op> parseOp(const std::string& s);

struct Node {
    int id = -1;  // == index in Graph::nodes
    Op op = Op::Input;
    std::vector<int> inputs;
    std::map<std::string, std::string> attrs;  // printed sorted, values are plain tokens/strings
    DType dtype = DType::F32;
    Shape shape;

    bool has(const std::string& k) const { return attrs.count(k) != 0; }
    std::string attr(const std::string& k, const std::string& def = "") const;
    double attrF(const std::string& k, double def = 0.0) const;
    int64_t attrI(const std::string& k, int64_t def = 0) const;
};

struct Graph {
    std::string name = "g";
    std::vector<Node> nodes;                           // topological order
    std::vector<std::pair<std::string, int>> outputs;  // named results ("loss", "accuracy", ...)
    std::map<int, int> grads;                          // param node -> its gradient node

    int add(Op op, std::vector<int> inputs, DType dtype, Shape shape,
            std::map<std::string, std::string> attrs = {});
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

// Attribute formatting helpers.
std::string fmtNum(double v);

}  // namespace td
