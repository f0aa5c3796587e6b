#include "engine/graph/passes.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

namespace td {

void PassManager::add(std::unique_ptr<Pass> pass) {
    passes_.push_back(std::move(pass));
}
void PassManager::disable(const std::string& name) {
    disabled_.insert(name);
}
void PassManager::setDumpHook(std::function<void(const std::string&, const Graph&)> hook) {
    hook_ = std::move(hook);
}

std::vector<std::string> PassManager::passNames() const {
    std::vector<std::string> out;
    for (const auto& p : passes_) out.push_back(p->name());
    return out;
}

Pass* PassManager::find(const std::string& name) {
    for (auto& p : passes_)
        if (name == p->name()) return p.get();
    return nullptr;
}

Status PassManager::run(Graph& g) {
    timings_.clear();
    TD_RETURN_IF_ERROR(verifyGraph(g));
    if (hook_) hook_("build", g);
    for (auto& p : passes_) {
        PassTiming t;
        t.pass = p->name();
        if (isDisabled(t.pass)) {
            t.skipped = true;
            timings_.push_back(t);
            continue;
        }
        auto t0 = std::chrono::steady_clock::now();
        auto r = p->run(g);
        t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!r.ok()) return err("pass " + t.pass + ": " + r.error());
        t.changed = *r;
        Status v = verifyGraph(g);
        if (!v.ok()) return err("graph invalid after pass " + t.pass + ": " + v.error());
        timings_.push_back(t);
        if (hook_) hook_(t.pass, g);
    }
    return Status::success();
}

void addStandardPasses(PassManager& pm) {
    pm.add(std::make_unique<FusionPass>());
    pm.add(std::make_unique<DeadCodePass>());
    pm.add(std::make_unique<MemoryPlanPass>());
}

std::vector<int> compactGraph(Graph& g, const std::vector<bool>& keep) {
    std::vector<int> remap(g.nodes.size(), -1);
    std::vector<Node> out;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        if (!keep[i]) continue;
        Node n = std::move(g.nodes[i]);
        remap[i] = static_cast<int>(out.size());
        n.id = remap[i];
        for (int& in : n.inputs) {
            TD_ASSERT(remap[static_cast<size_t>(in)] >= 0);
            in = remap[static_cast<size_t>(in)];
        }
        out.push_back(std::move(n));
    }
    g.nodes = std::move(out);
    for (auto& [name, id] : g.outputs) id = remap[static_cast<size_t>(id)];
    std::map<int, int> grads;
    for (auto& [p, gr] : g.grads)
        grads[remap[static_cast<size_t>(p)]] = remap[static_cast<size_t>(gr)];
    g.grads = std::move(grads);
    return remap;
}

// ---- fusion
// --------------------------------------------------------------------------------------

namespace {
bool isPostOpAct(ActKind act) {
    return act == ActKind::Relu || act == ActKind::LeakyRelu || act == ActKind::Elu ||
           act == ActKind::Gelu || act == ActKind::Sigmoid || act == ActKind::Tanh;
}
std::string ref(int id) {
    return "%" + std::to_string(id);
}
}  // namespace

Result<bool> FusionPass::run(Graph& g) {
    decisions_.clear();
    auto users = g.users();
    std::vector<bool> keep(g.nodes.size(), true);
    bool changed = false;
    auto isOutput = [&](int id) {
        for (const auto& [n, o] : g.outputs)
            if (o == id) return true;
        for (const auto& [p, gr] : g.grads)
            if (gr == id) return true;
        return false;
    };
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        Node& mm = g.nodes[i];
        if (mm.op != Op::MatMul || mm.attrs.transA.value_or(false) ||
            mm.attrs.transB.value_or(false))
            continue;
        FusionDecision d;
        d.nodes.push_back(mm.id);
        const auto& u = users[i];
        if (u.size() != 1 || g.node(u[0]).op != Op::BiasAdd || g.node(u[0]).inputs[0] != mm.id) {
            // A matmul without a following bias_add (backward products, use_bias=false) stays.
            if (u.size() == 1 && g.node(u[0]).op == Op::BiasAdd) {
                d.reason = "matmul " + ref(mm.id) + " is the bias operand, not the input";
            } else if (!u.empty() && std::any_of(u.begin(), u.end(), [&](int x) {
                           return g.node(x).op == Op::BiasAdd;
                       })) {
                d.reason = "matmul " + ref(mm.id) + " has " + std::to_string(u.size()) +
                           " users; fusing would recompute it";
            } else {
                continue;  // nothing to fuse with: not a decision worth reporting
            }
            decisions_.push_back(d);
            continue;
        }
        if (isOutput(mm.id)) {
            d.reason = "matmul " + ref(mm.id) + " is a graph output";
            decisions_.push_back(d);
            continue;
        }
        Node& ba = g.node(u[0]);
        d.nodes.push_back(ba.id);
        int last = ba.id;
        ActKind act = ActKind::Linear;
        std::optional<double> alpha;
        const auto& u2 = users[static_cast<size_t>(ba.id)];
        std::string actNote;
        if (u2.size() == 1 && g.node(u2[0]).op == Op::Act) {
            const Node& an = g.node(u2[0]);
            if (!isPostOpAct(an.attrs.actOr())) {
                actNote = "; act(" + std::string(actName(an.attrs.actOr())) + ") " + ref(an.id) +
                          " stays apart: not an elementwise post-op";
            } else if (isOutput(ba.id)) {
                actNote = "; act " + ref(an.id) + " stays apart: its input is a graph output";
            } else {
                act = an.attrs.actOr();
                alpha = an.attrs.alpha;
                last = an.id;
                d.nodes.push_back(an.id);
            }
        } else if (u2.size() > 1) {
            for (int x : u2)
                if (g.node(x).op == Op::Act)
                    actNote = "; act " + ref(x) + " stays apart: bias_add " + ref(ba.id) + " has " +
                              std::to_string(u2.size()) + " users (its gradient needs it)";
        }
        // Rewrite `last` in place as the fused node so users and ids stay valid.
        Node fused;
        fused.id = last;
        fused.op = Op::Dense;
        fused.inputs = {mm.inputs[0], mm.inputs[1], ba.inputs[1]};
        fused.dtype = DType::F32;
        fused.shape = g.node(last).shape;
        fused.attrs.act = act;
        fused.attrs.hasBias = true;
        fused.attrs.alpha = alpha;
        d.fused = true;
        d.what = "matmul " + ref(mm.id) + " + bias_add " + ref(ba.id) +
                 (last != ba.id ? " + act(" + std::string(actName(act)) + ") " + ref(last)
                                : std::string()) +
                 " -> dense" + actNote;
        for (int id : d.nodes)
            if (id != last) keep[static_cast<size_t>(id)] = false;
        g.node(last) = fused;
        decisions_.push_back(d);
        changed = true;
    }
    if (changed) {
        // The fused node sits where the last op of its chain was; its operands are all earlier.
        compactGraph(g, keep);
    }
    return changed;
}

// ---- dead code
// -----------------------------------------------------------------------------------

Result<bool> DeadCodePass::run(Graph& g) {
    std::vector<bool> live(g.nodes.size(), false);
    std::vector<int> stack;
    for (const auto& [n, id] : g.outputs) stack.push_back(id);
    for (const auto& [p, gr] : g.grads) {
        stack.push_back(p);
        stack.push_back(gr);
    }
    while (!stack.empty()) {
        int id = stack.back();
        stack.pop_back();
        if (live[static_cast<size_t>(id)]) continue;
        live[static_cast<size_t>(id)] = true;
        for (int in : g.node(id).inputs) stack.push_back(in);
    }
    // Leaves the trainer binds (input, label, params) stay even when unused.
    for (const auto& n : g.nodes)
        if (n.op == Op::Input || n.op == Op::Label || n.op == Op::Param)
            live[static_cast<size_t>(n.id)] = true;
    if (std::all_of(live.begin(), live.end(), [](bool b) { return b; })) return false;
    compactGraph(g, live);
    return true;
}

// ---- memory planning
// -----------------------------------------------------------------------------

Result<bool> MemoryPlanPass::run(Graph& g) {
    const size_t n = g.nodes.size();
    // Root storage of each value (reshape aliases its input).
    std::vector<int> root(n);
    for (size_t i = 0; i < n; ++i) {
        const Node& nd = g.nodes[i];
        root[i] =
            nd.op == Op::Reshape ? root[static_cast<size_t>(nd.inputs[0])] : static_cast<int>(i);
    }
    std::vector<bool> gradOut(n, false);
    for (const auto& [p, gr] : g.grads)
        gradOut[static_cast<size_t>(root[static_cast<size_t>(gr)])] = true;
    std::vector<int> lastUse(n, -1);
    for (size_t i = 0; i < n; ++i) {
        lastUse[static_cast<size_t>(root[i])] =
            std::max(lastUse[static_cast<size_t>(root[i])], static_cast<int>(i));
        for (int in : g.nodes[i].inputs) {
            size_t r = static_cast<size_t>(root[static_cast<size_t>(in)]);
            lastUse[r] = std::max(lastUse[r], static_cast<int>(i));
        }
    }
    for (const auto& [name, id] : g.outputs)
        lastUse[static_cast<size_t>(root[static_cast<size_t>(id)])] = static_cast<int>(n);

    struct Block {
        size_t off, size;
        int freeAfter;
    };
    std::vector<Block> live;
    size_t top = 0;
    naiveBytes_ = 0;
    auto align = [](size_t b) { return (b + 63) / 64 * 64; };
    // A graph planned before (the same plan or another) is rewritten only where it differs, so a
    // second run over its own output reports no change.
    bool changed = false;
    auto place = [&changed](Node& nd, BufKind buf, std::optional<int64_t> off) {
        if (nd.attrs.buf != buf || nd.attrs.off != off) changed = true;
        nd.attrs.buf = buf;
        nd.attrs.off = off;
    };
    for (size_t i = 0; i < n; ++i) {
        Node& nd = g.nodes[i];
        if (nd.op == Op::Param) {
            place(nd, BufKind::Param, std::nullopt);
            continue;
        }
        if (nd.op == Op::Input || nd.op == Op::Label) {
            place(nd, nd.op == Op::Input ? BufKind::Input : BufKind::Label, std::nullopt);
            continue;
        }
        if (root[i] != static_cast<int>(i)) {
            place(nd, BufKind::Alias, std::nullopt);
            continue;
        }
        if (gradOut[i]) {
            place(nd, BufKind::Grad, std::nullopt);
            continue;
        }
        // Release blocks whose values are dead before this node runs. A block may be reused by
        // this node only if its last reader is an earlier node (kernels do not work in place).
        const size_t sz = align(nd.bytes());
        naiveBytes_ += sz;
        std::vector<Block> freeList;
        live.erase(std::remove_if(live.begin(), live.end(),
                                  [&](const Block& b) {
                                      if (b.freeAfter < static_cast<int>(i)) {
                                          freeList.push_back(b);
                                          return true;
                                      }
                                      return false;
                                  }),
                   live.end());
        // First fit in the gaps between live blocks.
        std::sort(live.begin(), live.end(),
                  [](const Block& a, const Block& b) { return a.off < b.off; });
        size_t off = 0;
        for (const Block& b : live) {
            if (b.off >= off + sz) break;
            off = std::max(off, b.off + b.size);
        }
        live.push_back({off, sz, lastUse[i]});
        top = std::max(top, off + sz);
        place(nd, BufKind::Arena, static_cast<int64_t>(off));
    }
    arenaBytes_ = top;
    return changed;
}

}  // namespace td
