// Test harness: compiles a graph stated as IR text on a device, with params and labels set from
// the test, and runs it.
#pragma once

#include <QtTest>
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/host_threads.h"
#include "engine/graph/builder.h"
#include "engine/graph/passes.h"

namespace tdtest {

// What the program is bound to besides params, grads, input and label.
struct HarnessOptions {
    bool flatGrads = false;  // gradients as views into one flat buffer laid out by planGradients
    size_t bucketBytes = 0;  // buckets of that plan (all-reduced when `collectives` is set)
    td::Collectives* collectives = nullptr;
    const td::UpdateSpec* update = nullptr;  // the optimizer update, with zeroed slots
    int accumulators = 0;                    // f64 accumulator slots (0: none)
    // The standard passes with these options (instead of the names given to compile()).
    const td::CompileOptions* passes = nullptr;
    bool lossScale = false;  // bind a LossScaleState (mixed_float16)
    bool fuseUpdate = true;
    // The thread count the calling thread compiles and runs the program with (prepareThread);
    // fewer than the device has splits the large products and the update across its WorkShare.
    // 0: the thread's current OpenMP team size, unchanged.
    int programThreads = 0;
    // The CPU device's thread count (0: the machine's, as OMP_NUM_THREADS says).
    int deviceThreads = 0;
};

struct Harness {
    td::Graph g;
    std::unique_ptr<td::Device> dev;
    std::vector<td::Buffer> params, grads;
    td::Buffer input, label;
    td::Buffer flat, acc;
    std::vector<td::Buffer> optimizerSlots;
    std::vector<td::Buffer> shadows;
    td::Buffer lossScale;
    td::GradientPlan plan;
    std::unique_ptr<td::Executable> exe;

    ~Harness() {
        if (!dev) return;
        for (auto& b : params) dev->release(b);
        if (flat.ptr)
            dev->release(flat);  // the grads are views into it
        else
            for (auto& b : grads)
                if (b.ptr) dev->release(b);
        for (auto& b : optimizerSlots) dev->release(b);
        for (auto& b : shadows)
            if (b.ptr) dev->release(b);
        if (lossScale.ptr) dev->release(lossScale);
        for (td::Buffer* b : {&input, &label, &acc})
            if (b->ptr) dev->release(*b);
    }

    // Plans and compiles `graph` (runs the memory pass; other passes as given).
    bool compile(td::Graph graph, std::vector<std::string> passes = {},
                 std::string* error = nullptr, const HarnessOptions& opt = {}) {
        g = std::move(graph);
        td::PassManager pm;
        if (opt.passes) {
            td::addStandardPasses(pm, *opt.passes);
        } else {
            for (const auto& p : passes) {
                if (p == "fusion") pm.add(std::make_unique<td::FusionPass>());
                if (p == "dce") pm.add(std::make_unique<td::DeadCodePass>());
            }
            pm.add(std::make_unique<td::MemoryPlanPass>());
        }
        td::Status s = pm.run(g);
        if (!s.ok()) {
            if (error) *error = s.error();
            return false;
        }
        dev = td::makeCpuDevice(opt.deviceThreads);
        if (opt.programThreads > 0) td::prepareThreadFor(*dev, opt.programThreads);
        td::ProgramBindings bind;
        const std::vector<int> pids = g.params();
        if (opt.flatGrads) {
            plan = td::planGradients(g, opt.bucketBytes);
            flat = *dev->allocate(std::max<size_t>(plan.bytes(), 64));
            bind.flatGrads = flat;
            bind.buckets = plan.buckets;
            bind.collectives = opt.collectives;
        }
        for (size_t i = 0; i < pids.size(); ++i) {
            const td::Node& p = g.node(pids[i]);
            params.push_back(*dev->allocate(p.bytes()));
            if (opt.flatGrads && plan.offsets[i] >= 0)
                grads.push_back(
                    td::Buffer{static_cast<float*>(flat.ptr) + plan.offsets[i], p.bytes()});
            else if (!opt.flatGrads && (g.grads.count(pids[i]) || opt.update))
                grads.push_back(*dev->allocate(p.bytes()));
            else
                grads.push_back(td::Buffer{});
            if (opt.update && p.attrs.trainableOr())
                for (int k = 0; k < opt.update->slotsPerParam(); ++k)
                    optimizerSlots.push_back(*dev->allocate(p.bytes()));
        }
        for (const auto& n : g.nodes) {
            const size_t bytes = n.bytes();
            if (n.op == td::Op::Input) input = *dev->allocate(bytes);
            if (n.op == td::Op::Label) label = *dev->allocate(bytes);
        }
        if (!input.ptr) input = *dev->allocate(64);
        if (!label.ptr) label = *dev->allocate(64);
        if (opt.accumulators > 0)
            acc = *dev->allocate(static_cast<size_t>(opt.accumulators) * sizeof(double));
        bind.input = input;
        bind.label = label;
        bind.params = params;
        bind.grads = grads;
        bind.accumulators = acc;
        bind.update = opt.update;
        bind.optimizerSlots = optimizerSlots;
        bind.fuseUpdate = opt.fuseUpdate;
        shadows.assign(pids.size(), td::Buffer{});
        for (const auto& n : g.nodes)
            if (n.attrs.buf == td::BufKind::Shadow)
                for (size_t i = 0; i < pids.size(); ++i)
                    if (pids[i] == n.inputs[0]) shadows[i] = *dev->allocate(n.bytes());
        bind.shadows = shadows;
        if (opt.lossScale) {
            lossScale = *dev->allocate(sizeof(td::LossScaleState));
            const td::LossScaleState initial;
            std::memcpy(lossScale.ptr, &initial, sizeof initial);
            bind.lossScale = lossScale;
        }
        auto e = td::compileProgram(*dev, g, bind);
        if (!e.ok()) {
            if (error) *error = e.error();
            return false;
        }
        exe = std::move(e).value();
        return true;
    }
    float* param(size_t i) { return static_cast<float*>(params.at(i).ptr); }
    float* grad(size_t i) { return static_cast<float*>(grads.at(i).ptr); }
    float* in() { return static_cast<float*>(input.ptr); }
    void* lab() { return label.ptr; }
    const float* value(int id) { return static_cast<const float*>(exe->valuePtr(id)); }
    const float* output(const std::string& name) { return value(g.output(name)); }
    const double* accumulators() const { return static_cast<const double*>(acc.ptr); }
    void run(int64_t step = 1, int64_t base = 0, td::UpdateScalars update = {},
             bool refreshShadows = true) {
        td::Status s = exe->run(td::StepArgs{step, base, update, refreshShadows});
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
    }
};

inline td::Graph parseOrDie(const std::string& text) {
    auto r = td::parseGraph(text);
    if (!r.ok()) qFatal("IR parse failed: %s", r.error().c_str());
    return std::move(r).value();
}

}  // namespace tdtest
