#include "engine/graph/passes.h"

#include <algorithm>
#include <chrono>
#include <map>
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
    g.passesOff = disabled_;
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

void addStandardPasses(PassManager& pm, const CompileOptions& options) {
    pm.add(std::make_unique<FusionPass>());
    pm.add(std::make_unique<FoldCastsPass>(options.paramShadows));
    pm.add(std::make_unique<FuseActBiasGradPass>());
    pm.add(std::make_unique<FuseElementwisePass>());
    pm.add(std::make_unique<DeadCodePass>());
    pm.add(std::make_unique<MemoryPlanPass>());
    for (const std::string& n : options.disabled) pm.disable(n);
}

const std::vector<std::string>& compilerPassNames() {
    static const std::vector<std::string> names{
        "fuse_softmax_xent", "fusion", "fold_casts", "fuse_act_bias_grad",
        "fuse_elementwise",  "dce",    "memory",     "fuse_update"};
    return names;
}

const std::vector<std::string>& fusionPassNames() {
    static const std::vector<std::string> names{"fuse_softmax_xent", "fusion",
                                                "fold_casts",        "fuse_act_bias_grad",
                                                "fuse_elementwise",  "fuse_update"};
    return names;
}

const std::vector<std::string>& cpuPassNames() {
    static const std::vector<std::string> names{"cpu_skip_zeros",    "cpu_solo_pieces",
                                                "cpu_team_pieces",   "cpu_split_k",
                                                "cpu_narrow_kernel", "cpu_share_norm_sums"};
    return names;
}

const std::vector<std::string>& cudaPassNames() {
    static const std::vector<std::string> names{"cuda_half_conv", "cuda_fused_conv",
                                                "cuda_side_update"};
    return names;
}

Status checkPassNames(const std::vector<std::string>& names) {
    std::vector<std::string> known = compilerPassNames();
    known.insert(known.end(), cpuPassNames().begin(), cpuPassNames().end());
    known.insert(known.end(), cudaPassNames().begin(), cudaPassNames().end());
    for (const std::string& n : names) {
        if (n == "memory")
            return err("pass 'memory' cannot be turned off: every program needs its buffers");
        if (std::find(known.begin(), known.end(), n) != known.end()) continue;
        std::string list;
        for (const auto& k : known)
            if (k != "memory") list += (list.empty() ? "" : ", ") + k;
        return err("unknown pass '" + n + "' (expected one of: " + list + ")");
    }
    return Status::success();
}

namespace {

// The nodes `order` names, in that order, renumbered; operands, outputs and gradient bindings
// follow. Every operand of a surviving node must survive and come before it. Returns the
// old -> new id map (-1 for a node left out).
std::vector<int> renumberGraph(Graph& g, const std::vector<int>& order) {
    std::vector<int> remap(g.nodes.size(), -1);
    for (size_t i = 0; i < order.size(); ++i)
        remap[static_cast<size_t>(order[i])] = static_cast<int>(i);
    std::vector<Node> out;
    out.reserve(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
        Node n = std::move(g.nodes[static_cast<size_t>(order[i])]);
        n.id = static_cast<int>(i);
        for (int& in : n.inputs) {
            TD_ASSERT(remap[static_cast<size_t>(in)] >= 0);
            in = remap[static_cast<size_t>(in)];
            TD_ASSERT(in < n.id);
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

}  // namespace

void reorderGraph(Graph& g, const std::vector<int>& order) {
    TD_ASSERT(order.size() == g.nodes.size());
    renumberGraph(g, order);
}

std::vector<int> compactGraph(Graph& g, const std::vector<bool>& keep) {
    std::vector<int> order;
    for (size_t i = 0; i < g.nodes.size(); ++i)
        if (keep[i]) order.push_back(static_cast<int>(i));
    return renumberGraph(g, order);
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

void FusingPass::record(const Graph& g, FusionDecision d) {
    for (int id : d.nodes) {
        if (id < 0 || static_cast<size_t>(id) >= g.nodes.size()) continue;
        const std::string& l = g.node(id).layer;
        if (l.empty() || d.layers == l || d.layers.ends_with(", " + l)) continue;
        d.layers += (d.layers.empty() ? "" : ", ") + l;
    }
    decisions_.push_back(std::move(d));
}

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
        const bool conv = mm.op == Op::Conv2D;
        if (conv) {
            // A convolution takes its bias and activation as oneDNN post-ops as dense does.
            if (mm.inputs.size() != 2 || mm.attrs.act) continue;
        } else if (mm.op != Op::MatMul || mm.attrs.transA.value_or(false) ||
                   mm.attrs.transB.value_or(false)) {
            continue;
        }
        const char* opText = conv ? "conv2d " : "matmul ";
        FusionDecision d;
        d.nodes.push_back(mm.id);
        const auto& u = users[i];
        if (u.size() != 1 || g.node(u[0]).op != Op::BiasAdd || g.node(u[0]).inputs[0] != mm.id) {
            // A matmul without a following bias_add (backward products, use_bias=false) stays.
            if (u.size() == 1 && g.node(u[0]).op == Op::BiasAdd) {
                d.reason = opText + ref(mm.id) + " is the bias operand, not the input";
            } else if (!u.empty() && std::any_of(u.begin(), u.end(), [&](int x) {
                           return g.node(x).op == Op::BiasAdd;
                       })) {
                d.reason = opText + ref(mm.id) + " has " + std::to_string(u.size()) +
                           " users; fusing would recompute it";
            } else {
                continue;  // nothing to fuse with: not a decision worth reporting
            }
            record(g, d);
            continue;
        }
        if (isOutput(mm.id)) {
            d.reason = opText + ref(mm.id) + " is a graph output";
            record(g, d);
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
        fused.layer = mm.layer;
        fused.op = conv ? Op::Conv2D : Op::Dense;
        fused.inputs = {mm.inputs[0], mm.inputs[1], ba.inputs[1]};
        fused.dtype = g.node(last).dtype;
        fused.shape = g.node(last).shape;
        if (conv) fused.attrs = mm.attrs;  // the window
        fused.attrs.act = act;
        fused.attrs.hasBias = true;
        fused.attrs.alpha = alpha;
        d.fused = true;
        d.what = opText + ref(mm.id) + " + bias_add " + ref(ba.id) +
                 (last != ba.id ? " + act(" + std::string(actName(act)) + ") " + ref(last)
                                : std::string()) +
                 (conv ? " -> conv2d" : " -> dense") + actNote;
        for (int id : d.nodes)
            if (id != last) keep[static_cast<size_t>(id)] = false;
        g.node(last) = fused;
        record(g, d);
        changed = true;
    }
    if (changed) {
        // The fused node sits where the last op of its chain was; its operands are all earlier.
        compactGraph(g, keep);
    }
    return changed;
}

// ---- casts of mixed precision -------------------------------------------------------------------

namespace {

bool isOutputOrGrad(const Graph& g, int id) {
    for (const auto& [n, o] : g.outputs)
        if (o == id) return true;
    for (const auto& [p, gr] : g.grads)
        if (gr == id) return true;
    return false;
}

// Ops run by the backend's own kernels, which load and store any float dtype.
bool ownKernel(Op op) {
    switch (op) {
        case Op::BiasAdd:
        case Op::Act:
        case Op::Dropout:
        case Op::DropoutGrad:
        case Op::ActGrad:
        case Op::BiasGrad:
        case Op::Add:
        case Op::Loss:
        case Op::LossGrad:
        case Op::Metric:
        case Op::Cast:
            return true;
        default:
            return false;
    }
}

// Matrix products and convolutions: 16-bit operands, the result in their dtype or in f32
// (oneDNN's and cuBLASLt's products, oneDNN's convolutions).
bool productOp(Op op) {
    return op == Op::MatMul || op == Op::Dense || op == Op::Conv2D || op == Op::Conv2DGradInput ||
           op == Op::Conv2DGradFilter;
}

// Replaces every use of `from` (operands, outputs, gradients) by `to`, keeping `users` (from
// g.users()) up to date.
void redirectUses(Graph& g, std::vector<std::vector<int>>& users, int from, int to) {
    for (int u : users[static_cast<size_t>(from)]) {
        for (int& in : g.node(u).inputs)
            if (in == from) in = to;
        users[static_cast<size_t>(to)].push_back(u);
    }
    users[static_cast<size_t>(from)].clear();
    for (auto& [n, o] : g.outputs)
        if (o == from) o = to;
    for (auto& [p, gr] : g.grads)
        if (gr == from) gr = to;
}

std::string opRef(const Graph& g, int id) {
    return std::string(opName(g.node(id).op)) + " %" + std::to_string(id);
}

}  // namespace

Result<bool> FoldCastsPass::run(Graph& g) {
    decisions_.clear();
    bool changed = false;
    std::vector<bool> keep(g.nodes.size(), true);
    auto users = g.users();
    auto redirect = [&](int from, int to) { redirectUses(g, users, from, to); };
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        Node& c = g.nodes[i];
        if (c.op != Op::Cast || !keep[i]) continue;
        const int p = c.inputs[0];
        Node& src = g.node(p);
        FusionDecision d;
        d.nodes = {c.id, p};
        const std::string what = "cast %" + std::to_string(c.id) + " (" + dtypeName(src.dtype) +
                                 " -> " + dtypeName(c.dtype) + ")";
        if (src.op == Op::Param) {
            if (shadows_ && c.dtype != DType::F32) {
                c.attrs.buf = BufKind::Shadow;
                d.fused = true;
                d.what = what + " of param %" + std::to_string(p) +
                         " -> a shadow the optimizer update writes";
                changed = true;
            } else {
                d.reason = what + " of param %" + std::to_string(p) +
                           " stays: no optimizer update in this program writes a shadow";
            }
            record(g, d);
            continue;
        }
        const auto& su = users[static_cast<size_t>(p)];
        const bool widens = c.dtype == DType::F32;
        const bool producerWrites = ownKernel(src.op) || (productOp(src.op) && widens);
        if (su.size() == 1 && producerWrites && !isOutputOrGrad(g, p)) {
            // The producer writes the cast's dtype; the cast goes.
            src.dtype = c.dtype;
            redirect(c.id, p);
            keep[i] = false;
            d.fused = true;
            d.what = what + " folded into its producer " + opRef(g, p);
            record(g, d);
            changed = true;
            continue;
        }
        const auto& cu = users[static_cast<size_t>(c.id)];
        const bool readersLoad =
            !cu.empty() && !isOutputOrGrad(g, c.id) &&
            std::all_of(cu.begin(), cu.end(), [&](int u) { return ownKernel(g.node(u).op); });
        if (readersLoad && src.op != Op::Label) {
            std::string readers;
            for (int u : cu) readers += (readers.empty() ? "" : ", ") + opRef(g, u);
            redirect(c.id, p);
            keep[i] = false;
            d.fused = true;
            d.what = what + " folded into its readers " + readers;
            record(g, d);
            changed = true;
            continue;
        }
        // Why it stays.
        int root = p;
        while (g.node(root).op == Op::Reshape) root = g.node(root).inputs[0];
        if (g.node(root).op == Op::Input)
            d.reason = what + " of the input stays: the batch arrives in f32 and " +
                       (cu.empty() ? std::string("nothing reads it") : opRef(g, cu[0])) +
                       " reads " + dtypeName(c.dtype);
        else if (!producerWrites && su.size() == 1)
            d.reason = what + " stays: " + opRef(g, p) + " writes only " + dtypeName(src.dtype);
        else if (isOutputOrGrad(g, p) || isOutputOrGrad(g, c.id))
            d.reason = what + " stays: its operand or result is a program output";
        else
            d.reason = what + " stays: " + opRef(g, p) + " has " + std::to_string(su.size()) +
                       " readers and a matrix product reads only its own dtype";
        record(g, d);
    }
    if (changed && std::find(keep.begin(), keep.end(), false) != keep.end()) compactGraph(g, keep);
    return changed;
}

// ---- activation gradient + bias gradient ------------------------------------------------------

Result<bool> FuseActBiasGradPass::run(Graph& g) {
    decisions_.clear();
    auto users = g.users();
    std::vector<std::pair<int, int>> pairs;  // (act_grad, bias_grad)
    for (const Node& b : g.nodes) {
        if (b.op != Op::BiasGrad || b.attrs.byProducer.value_or(false)) continue;
        const Node& a = g.node(b.inputs[0]);
        FusionDecision d;
        d.nodes = {a.id, b.id};
        if (a.op != Op::ActGrad) {
            d.reason = "bias_grad %" + std::to_string(b.id) + " reads " + opRef(g, a.id) +
                       ", not an act_grad (a linear layer's gradient has no pass to join)";
        } else if (a.shape.size() < 2 || b.shape.size() != 1 || b.shape[0] != a.shape.back()) {
            d.reason = "bias_grad %" + std::to_string(b.id) + " of " + shapeToString(b.shape) +
                       " does not sum " + opRef(g, a.id) + " " + shapeToString(a.shape) +
                       " per channel";
        } else if (a.shape.size() > 2 && a.attrs.rate) {
            d.reason = "act_grad %" + std::to_string(a.id) + " on an image applies a dropout mask";
        } else if (a.attrs.biasGrad.value_or(false)) {
            d.reason = "act_grad %" + std::to_string(a.id) + " already writes a bias gradient";
        } else {
            d.fused = true;
            d.what = "act_grad(" + std::string(actName(a.attrs.actOr())) + ") %" +
                     std::to_string(a.id) + " + bias_grad %" + std::to_string(b.id) +
                     " -> one pass" + (a.shape.size() > 2 ? " over the image's positions" : "");
            pairs.emplace_back(a.id, b.id);
        }
        record(g, d);
    }
    if (pairs.empty()) return false;
    // A 16-bit cast that is the gradient's only other reader (the matrix product or
    // convolution gradients under mixed precision) is written by the same pass: act_grad writes
    // the cast's dtype, and the bias gradient sums the f32 values before they are rounded.
    std::vector<bool> keep(g.nodes.size(), true);
    for (auto [a, b] : pairs) {
        std::vector<int> others;
        for (int u : users[static_cast<size_t>(a)])
            if (u != b) others.push_back(u);
        if (others.size() != 1 || isOutputOrGrad(g, a)) continue;
        Node& c = g.node(others[0]);
        if (c.op != Op::Cast || c.dtype == DType::F32 || isOutputOrGrad(g, c.id)) continue;
        FusionDecision d;
        d.nodes = {c.id, a};
        d.fused = true;
        d.what = "cast %" + std::to_string(c.id) + " (f32 -> " + dtypeName(c.dtype) +
                 ") written by act_grad %" + std::to_string(a) + " with its bias gradient";
        record(g, d);
        g.node(a).dtype = c.dtype;
        redirectUses(g, users, c.id, a);
        keep[static_cast<size_t>(c.id)] = false;
    }
    // Each bias_grad moves right after its act_grad: it reads nothing else, and its value is
    // written there, so the memory plan must see it live from there.
    std::vector<int> after(g.nodes.size(), -1);
    std::vector<bool> moved(g.nodes.size(), false);
    for (auto [a, b] : pairs) {
        g.node(a).attrs.biasGrad = true;
        g.node(b).attrs.byProducer = true;
        after[static_cast<size_t>(a)] = b;
        moved[static_cast<size_t>(b)] = true;
    }
    std::vector<int> order;
    for (const Node& n : g.nodes) {
        if (moved[static_cast<size_t>(n.id)]) continue;
        order.push_back(n.id);
        if (after[static_cast<size_t>(n.id)] >= 0)
            order.push_back(after[static_cast<size_t>(n.id)]);
    }
    reorderGraph(g, order);
    if (std::find(keep.begin(), keep.end(), false) != keep.end()) {
        // keep is indexed by the ids before the reordering.
        std::vector<bool> kept(g.nodes.size(), true);
        for (size_t k = 0; k < order.size(); ++k) kept[k] = keep[static_cast<size_t>(order[k])];
        compactGraph(g, kept);
    }
    return true;
}

// ---- elementwise chains -------------------------------------------------------------------------

Result<bool> FuseElementwisePass::run(Graph& g) {
    decisions_.clear();
    auto users = g.users();
    std::vector<bool> keep(g.nodes.size(), true);
    bool changed = false;
    for (Node& n : g.nodes) {
        if (n.op == Op::ActGrad && !n.attrs.rate) {
            // dropout_grad -> act_grad: the mask applied to dy as act_grad reads it.
            const Node& dg = g.node(n.inputs[0]);
            if (dg.op != Op::DropoutGrad) continue;
            FusionDecision d;
            d.nodes = {dg.id, n.id};
            if (n.shape.size() != 2) {
                d.reason = "dropout_grad %" + std::to_string(dg.id) + " on " +
                           shapeToString(n.shape) +
                           " stays apart: the joined pass works on rows of [B,N]";
            } else if (users[static_cast<size_t>(dg.id)].size() != 1 || isOutputOrGrad(g, dg.id)) {
                d.reason = "dropout_grad %" + std::to_string(dg.id) + " has other readers";
            } else if (dg.dtype != n.dtype) {
                d.reason = "dropout_grad %" + std::to_string(dg.id) + " and act_grad %" +
                           std::to_string(n.id) + " differ in dtype";
            } else {
                n.attrs.rate = dg.attrs.rate;
                n.attrs.seed = dg.attrs.seed;
                keep[static_cast<size_t>(dg.id)] = false;
                n.inputs[0] = dg.inputs[0];
                d.fused = true;
                d.what = "dropout_grad %" + std::to_string(dg.id) + " + act_grad(" +
                         actName(n.attrs.actOr()) + ") %" + std::to_string(n.id) + " -> one pass";
                changed = true;
            }
            record(g, d);
        } else if (n.op == Op::Dropout) {
            // act -> dropout: the mask applied as the activation is written.
            const Node& a = g.node(n.inputs[0]);
            FusionDecision d;
            d.nodes = {a.id, n.id};
            if (a.op == Op::Dense || a.op == Op::MatMul) {
                d.reason = "dropout %" + std::to_string(n.id) + " after " + opRef(g, a.id) +
                           " stays apart: a oneDNN post-op cannot draw keyed masks";
            } else if (a.op != Op::Act || a.attrs.rate) {
                continue;  // nothing elementwise to join
            } else if (n.shape.size() != 2) {
                d.reason = "dropout %" + std::to_string(n.id) + " on " + shapeToString(n.shape) +
                           " stays apart: the joined pass works on rows of [B,N]";
            } else if (a.attrs.actOr() == ActKind::Softmax) {
                d.reason = "dropout %" + std::to_string(n.id) + " after softmax stays apart";
            } else if (users[static_cast<size_t>(a.id)].size() != 1 || isOutputOrGrad(g, a.id)) {
                d.reason = "dropout %" + std::to_string(n.id) + " stays apart: act %" +
                           std::to_string(a.id) + " is kept for its gradient";
            } else {
                Node fused = a;
                fused.id = n.id;
                fused.dtype = n.dtype;
                fused.attrs.rate = n.attrs.rate;
                fused.attrs.seed = n.attrs.seed;
                keep[static_cast<size_t>(a.id)] = false;
                d.fused = true;
                d.what = "act(" + std::string(actName(a.attrs.actOr())) + ") %" +
                         std::to_string(a.id) + " + dropout %" + std::to_string(n.id) +
                         " -> one pass";
                n = fused;
                changed = true;
            }
            record(g, d);
        }
    }
    if (changed) compactGraph(g, keep);
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
            aliasesOperand(nd.op) ? root[static_cast<size_t>(nd.inputs[0])] : static_cast<int>(i);
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
    // off < 0: no arena offset.
    auto place = [&changed](Node& nd, BufKind buf, int64_t off) {
        const std::optional<int64_t> o = off < 0 ? std::nullopt : std::optional<int64_t>(off);
        if (nd.attrs.buf != buf || nd.attrs.off != o) changed = true;
        nd.attrs.buf = buf;
        nd.attrs.off = o;
    };
    for (size_t i = 0; i < n; ++i) {
        Node& nd = g.nodes[i];
        if (nd.op == Op::Param) {
            place(nd, BufKind::Param, -1);
            continue;
        }
        if (nd.attrs.buf == BufKind::Shadow) continue;  // fold_casts: kept by the trainer
        if (nd.op == Op::Input || nd.op == Op::Label) {
            place(nd, nd.op == Op::Input ? BufKind::Input : BufKind::Label, -1);
            continue;
        }
        if (root[i] != static_cast<int>(i)) {
            place(nd, BufKind::Alias, -1);
            continue;
        }
        if (gradOut[i]) {
            place(nd, BufKind::Grad, -1);
            continue;
        }
        // Release blocks whose values are dead before this node runs. A block may be reused by
        // this node only if its last reader is an earlier node (kernels do not work in place).
        const size_t sz = align(nd.bytes());
        naiveBytes_ += sz;
        std::vector<Block> freeList;
        // A value its producer writes as a second result (bias_grad by_producer) is written
        // when that producer runs, one node earlier.
        const int defAt = static_cast<int>(i) - (nd.attrs.byProducer.value_or(false) ? 1 : 0);
        live.erase(std::remove_if(live.begin(), live.end(),
                                  [&](const Block& b) {
                                      if (b.freeAfter < defAt) {
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
