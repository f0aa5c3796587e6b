// Memory plan and thread ceiling (resource_plan.h).
#include "engine/data/resource_plan.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <thread>

#include "engine/data/pipeline.h"

namespace td {
namespace {

// Mirrors the pipeline's AUTOTUNE bounds (pipeline.cpp): a plan may over-estimate, never under.
constexpr int64_t kAutotunePrefetchBatches = 16;
constexpr int64_t kAutotuneWorkers = 8;
constexpr int64_t kThreadsPerCore = 4;
constexpr int64_t kMinParallelCallsCeiling = 16;

// "8G", "512 MiB", "1073741824" -> bytes; -1 when unreadable.
double parseByteCount(const std::string& text) {
    size_t i = 0;
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    size_t digits = i;
    while (digits < text.size() &&
           (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.'))
        ++digits;
    if (digits == i) return -1;
    char* end = nullptr;
    const std::string number = text.substr(i, digits - i);
    const double value = std::strtod(number.c_str(), &end);
    if (end != number.c_str() + number.size() || !(value > 0)) return -1;
    std::string unit;
    for (size_t k = digits; k < text.size(); ++k)
        if (!std::isspace(static_cast<unsigned char>(text[k])))
            unit += static_cast<char>(std::toupper(static_cast<unsigned char>(text[k])));
    double scale = 1;
    if (!unit.empty() && unit != "B") {
        const std::string prefix = unit.substr(0, 1);
        const std::string rest = unit.substr(1);
        if (rest != "" && rest != "B" && rest != "IB") return -1;
        if (prefix == "K")
            scale = 1024.0;
        else if (prefix == "M")
            scale = 1024.0 * 1024;
        else if (prefix == "G")
            scale = 1024.0 * 1024 * 1024;
        else if (prefix == "T")
            scale = 1024.0 * 1024 * 1024 * 1024;
        else
            return -1;
    }
    return value * scale;
}

std::string plural(double n, const char* one, const char* many) {
    char buf[48];
    if (n < 1e15)
        std::snprintf(buf, sizeof buf, "%.0f", n);
    else
        std::snprintf(buf, sizeof buf, "%.3g", n);
    return std::string(buf) + " " + (n == 1 ? one : many);
}

}  // namespace

Result<HostBudget> hostMemoryBudget() {
    if (const char* env = std::getenv(kMemoryBudgetEnv); env && *env) {
        const double bytes = parseByteCount(env);
        if (bytes < 1)
            return err(std::string(kMemoryBudgetEnv) +
                       ": expected a byte count such as 8G, 512M or 1073741824, got '" + env + "'");
        return HostBudget{bytes, std::string(kMemoryBudgetEnv) + "=" + env};
    }
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long pageSize = ::sysconf(_SC_PAGE_SIZE);
    HostBudget b;
    if (pages > 0 && pageSize > 0) {
        b.bytes = static_cast<double>(pages) * static_cast<double>(pageSize);
        b.origin = "physical memory";
    } else {
        // No answer from the system: plan as if for a small machine rather than for none.
        b.bytes = 4.0 * 1024 * 1024 * 1024;
        b.origin = "assumed (the system did not report its physical memory)";
    }
    std::ifstream cgroup("/sys/fs/cgroup/memory.max");
    std::string limit;
    if (cgroup >> limit && limit != "max") {
        const double bytes = parseByteCount(limit);
        if (bytes > 0 && bytes < b.bytes) {
            b.bytes = bytes;
            b.origin = "cgroup memory.max";
        }
    }
    return b;
}

int64_t hardwareThreads() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1u, std::thread::hardware_concurrency());
}

int64_t maxParallelCalls() {
    return std::max(kMinParallelCallsCeiling, kThreadsPerCore * hardwareThreads());
}

std::string formatBytes(double bytes) {
    static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    char buf[64];
    if (bytes < 1024) {
        std::snprintf(buf, sizeof buf, "%.0f bytes", bytes);
        return buf;
    }
    double v = bytes / 1024;
    size_t u = 0;
    while (v >= 1024 && u + 1 < std::size(kUnits)) {
        v /= 1024;
        ++u;
    }
    if (v >= 1024)
        std::snprintf(buf, sizeof buf, "%.3g %s", v, kUnits[u]);
    else
        std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
    return buf;
}

void MemoryPlan::add(std::string field, std::string what, double bytes) {
    if (bytes > 0) items_.push_back({std::move(field), std::move(what), bytes});
}

double MemoryPlan::totalBytes() const {
    double t = 0;
    for (const Item& i : items_) t += i.bytes;
    return t;
}

Status MemoryPlan::check(const HostBudget& budget) const {
    const double total = totalBytes();
    if (total <= budget.bytes) return Status::success();
    std::vector<Item> sorted = items_;
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const Item& a, const Item& b) { return a.bytes > b.bytes; });
    std::string msg = sorted.front().field + ": needs about " + formatBytes(total) +
                      " of host memory, over the budget of " + formatBytes(budget.bytes) + " (" +
                      budget.origin + "; set " + kMemoryBudgetEnv + " to change it): ";
    size_t listed = 0;
    for (const Item& i : sorted) {
        // Items below 1% of the total do not explain the refusal.
        if (listed > 0 && (i.bytes < total / 100 || listed == 4)) break;
        msg +=
            (listed ? "; " : "") + formatBytes(i.bytes) + " for " + i.field + " (" + i.what + ")";
        ++listed;
    }
    return err(msg);
}

Status MemoryPlan::check() const {
    TD_ASSIGN_OR_RETURN(HostBudget budget, hostMemoryBudget());
    return check(budget);
}

Status planPipeline(const PipelineConfig& cfg, const PipelineShape& shape, MemoryPlan& plan) {
    const auto field = [&](const std::string& key) { return shape.prefix + "." + key; };
    const int pipelines = shape.pipelines;
    const auto samples = double(shape.samples);
    if (cfg.parallelCalls != kAutotune && cfg.parallelCalls > maxParallelCalls())
        return err(field("parallel_calls") + ": " + std::to_string(cfg.parallelCalls) +
                   " map workers is more than this machine can run usefully (at most " +
                   std::to_string(maxParallelCalls()) + ": " + std::to_string(kThreadsPerCore) +
                   " per hardware thread, " + std::to_string(hardwareThreads()) +
                   " here); use \"autotune\" or a smaller number");

    const bool async = cfg.prefetch != 0;
    const double workers = !async ? 1
                           : cfg.parallelCalls == kAutotune
                               ? std::min<double>(kAutotuneWorkers, double(hardwareThreads()))
                               : double(cfg.parallelCalls);
    const double prefetched = !async                      ? 0
                              : cfg.prefetch == kAutotune ? kAutotunePrefetchBatches
                                                          : double(cfg.prefetch);
    const double slots = (prefetched + workers + 2) * pipelines;
    const auto batch = double(shape.batchSize);
    double labelBytes = double(shape.labelValues) * 4;
    int64_t depth = 0;
    size_t depthStep = 0;
    for (size_t i = 0; i < cfg.map.size(); ++i)
        if (cfg.map[i].op == "one_hot") {
            depth = cfg.map[i].depth;
            depthStep = i;
        }
    const std::string depthField = field("map[" + std::to_string(depthStep) + "].depth");
    if (depth > std::numeric_limits<int32_t>::max())
        return err(depthField + ": a one_hot depth of " + std::to_string(depth) +
                   " is beyond the largest class id (2147483647)");
    if (depth > 0) labelBytes = double(depth) * 4;
    const double featureBytes = double(shape.sampleValues) * 4;
    const double slotBytes = batch * (featureBytes + labelBytes);
    const std::string slotsText = plural(slots, "batch slot", "batch slots") + " of " +
                                  formatBytes(slotBytes) + " (" + std::to_string(pipelines) +
                                  " pipeline" + (pipelines == 1 ? "" : "s") + " of " +
                                  plural(prefetched, "prefetched batch", "prefetched batches") +
                                  " + " + plural(workers, "worker", "workers") + " + 2)";
    // Name the field that makes the slots large: the prefetch depth or worker count when those
    // are the big factor, the one_hot depth when labels dominate a slot, else the batch size.
    std::string slotField = field("prefetch");
    if (workers > prefetched && workers > 16)
        slotField = field("parallel_calls");
    else if (prefetched <= kAutotunePrefetchBatches)
        slotField = depth > 0 && labelBytes > featureBytes ? depthField : shape.batchField;
    plan.add(slotField, slotsText, slots * slotBytes);

    // The epoch order (one 64-bit index per sample) and the shuffle window.
    const double window = cfg.shuffleBuffer > 0 ? std::min(double(cfg.shuffleBuffer), samples) : 0;
    plan.add(field("shuffle_buffer"),
             "epoch order and shuffle window of " + plural(samples, "sample", "samples"),
             (samples + window) * 8 * pipelines);
    return Status::success();
}

void planSource(const SourceConfig& cfg, const std::string& prefix, MemoryPlan& plan) {
    if (cfg.type != "synthetic") return;
    double values = 1;
    for (int64_t d : cfg.sampleShape) values *= double(d);
    const double rows = double(cfg.samples) + double(cfg.testSamples);
    const auto field = [&](const char* key) { return prefix.empty() ? key : prefix + "." + key; };
    const std::string rowsField = field(cfg.testSamples > cfg.samples ? "test_samples" : "samples");
    plan.add(rowsField,
             plural(rows, "synthetic sample", "synthetic samples") + " of " +
                 plural(values, "f32 value", "f32 values") + " and a label",
             rows * (values * 4 + 4));
    plan.add(field("classes"),
             plural(double(cfg.classes), "class centroid", "class centroids") + " of " +
                 plural(values, "value", "values"),
             double(cfg.classes) * values * 4);
}

Status checkPipelineResources(const Dataset& data, const PipelineConfig& cfg, int64_t batchSize) {
    const int64_t n = data.size();
    if (n <= 0 || batchSize <= 0) return Status::success();  // create() names these itself
    MemoryPlan plan;
    PipelineShape shape;
    shape.batchSize = batchSize;
    shape.samples = n;
    shape.sampleValues = data.sampleValues();
    shape.labelValues = data.y.size() / n;
    TD_RETURN_IF_ERROR(planPipeline(cfg, shape, plan));
    return plan.check();
}

Status checkFileFits(const std::string& file, const std::string& what, double bytes) {
    MemoryPlan plan;
    plan.add(file, what, bytes);
    return plan.check();
}

}  // namespace td
