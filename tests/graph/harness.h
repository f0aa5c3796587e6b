// Test harness: compiles a graph stated as IR text on a device, with params and labels set from
// the test, and runs it.
#pragma once

#include <QtTest>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/graph/builder.h"
#include "engine/graph/passes.h"

namespace tdtest {

struct Harness {
    td::Graph g;
    std::unique_ptr<td::Device> dev;
    std::vector<td::Buffer> params, grads;
    td::Buffer input, label;
    std::unique_ptr<td::Executable> exe;

    ~Harness() {
        if (!dev) return;
        for (auto& b : params) dev->release(b);
        for (auto& b : grads)
            if (b.ptr) dev->release(b);
        if (input.ptr) dev->release(input);
        if (label.ptr) dev->release(label);
    }

    // Plans and compiles `graph` (runs the memory pass; other passes as given).
    bool compile(td::Graph graph, std::vector<std::string> passes = {},
                 std::string* error = nullptr) {
        g = std::move(graph);
        td::PassManager pm;
        for (const auto& p : passes) {
            if (p == "fusion") pm.add(std::make_unique<td::FusionPass>());
            if (p == "dce") pm.add(std::make_unique<td::DeadCodePass>());
        }
        pm.add(std::make_unique<td::MemoryPlanPass>());
        td::Status s = pm.run(g);
        if (!s.ok()) {
            if (error) *error = s.error();
            return false;
        }
        dev = td::makeCpuDevice(0);
        td::ProgramBindings bind;
        for (int id : g.params()) {
            const size_t bytes = g.node(id).bytes();
            params.push_back(*dev->allocate(bytes));
            grads.push_back(g.grads.count(id) ? *dev->allocate(bytes) : td::Buffer{});
        }
        for (const auto& n : g.nodes) {
            const size_t bytes = n.bytes();
            if (n.op == td::Op::Input) input = *dev->allocate(bytes);
            if (n.op == td::Op::Label) label = *dev->allocate(bytes);
        }
        if (!input.ptr) input = *dev->allocate(64);
        if (!label.ptr) label = *dev->allocate(64);
        bind.input = input;
        bind.label = label;
        bind.params = params;
        bind.grads = grads;
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
    void run(int64_t step = 1, int64_t base = 0) {
        QVERIFY(exe->run(td::StepArgs{step, base}).ok());
    }
};

inline td::Graph parseOrDie(const std::string& text) {
    auto r = td::parseGraph(text);
    if (!r.ok()) qFatal("IR parse failed: %s", r.error().c_str());
    return std::move(r).value();
}

}  // namespace tdtest
