// Graph passes and the one pass manager that runs them. Every pass answers "error, or did I
// change anything"; the manager can disable a pass by name, times each pass, verifies the graph
// after it and can hand the graph to a dump hook.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/graph/ir.h"

namespace td {

class Pass {
  public:
    virtual ~Pass() = default;
    virtual const char* name() const = 0;
    virtual Result<bool> run(Graph& g) = 0;
};

struct PassTiming {
    std::string pass;
    double seconds = 0;
    bool changed = false;
    bool skipped = false;
};

class PassManager {
  public:
    void add(std::unique_ptr<Pass> pass);
    void disable(const std::string& name);
    bool isDisabled(const std::string& name) const { return disabled_.count(name) != 0; }
    // Called after every pass that ran (and once with "build" before the first).
    void setDumpHook(std::function<void(const std::string& pass, const Graph&)> hook);
    // Runs the passes not disabled; records the disabled names on the graph (Graph::passesOff),
    // for the stages after it (the device's own passes).
    Status run(Graph& g);
    const std::vector<PassTiming>& timings() const { return timings_; }
    std::vector<std::string> passNames() const;
    Pass* find(const std::string& name);

  private:
    std::vector<std::unique_ptr<Pass>> passes_;
    std::set<std::string> disabled_;
    std::function<void(const std::string&, const Graph&)> hook_;
    std::vector<PassTiming> timings_;
};

// A decision of the fusion pass, kept for the UI and `traindeck compile`.
struct FusionDecision {
    std::vector<int> nodes;  // node ids before the pass
    bool fused = false;
    std::string what;    // "matmul %4 + bias_add %6 + act(relu) %7 -> dense"
    std::string reason;  // why not, when fused is false
    std::string layers;  // the model layers of its nodes, in order ("dense", "dense, dropout")
};

// A pass that fuses or folds, and says what it did and what it refused, and why.
class FusingPass : public Pass {
  public:
    const std::vector<FusionDecision>& decisions() const { return decisions_; }

  protected:
    // Keeps `d`, naming the layers of its nodes as they are in `g` now.
    void record(const Graph& g, FusionDecision d);
    std::vector<FusionDecision> decisions_;
};

// matmul -> bias_add -> elementwise act chains become one `dense` node (oneDNN matmul with bias
// and eltwise post-op). Each link fuses only when the intermediate value has no other user.
class FusionPass : public FusingPass {
  public:
    const char* name() const override { return "fusion"; }
    Result<bool> run(Graph& g) override;
};

// Mixed precision's casts folded into the ops around them:
// - a cast of a parameter becomes its 16-bit shadow (buf=shadow), which the optimizer update
//   writes as it writes the parameter (training programs with an update only);
// - a cast whose operand has no other user is folded into that operand's producer, which then
//   writes the cast's dtype (a matrix product only widens: bf16 operands, f32 result);
// - a cast read only by the backend's own elementwise kernels (which load any float dtype) is
//   dropped, its readers reading the operand itself.
// Anything else stays, with its reason (a matrix product reads one dtype; the batch arrives f32).
class FoldCastsPass : public FusingPass {
  public:
    explicit FoldCastsPass(bool paramShadows) : shadows_(paramShadows) {}
    const char* name() const override { return "fold_casts"; }
    Result<bool> run(Graph& g) override;

  private:
    bool shadows_;
};

// The bias gradient computed in the activation gradient's pass over memory: act_grad gets
// bias_grad=1 and also writes the column sums of its result into its bias_grad user (marked
// by_producer=1, moved right after it).
class FuseActBiasGradPass : public FusingPass {
  public:
    const char* name() const override { return "fuse_act_bias_grad"; }
    Result<bool> run(Graph& g) override;
};

// Chains of elementwise ops in one pass: dropout_grad -> act_grad (the mask applied to dy as it is
// read: act_grad with rate and seed), and act -> dropout (act with rate and seed) where the
// activation's output has no other reader.
class FuseElementwisePass : public FusingPass {
  public:
    const char* name() const override { return "fuse_elementwise"; }
    Result<bool> run(Graph& g) override;
};

// What the compiler is asked for: the compute dtype of mixed precision and the passes turned
// off by name (compilerPassNames(), cpuPassNames()).
struct CompileOptions {
    DType compute = DType::F32;
    std::set<std::string> disabled;
    bool paramShadows = false;  // training programs with an optimizer update

    bool enabled(const std::string& pass) const { return disabled.count(pass) == 0; }
};

// Every graph compiler pass a project can turn off by name, in the order they run: the graph
// passes and the two fusions made at build (fuse_softmax_xent) and lowering (fuse_update) time.
const std::vector<std::string>& compilerPassNames();
// The CPU device's own passes, in the order they act (engine/backend/cpu/cpu_passes.h, which
// describes them; this layer cannot include it, so the names are kept here as well and the
// backend checks that both lists agree). A project turns them off by name as the others; they
// reach the device through Graph::passesOff.
const std::vector<std::string>& cpuPassNames();
// The CUDA device's own choices a project turns off by name as the others (they reach the device
// through Graph::passesOff, and the trainer for cuda_half_conv): cuda_half_conv (mixed_bfloat16's
// convolutions in bf16), cuda_fused_conv (cuDNN's fused convolution-bias-ReLU), cuda_side_update
// (the optimizer update on a second stream beside the backward pass).
const std::vector<std::string>& cudaPassNames();
// The fusing passes among them (what the `fusion` switch turns off).
const std::vector<std::string>& fusionPassNames();
// Checks a list of pass names (compilerPassNames, cpuPassNames and cudaPassNames); the error names
// the unknown one and lists the known ones.
Status checkPassNames(const std::vector<std::string>& names);

// Removes nodes that no output and no gradient depends on; renumbers.
class DeadCodePass : public Pass {
  public:
    const char* name() const override { return "dce"; }
    Result<bool> run(Graph& g) override;
};

// Assigns every value a buffer: params and gradients persistent; reshapes alias their input;
// everything else gets an offset in one arena reused by values whose lifetimes do not overlap.
// Sets attrs.buf (param, grad, input, label, arena, alias) on every node and attrs.off (bytes
// into the arena) on arena values.
class MemoryPlanPass : public Pass {
  public:
    const char* name() const override { return "memory"; }
    Result<bool> run(Graph& g) override;
    size_t arenaBytes() const { return arenaBytes_; }
    size_t naiveBytes() const { return naiveBytes_; }  // without reuse, for reporting

  private:
    size_t arenaBytes_ = 0;
    size_t naiveBytes_ = 0;
};

// Adds the passes in the standard order: fusion, fold_casts, fuse_act_bias_grad,
// fuse_elementwise, dce, memory; those `options` turns off are disabled.
void addStandardPasses(PassManager& pm, const CompileOptions& options = {});

// Moves nodes into `order` (a permutation of ids that keeps operands before users); renumbers.
void reorderGraph(Graph& g, const std::vector<int>& order);

// Removes Op nodes by renumbering; keep[i] says whether node i survives. Inputs of surviving
// nodes must survive. Returns the old->new id map (-1 for removed).
std::vector<int> compactGraph(Graph& g, const std::vector<bool>& keep);

}  // namespace td
