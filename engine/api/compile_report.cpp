// compileReport (projects.h): the training step compiled twice, without and with the project's
// fusions, and measured from the lowered programs.
#include <cinttypes>
#include <cstdio>

#include "engine/api/projects.h"
#include "engine/graph/builder.h"
#include "engine/graph/lower.h"
#include "engine/graph/passes.h"
#include "engine/train/optimizer.h"
#include "engine/train/trainer.h"

namespace td::api {

namespace {

struct Compiled {
    CompileReport::Side side;
    std::vector<std::string> groups, refusals;
};

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

    // The fusion made while building: a trailing softmax (sigmoid) with its cross-entropy.
    if (co.enabled("fuse_softmax_xent") && !p.training.loss.fromLogits)
        for (const Node& n : g.nodes)
            if (n.op == Op::Loss &&
                (n.attrs.loss == LossKind::SparseSoftmaxXent ||
                 n.attrs.loss == LossKind::SoftmaxXent || n.attrs.loss == LossKind::SigmoidBce))
                c.groups.push_back(std::string("fuse_softmax_xent: the output activation + ") +
                                   p.training.loss.name +
                                   " -> one stable cross-entropy from the logits (" +
                                   lossKindName(*n.attrs.loss) + ")");
    for (const std::string& name : pm.passNames()) {
        auto* fp = dynamic_cast<FusingPass*>(pm.find(name));
        if (!fp || pm.isDisabled(name)) continue;
        for (const FusionDecision& d : fp->decisions())
            (d.fused ? c.groups : c.refusals)
                .push_back(name + ": " + (d.fused ? d.what : d.reason));
    }
    if (co.enabled("fuse_update") && lp.updateTensors.size() > 1)
        c.groups.push_back("fuse_update: the updates of " +
                           std::to_string(lp.updateTensors.size()) +
                           " parameters -> one multi-tensor pass");
    if (!lp.updateNote.empty()) c.refusals.push_back("fuse_update: " + lp.updateNote);
    return c;
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
    const CompileOptions co = compileOptions(p, true);
    for (const std::string& n : compilerPassNames())
        if (!co.enabled(n)) r.disabled.push_back(n);

    char line[160];
    std::string t = "compile report: " + p.name + " (training step, batch " +
                    std::to_string(p.training.batchSize) + ", precision " + r.precision + ")\n";
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
    t += "fusion groups (" + std::to_string(r.groups.size()) + "):\n";
    for (const auto& gline : r.groups) t += "  " + gline + "\n";
    t += "kept apart (" + std::to_string(r.refusals.size()) + "):\n";
    for (const auto& rline : r.refusals) t += "  " + rline + "\n";
    r.text = t;
    return r;
}

}  // namespace td::api
