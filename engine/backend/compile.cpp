// compileProgram: the one way from a planned graph to an Executable (lower, check, compile).
#include <map>

#include "engine/backend/backend.h"

namespace td {

namespace {

std::string bindingName(Space s, int index) {
    switch (s) {
        case Space::Input:
            return "input";
        case Space::Label:
            return "label";
        case Space::Param:
            return "params[" + std::to_string(index) + "]";
        case Space::Grad:
            return "grads[" + std::to_string(index) + "]";
        case Space::Accumulator:
            return "accumulators";
        case Space::FlatGrad:
            return "flatGrads";
        case Space::Slot:
            return "optimizerSlots[" + std::to_string(index) + "]";
        case Space::Shadow:
            return "shadows[" + std::to_string(index) + "]";
        case Space::LossScale:
            return "lossScale";
        default:
            return spaceName(s);
    }
}

const Buffer* boundBuffer(const ProgramBindings& b, Space s, int index) {
    auto at = [index](const std::vector<Buffer>& v) -> const Buffer* {
        return index >= 0 && static_cast<size_t>(index) < v.size() ? &v[static_cast<size_t>(index)]
                                                                   : nullptr;
    };
    switch (s) {
        case Space::Input:
            return &b.input;
        case Space::Label:
            return &b.label;
        case Space::Param:
            return at(b.params);
        case Space::Grad:
            return at(b.grads);
        case Space::Accumulator:
            return &b.accumulators;
        case Space::FlatGrad:
            return &b.flatGrads;
        case Space::Slot:
            return at(b.optimizerSlots);
        case Space::Shadow:
            return at(b.shadows);
        case Space::LossScale:
            return &b.lossScale;
        default:
            return nullptr;
    }
}

}  // namespace

void* operandAddress(const ProgramBindings& b, void* arena, const Operand& o) {
    void* base = nullptr;
    switch (o.space) {
        case Space::None:
            return nullptr;
        case Space::Input:
            base = b.input.ptr;
            break;
        case Space::Label:
            base = b.label.ptr;
            break;
        case Space::Param:
            base = b.params.at(static_cast<size_t>(o.index)).ptr;
            break;
        case Space::Grad:
            base = b.grads.at(static_cast<size_t>(o.index)).ptr;
            break;
        case Space::Arena:
            base = arena;
            break;
        case Space::Accumulator:
            base = b.accumulators.ptr;
            break;
        case Space::FlatGrad:
            base = b.flatGrads.ptr;
            break;
        case Space::Slot:
            base = b.optimizerSlots.at(static_cast<size_t>(o.index)).ptr;
            break;
        case Space::Shadow:
            base = b.shadows.at(static_cast<size_t>(o.index)).ptr;
            break;
        case Space::LossScale:
            base = b.lossScale.ptr;
            break;
    }
    return base ? static_cast<char*>(base) + o.offset : nullptr;
}

Status checkBindings(const LoweredProgram& p, const ProgramBindings& b) {
    // The bytes each bound buffer must hold: the end of the furthest operand in it.
    std::map<std::pair<Space, int>, size_t> need;
    auto use = [&](const Operand& o) {
        if (o.space == Space::None || o.space == Space::Arena) return;
        // Accumulator operands name one slot by index; the buffer holds them all.
        const int index = o.space == Space::Accumulator ? 0 : o.index;
        size_t& n = need[{o.space, index}];
        n = std::max(n, static_cast<size_t>(o.offset) + o.bytes());
    };
    for (const Operand& v : p.values) use(v);
    for (const Instr& i : p.code) {
        for (const Operand& o : i.in) use(o);
        use(i.out);
        use(i.out2);
    }
    for (const UpdateOperands& u : p.updateTensors) {
        use(u.value);
        use(u.grad);
        for (const Operand& s : u.slot) use(s);
        use(u.shadow);
    }
    if (p.lossScaled) use(Operand{Space::LossScale, 0, 0, DType::U8, {sizeof(LossScaleState)}});
    for (const auto& [key, bytes] : need) {
        const Buffer* buf = boundBuffer(b, key.first, key.second);
        const std::string name = bindingName(key.first, key.second);
        if (!buf || !buf->ptr) return err("program " + p.name + ": " + name + " is not bound");
        if (buf->bytes < bytes)
            return err("program " + p.name + ": " + name + ": " + std::to_string(buf->bytes) +
                       " bytes bound, " + std::to_string(bytes) + " needed");
    }
    if (!p.buckets.empty() && !b.collectives)
        return err("program " + p.name + ": gradient buckets without collectives");
    if (p.update && !b.update) return err("program " + p.name + ": no update spec bound");
    return Status::success();
}

Result<std::unique_ptr<Executable>> compileProgram(Device& device, const Graph& planned,
                                                   const ProgramBindings& b) {
    for (const Node& n : planned.nodes) {
        Support s = device.supportsOp(planned, n);
        if (!s.ok) return err(s.reason);
    }
    LowerOptions o;
    o.accumulate = b.accumulators.ptr != nullptr;
    o.update = b.update;
    o.fuseUpdate = b.fuseUpdate;
    o.lossScale = b.lossScale.ptr != nullptr;
    if (b.collectives && !planned.grads.empty()) {
        if (b.buckets.empty())
            return err("program " + planned.name +
                       ": collectives bound without gradient buckets (planGradients)");
        if (!b.flatGrads.ptr)
            return err("program " + planned.name + ": collectives bound without flatGrads");
        const auto* flat = static_cast<const char*>(b.flatGrads.ptr);
        const std::vector<int> params = planned.params();
        o.gradOffsets.assign(params.size(), -1);
        for (size_t i = 0; i < params.size() && i < b.grads.size(); ++i) {
            const Buffer& g = b.grads[i];
            if (!g.ptr) continue;
            const auto* p = static_cast<const char*>(g.ptr);
            const size_t bytes = planned.node(params[i]).bytes();
            if (p < flat || p + bytes > flat + b.flatGrads.bytes || (p - flat) % sizeof(float))
                return err("program " + planned.name + ": grads[" + std::to_string(i) +
                           "] is not a view into flatGrads");
            o.gradOffsets[i] = (p - flat) / static_cast<int64_t>(sizeof(float));
        }
        for (size_t k = 0; k < b.buckets.size(); ++k) {
            const GradBucket& bk = b.buckets[k];
            if (bk.offset < 0 || bk.count < 0 ||
                static_cast<size_t>(bk.offset + bk.count) * sizeof(float) > b.flatGrads.bytes)
                return err("program " + planned.name + ": bucket " + std::to_string(k) +
                           " lies outside flatGrads");
        }
        o.buckets = b.buckets;
    }
    TD_ASSIGN_OR_RETURN(LoweredProgram lp, lower(planned, o));
    TD_RETURN_IF_ERROR(checkBindings(lp, b));
    return device.compile(lp, b);
}

}  // namespace td
