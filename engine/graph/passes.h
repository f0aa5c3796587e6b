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
};

// matmul -> bias_add -> elementwise act chains become one `dense` node (oneDNN matmul with bias
// and eltwise post-op). Each link fuses only when the intermediate value has no other user.
class FusionPass : public Pass {
  public:
    const char* name() const override { return "fusion"; }
    Result<bool> run(Graph& g) override;
    const std::vector<FusionDecision>& decisions() const { return decisions_; }

  private:
    std::vector<FusionDecision> decisions_;
};

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

// Runs a sequence of passes into `pm` in the standard order: fusion, dce, memory.
void addStandardPasses(PassManager& pm);

// Removes Op nodes by renumbering; keep[i] says whether node i survives. Inputs of surviving
// nodes must survive. Returns the old->new id map (-1 for removed).
std::vector<int> compactGraph(Graph& g, const std::vector<bool>& keep);

}  // namespace td
