// compileReport (projects.h): the training step compiled twice, without and with the project's
// fusions, and measured from the lowered programs; then compiled on cpu:0 for what the CPU
// device's own passes did to it.
#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <thread>

#include "engine/api/projects.h"
#include "engine/backend/backend.h"
#include "engine/backend/host_threads.h"
#include "engine/graph/builder.h"
#include "engine/graph/lower.h"
#include "engine/graph/passes.h"
#include "engine/train/optimizer.h"
#include "engine/train/trainer.h"

namespace td::api {

namespace {

struct Compiled {
    CompileReport::Side side;
    std::vector<std::string> groups, refusals;      // in the model's layer names
    std::vector<std::string> groupsIr, refusalsIr;  // in the IR's node ids
    Graph planned;                                  // the fused side's graph, planned
    size_t accumulators = 0;                        // its lowered program's accumulator slots
};

// An IR-level line without its node ids ("matmul %3 + bias_add %5" -> "matmul + bias_add").
std::string withoutIds(const std::string& text) {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '%' && i + 1 < text.size() &&
            std::isdigit(static_cast<unsigned char>(text[i + 1]))) {
            while (i + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[i + 1])))
                ++i;
            if (!out.empty() && out.back() == ' ') out.pop_back();
            continue;
        }
        out += text[i];
    }
    return out;
}

int64_t instrBytes(const LoweredProgram& lp, const Instr& ins) {
    switch (ins.op) {
        case InstrOp::AllReduceStart:
        case InstrOp::AllReduceWait:
            return 0;  // communication, not memory traffic of a kernel
        case InstrOp::Update: {
            int64_t b = 0;
            for (size_t t = 0; t < lp.updateTensors.size(); ++t) {
                if (ins.tensor >= 0 && static_cast<size_t>(ins.tensor) != t) continue;
                const UpdateOperands& u = lp.updateTensors[t];
                b += 2 * static_cast<int64_t>(u.value.bytes()) +
                     static_cast<int64_t>(u.grad.bytes());
                for (const Operand& s : u.slot) b += 2 * static_cast<int64_t>(s.bytes());
                if (u.shadow.space == Space::Shadow) b += static_cast<int64_t>(u.shadow.bytes());
            }
            return b;
        }
        default: {
            int64_t b = static_cast<int64_t>(ins.out.bytes());
            if (ins.out2.space != Space::None) b += static_cast<int64_t>(ins.out2.bytes());
            for (const Operand& o : ins.in) b += static_cast<int64_t>(o.bytes());
            return b;
        }
    }
}

Result<Compiled> compileOnce(const Project& p, const ModelInfo& info, const UpdateSpec& spec,
                             bool fused) {
    CompileOptions co = compileOptions(p, true);
    if (!fused) co.disabled.insert(fusionPassNames().begin(), fusionPassNames().end());
    BuildOptions bo = buildOptions(p, GraphMode::Train);
    bo.fuseSoftmaxXent = co.enabled("fuse_softmax_xent");
    bo.halfConv = cpuHalfConvolutions(bo.compute);  // the report compiles for the CPU
    const bool f16 = p.precision == PrecisionPolicy::MixedFloat16;
    TD_ASSIGN_OR_RETURN(Graph g, buildGraph(p.model, info, bo));
    TD_RETURN_IF_ERROR(autodiff(g, f16));
    PassManager pm;
    addStandardPasses(pm, co);
    TD_RETURN_IF_ERROR(pm.run(g));
    LowerOptions lo;
    lo.accumulate = true;
    lo.update = &spec;
    lo.fuseUpdate = co.enabled("fuse_update");
    lo.lossScale = f16;
    TD_ASSIGN_OR_RETURN(LoweredProgram lp, lower(g, lo));

    Compiled c;
    for (const Node& n : g.nodes)
        if (n.op != Op::Input && n.op != Op::Label && n.op != Op::Param && n.op != Op::Reshape)
            ++c.side.ops;
    for (const Instr& ins : lp.code) {
        if (ins.op == InstrOp::AllReduceWait || ins.refreshOnly) continue;
        ++c.side.kernels;
        c.side.bytes += instrBytes(lp, ins);
    }
    c.side.arenaBytes = static_cast<int64_t>(lp.arenaBytes);
    if (!fused) return c;
    c.planned = g;
    c.accumulators = lp.accumulators.size();

    // Each line twice: led by the model layers it joins, and as the IR names it.
    auto add = [&](bool group, const std::string& pass, const std::string& layers,
                   const std::string& text) {
        (group ? c.groups : c.refusals)
            .push_back((layers.empty() ? std::string("the step") : layers) + ": " +
                       withoutIds(text) + " (" + pass + ")");
        (group ? c.groupsIr : c.refusalsIr).push_back(pass + ": " + text);
    };
    // The fusion made while building: a trailing softmax (sigmoid) with its cross-entropy.
    if (co.enabled("fuse_softmax_xent") && !p.training.loss.fromLogits)
        for (const Node& n : g.nodes)
            if (n.op == Op::Loss &&
                (n.attrs.loss == LossKind::SparseSoftmaxXent ||
                 n.attrs.loss == LossKind::SoftmaxXent || n.attrs.loss == LossKind::SigmoidBce)) {
                const std::string& out = g.node(n.inputs[0]).layer;
                add(true, "fuse_softmax_xent", out.empty() ? n.layer : out + ", " + n.layer,
                    "the output activation + " + p.training.loss.name +
                        " -> one stable cross-entropy from the logits (" +
                        lossKindName(*n.attrs.loss) + ")");
            }
    for (const std::string& name : pm.passNames()) {
        auto* fp = dynamic_cast<FusingPass*>(pm.find(name));
        if (!fp || pm.isDisabled(name)) continue;
        for (const FusionDecision& d : fp->decisions())
            add(d.fused, name, d.layers, d.fused ? d.what : d.reason);
    }
    if (co.enabled("fuse_update") && lp.updateTensors.size() > 1)
        add(true, "fuse_update", "every layer's parameters",
            "the updates of " + std::to_string(lp.updateTensors.size()) +
                " parameters -> one multi-tensor pass");
    if (!lp.updateNote.empty()) add(false, "fuse_update", "", lp.updateNote);
    return c;
}

// Compiles the planned training step on a fresh cpu:0 bound as a one-device run binds it (zeroed
// parameters, gradients in one flat buffer, the optimizer's slots, the accumulators) and returns
// what the device's own passes did. On a thread of its own, as the trainer compiles: the OpenMP
// team it opens ends with it.
Result<std::vector<BackendPassRecord>> cpuPassRecords(const Project& p, const Compiled& c,
                                                      const UpdateSpec& spec, int threads) {
    Result<std::vector<BackendPassRecord>> result = err("not compiled");
    std::thread t([&] {
        auto opened = openDevice("cpu:0");
        if (!opened.ok()) {
            result = err(opened.error());
            return;
        }
        Device& d = **opened;
        prepareThreadFor(d, threads);
        std::vector<Buffer> owned;
        auto alloc = [&](size_t bytes, size_t rowBytes = 0) -> Result<Buffer> {
            TD_ASSIGN_OR_RETURN(Buffer b, rowBytes ? allocateWeightsOn(d, bytes, rowBytes)
                                                   : d.allocate(std::max<size_t>(bytes, 4)));
            owned.push_back(b);
            return b;
        };
        auto compile = [&]() -> Result<std::vector<BackendPassRecord>> {
            const Graph& g = c.planned;
            const std::vector<int> pids = g.params();
            const GradientPlan plan = planGradients(g, size_t{4} << 20);
            ProgramBindings bind;
            TD_ASSIGN_OR_RETURN(bind.flatGrads, alloc(plan.bytes()));
            for (size_t i = 0; i < pids.size(); ++i) {
                const Node& n = g.node(pids[i]);
                const size_t rowBytes =
                    n.shape.size() >= 2 ? static_cast<size_t>(n.shape.back()) * sizeof(float) : 0;
                TD_ASSIGN_OR_RETURN(Buffer w, alloc(n.bytes(), rowBytes));
                bind.params.push_back(w);
                const int64_t off = plan.offsets[i];
                bind.grads.push_back(
                    off < 0 ? Buffer{}
                            : Buffer{static_cast<float*>(bind.flatGrads.ptr) + off, n.bytes()});
                if (n.attrs.trainableOr())
                    for (int k = 0; k < spec.slotsPerParam(); ++k) {
                        TD_ASSIGN_OR_RETURN(Buffer s, alloc(n.bytes()));
                        bind.optimizerSlots.push_back(s);
                    }
            }
            bind.shadows.assign(pids.size(), Buffer{});
            for (const Node& n : g.nodes) {
                Buffer* b = n.op == Op::Input   ? &bind.input
                            : n.op == Op::Label ? &bind.label
                                                : nullptr;
                if (n.attrs.buf == BufKind::Shadow)
                    for (size_t i = 0; i < pids.size(); ++i)
                        if (pids[i] == n.inputs.at(0)) b = &bind.shadows[i];
                if (b) {
                    TD_ASSIGN_OR_RETURN(*b, alloc(n.bytes()));
                }
            }
            if (!bind.label.ptr) bind.label = bind.input;
            TD_ASSIGN_OR_RETURN(bind.accumulators, alloc(c.accumulators * sizeof(double)));
            if (p.precision == PrecisionPolicy::MixedFloat16) {
                TD_ASSIGN_OR_RETURN(bind.lossScale, alloc(sizeof(LossScaleState)));
                const LossScaleState initial;
                std::memcpy(bind.lossScale.ptr, &initial, sizeof initial);
            }
            bind.update = &spec;
            bind.fuseUpdate = compileOptions(p, true).enabled("fuse_update");
            TD_ASSIGN_OR_RETURN(std::unique_ptr<Executable> exe, compileProgram(d, g, bind));
            return exe->passRecords();
        };
        try {
            result = compile();
        } catch (const std::exception& e) {
            result = err(std::string("compiling on cpu:0: ") + e.what());
        }
        for (Buffer& b : owned) d.release(b);
    });
    t.join();
    return result;
}

std::string mib(int64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
    return buf;
}

}  // namespace

Result<CompileReport> compileReport(const Project& project) {
    ModelSpec model = project.model;
    TD_ASSIGN_OR_RETURN(ModelInfo info, inferShapes(model));
    Project p = project;
    p.model = model;
    TD_ASSIGN_OR_RETURN(auto opt, Optimizer::create(p.training.optimizer));
    const UpdateSpec spec = opt->spec();
    TD_RETURN_IF_ERROR(checkPassNames(p.disabledPasses));
    TD_ASSIGN_OR_RETURN(Compiled before, compileOnce(p, info, spec, false));
    TD_ASSIGN_OR_RETURN(Compiled after, compileOnce(p, info, spec, true));
    CompileReport r;
    r.unfused = before.side;
    r.fused = after.side;
    r.precision = precisionName(p.precision);
    r.groups = after.groups;
    r.refusals = after.refusals;
    r.groupsIr = after.groupsIr;
    r.refusalsIr = after.refusalsIr;
    const CompileOptions co = compileOptions(p, true);
    for (const std::string& n : compilerPassNames())
        if (!co.enabled(n)) r.disabled.push_back(n);
    for (const std::string& n : cpuPassNames())
        if (!co.enabled(n)) r.disabled.push_back(n);
    const DeviceDesc cpu = cpuDeviceDesc();
    const int threads = chooseWorkerThreads(info, p.training.batchSize, cpu.threads);
    auto records = cpuPassRecords(p, after, spec, threads);
    if (records.ok()) {
        for (const BackendPassRecord& b : *records)
            r.cpuPasses.push_back({b.name, b.what, b.disabled, b.changed});
        const int helpers = cpu.threads - threads;
        r.cpuSetting = helpers > 0 ? "the step on 1 thread, " + std::to_string(helpers) +
                                         (helpers == 1 ? " helper" : " helpers")
                       : threads > 1 ? "the step on the OpenMP team of " + std::to_string(threads)
                                     : "the step on the device's one thread";
    } else {
        r.cpuSetting = "not compiled: " + records.error();
    }

    char line[192];
    std::string t = "compile report: " + p.name + " (training step, batch " +
                    std::to_string(p.training.batchSize) + ", precision " + r.precision + ")\n";
    // What a user can act on first: what fusion saves per step, then the details.
    const int savedKernels = r.unfused.kernels - r.fused.kernels;
    const int64_t savedBytes = r.unfused.bytes - r.fused.bytes;
    t += "fusion saves " + std::to_string(savedKernels) + " of " +
         std::to_string(r.unfused.kernels) + " kernels and " +
         mib(std::max<int64_t>(0, savedBytes)) + " of memory traffic per step, in " +
         std::to_string(r.groups.size()) + " fusion groups" +
         (r.refusals.empty() ? std::string()
                             : "; " + std::to_string(r.refusals.size()) + " kept apart (below)") +
         "\n";
    std::snprintf(line, sizeof line, "  %-24s %14s %14s\n", "", "unfused", "fused");
    t += line;
    auto row = [&](const char* what, const std::string& a, const std::string& b) {
        std::snprintf(line, sizeof line, "  %-24s %14s %14s\n", what, a.c_str(), b.c_str());
        t += line;
    };
    row("ops", std::to_string(r.unfused.ops), std::to_string(r.fused.ops));
    row("kernels per step", std::to_string(r.unfused.kernels), std::to_string(r.fused.kernels));
    row("bytes moved per step", mib(r.unfused.bytes), mib(r.fused.bytes));
    row("peak arena bytes", std::to_string(r.unfused.arenaBytes),
        std::to_string(r.fused.arenaBytes));
    if (!r.disabled.empty()) {
        t += "passes off:";
        for (const auto& n : r.disabled) t += " " + n;
        t += "\n";
    }
    t += "fusion groups (" + std::to_string(r.groups.size()) + "), by layer:\n";
    for (const auto& gline : r.groups) t += "  " + gline + "\n";
    t += "kept apart (" + std::to_string(r.refusals.size()) + "):\n";
    for (const auto& rline : r.refusals) t += "  " + rline + "\n";
    t += "the same in the IR (node ids as `traindeck compile --dump-after final` prints them):\n";
    for (const auto& gline : r.groupsIr) t += "  " + gline + "\n";
    for (const auto& rline : r.refusalsIr) t += "  kept apart: " + rline + "\n";
    t += "cpu:0 passes (one device, " + r.cpuSetting + "):\n";
    if (!r.cpuPasses.empty()) {
        std::snprintf(line, sizeof line, "  %-24s %7s  %s\n", "pass", "applied", "what it does");
        t += line;
    }
    for (const CompileReport::DevicePass& d : r.cpuPasses) {
        const std::string applied = d.disabled ? "off" : std::to_string(d.applied);
        std::snprintf(line, sizeof line, "  %-24s %7s  %s\n", d.name.c_str(), applied.c_str(),
                      d.what.c_str());
        t += line;
    }
    r.text = t;
    return r;
}

}  // namespace td::api
