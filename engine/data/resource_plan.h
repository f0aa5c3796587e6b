// The host resources a run may take, decided before anything is allocated: a memory plan (item by
// item, each named by the project field that sizes it) checked against a budget, and a ceiling on
// the worker threads a pipeline may start. A size a user can set never reaches an allocation (and
// its assertion) unchecked: an absurd value is an error naming the field and the estimate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/data_config.h"
#include "engine/core/result.h"
#include "engine/core/tensor.h"

namespace td {

struct Dataset;

// Overrides the budget: a byte count, optionally with a binary suffix (K, M, G, T; "KiB", "GB" and
// the like read the same), e.g. "512M" or "8G".
constexpr const char* kMemoryBudgetEnv = "TRAINDECK_MEMORY_BUDGET";

struct HostBudget {
    double bytes = 0;
    std::string origin;  // "physical memory", "cgroup memory.max", "TRAINDECK_MEMORY_BUDGET=8G"
};

// Physical memory (sysconf), or the cgroup v2 limit when that is lower, unless kMemoryBudgetEnv
// sets it. An unreadable override is an error naming the variable.
Result<HostBudget> hostMemoryBudget();

// Threads this process may run on (its CPU affinity mask).
int64_t hardwareThreads();
// The most pipeline workers a project may ask for: 4 per hardware thread, at least 16. More
// threads than that only contend for the same cores (and each one costs a stack and a batch slot).
int64_t maxParallelCalls();

// "1.5 GiB", "640 KiB", "12 bytes".
std::string formatBytes(double bytes);

// What a run will allocate, item by item. Sizes are doubles so that products of absurd values
// (a prefetch of 1e12 batches of 1e6 values) stay ordered instead of wrapping around.
class MemoryPlan {
  public:
    // `field` is the project field that sizes the item ("data.pipeline.prefetch"); `what` says
    // what is allocated ("1000000000002 batch slots of 2.1 KiB").
    void add(std::string field, std::string what, double bytes);
    double totalBytes() const;
    // An error when the total exceeds the budget. It starts with the largest item's field and
    // lists the items that matter, largest first, with the total and the budget.
    Status check(const HostBudget& budget) const;
    // Against hostMemoryBudget().
    Status check() const;

  private:
    struct Item {
        std::string field, what;
        double bytes = 0;
    };
    std::vector<Item> items_;
};

// The input pipeline's own allocations: batch slots for the prefetch buffer and the workers, the
// epoch order and shuffle window, for `pipelines` pipelines alive at once (training plus the
// evaluation that runs between epochs). Errors: a parallel_calls above maxParallelCalls(), a
// one_hot depth beyond 32-bit class ids.
struct PipelineShape {
    int64_t batchSize = 0;
    int64_t samples = 0;
    int64_t sampleValues = 0;  // feature values of one sample (f32 in a batch)
    int64_t labelValues = 1;   // values of one label before one_hot
    int pipelines = 1;
    std::string prefix = "pipeline";        // field paths: "data.pipeline.prefetch"
    std::string batchField = "batch_size";  // "training.batch_size"
};
Status planPipeline(const PipelineConfig& cfg, const PipelineShape& shape, MemoryPlan& plan);

// What loadSource will allocate before reading anything, where the config alone tells (the
// synthetic source; file sources are checked by their readers against the sizes their headers
// declare). Field paths start with `prefix` ("data.source"; "" for bare keys).
void planSource(const SourceConfig& cfg, const std::string& prefix, MemoryPlan& plan);

// Pipeline::create's check of its own pool for `data`, for callers that did not plan a project
// (field paths start with "pipeline").
Status checkPipelineResources(const Dataset& data, const PipelineConfig& cfg, int64_t batchSize);

// A reader's check before it allocates what a file declares (an array shape in its header, its own
// size): an error naming the file and `what` when `bytes` exceeds the budget.
Status checkFileFits(const std::string& file, const std::string& what, double bytes);

}  // namespace td
