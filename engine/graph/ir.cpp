#include "engine/graph/ir.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "engine/graph/conv_geometry.h"
#include "engine/graph/image_augment.h"

namespace td {

namespace {
struct OpEntry {
    Op op;
    const char* name;
    int minInputs;
    int maxInputs;
};
constexpr OpEntry kOps[] = {
    {Op::Input, "input", 0, 0},
    {Op::Label, "label", 0, 0},
    {Op::Param, "param", 0, 0},
    {Op::Reshape, "reshape", 1, 1},
    {Op::MatMul, "matmul", 2, 2},
    {Op::BiasAdd, "bias_add", 2, 2},
    {Op::Act, "act", 1, 1},
    {Op::Dense, "dense", 2, 3},
    {Op::Dropout, "dropout", 1, 1},
    {Op::Loss, "loss", 2, 2},
    {Op::Metric, "metric", 2, 2},
    {Op::RegLoss, "reg_loss", 1, 1},
    {Op::LossGrad, "loss_grad", 2, 2},
    {Op::ActGrad, "act_grad", 2, 2},
    {Op::DropoutGrad, "dropout_grad", 1, 1},
    {Op::BiasGrad, "bias_grad", 1, 1},
    {Op::RegGrad, "reg_grad", 2, 2},
    {Op::Add, "add", 2, 2},
    {Op::Cast, "cast", 1, 1},
    {Op::Conv2D, "conv2d", 2, 3},
    {Op::Conv2DGradInput, "conv2d_grad_input", 2, 2},
    {Op::Conv2DGradFilter, "conv2d_grad_filter", 2, 2},
    {Op::MaxPool, "max_pool", 1, 1},
    {Op::MaxPoolGrad, "max_pool_grad", 2, 2},
    {Op::AvgPool, "avg_pool", 1, 1},
    {Op::AvgPoolGrad, "avg_pool_grad", 1, 1},
    {Op::Pad2D, "pad2d", 1, 1},
    {Op::Pad2DGrad, "pad2d_grad", 1, 1},
    {Op::Scale, "scale", 1, 1},
    {Op::ChannelMean, "channel_mean", 1, 1},
    {Op::ChannelVar, "channel_var", 2, 2},
    {Op::BatchNorm, "batch_norm", 3, 5},
    {Op::BatchNormGrad, "batch_norm_grad", 4, 5},
    {Op::NormGammaGrad, "norm_gamma_grad", 4, 4},
    {Op::MovingAvg, "moving_avg", 2, 2},
    {Op::LayerNorm, "layer_norm", 1, 3},
    {Op::LayerNormGrad, "layer_norm_grad", 2, 3},
    {Op::LayerNormGammaGrad, "layer_norm_gamma_grad", 2, 2},
    {Op::Resize, "resize", 1, 1},
    {Op::RandomCrop, "random_crop", 1, 1},
    {Op::RandomFlip, "random_flip", 1, 1},
    {Op::RandomRotation, "random_rotation", 1, 1},
    {Op::RandomZoom, "random_zoom", 1, 1},
    {Op::RandomTranslation, "random_translation", 1, 1},
    {Op::RandomContrast, "random_contrast", 1, 1},
    {Op::RandomBrightness, "random_brightness", 1, 1},
};
const OpEntry& entry(Op op) {
    for (const auto& e : kOps)
        if (e.op == op) return e;
    TD_ASSERT_MSG(false, "op missing from kOps");
}
}  // namespace

const char* opName(Op op) {
    return entry(op).name;
}

Result<Op> parseOp(const std::string& s) {
    for (const auto& e : kOps)
        if (s == e.name) return e.op;
    return err("unknown op '" + s + "'");
}

std::string fmtNum(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}

double textNumber(double v) {
    return std::strtod(fmtNum(v).c_str(), nullptr);
}

namespace {
template <class E>
struct NamedKind {
    E kind;
    const char* name;
};
constexpr NamedKind<ActKind> kActs[] = {
    {ActKind::Linear, "linear"}, {ActKind::Relu, "relu"},       {ActKind::LeakyRelu, "leaky_relu"},
    {ActKind::Elu, "elu"},       {ActKind::Gelu, "gelu"},       {ActKind::Sigmoid, "sigmoid"},
    {ActKind::Tanh, "tanh"},     {ActKind::Softmax, "softmax"},
};
constexpr NamedKind<LossKind> kLosses[] = {
    {LossKind::SparseSoftmaxXent, "sparse_softmax_xent"},
    {LossKind::SoftmaxXent, "softmax_xent"},
    {LossKind::SparseXent, "sparse_xent"},
    {LossKind::Xent, "xent"},
    {LossKind::SigmoidBce, "sigmoid_bce"},
    {LossKind::Bce, "bce"},
    {LossKind::Mse, "mse"},
};
constexpr NamedKind<MetricKind> kMetrics[] = {
    {MetricKind::SparseCategorical, "sparse_categorical"},
    {MetricKind::Categorical, "categorical"},
    {MetricKind::Binary, "binary"},
    {MetricKind::SparseTopK, "sparse_top_k"},
    {MetricKind::TopK, "top_k"},
};
constexpr NamedKind<BufKind> kBufs[] = {
    {BufKind::Param, "param"},   {BufKind::Grad, "grad"},   {BufKind::Input, "input"},
    {BufKind::Label, "label"},   {BufKind::Arena, "arena"}, {BufKind::Alias, "alias"},
    {BufKind::Shadow, "shadow"},
};
constexpr NamedKind<Interp> kInterps[] = {{Interp::Bilinear, "bilinear"},
                                          {Interp::Nearest, "nearest"}};
constexpr NamedKind<FillMode> kFills[] = {{FillMode::Reflect, "reflect"},
                                          {FillMode::Wrap, "wrap"},
                                          {FillMode::Constant, "constant"},
                                          {FillMode::Nearest, "nearest"}};
constexpr NamedKind<FlipMode> kFlips[] = {
    {FlipMode::HorizontalAndVertical, "horizontal_and_vertical"},
    {FlipMode::Horizontal, "horizontal"},
    {FlipMode::Vertical, "vertical"}};

template <class E, size_t N>
const char* kindName(const NamedKind<E> (&table)[N], E k) {
    for (const auto& e : table)
        if (e.kind == k) return e.name;
    TD_ASSERT_MSG(false, "enum value missing from its name table");
}

template <class E, size_t N>
Result<E> parseKind(const NamedKind<E> (&table)[N], const char* what, const std::string& s) {
    std::string list;
    for (const auto& e : table) {
        if (s == e.name) return e.kind;
        list += (list.empty() ? "" : ", ") + std::string(e.name);
    }
    return err("unknown " + std::string(what) + " '" + s + "' (expected " + list + ")");
}
}  // namespace

const char* actName(ActKind k) {
    return kindName(kActs, k);
}
Result<ActKind> parseActKind(const std::string& s) {
    return parseKind(kActs, "activation", s);
}
const char* lossKindName(LossKind k) {
    return kindName(kLosses, k);
}
Result<LossKind> parseLossKind(const std::string& s) {
    return parseKind(kLosses, "loss kernel", s);
}
const char* metricKindName(MetricKind k) {
    return kindName(kMetrics, k);
}
Result<MetricKind> parseMetricKind(const std::string& s) {
    return parseKind(kMetrics, "metric kernel", s);
}
const char* bufKindName(BufKind k) {
    return kindName(kBufs, k);
}
Result<BufKind> parseBufKind(const std::string& s) {
    return parseKind(kBufs, "buffer", s);
}
const char* interpName(Interp k) {
    return kindName(kInterps, k);
}
Result<Interp> parseInterp(const std::string& s) {
    return parseKind(kInterps, "interpolation", s);
}
const char* fillName(FillMode k) {
    return kindName(kFills, k);
}
Result<FillMode> parseFill(const std::string& s) {
    return parseKind(kFills, "fill mode", s);
}
const char* flipName(FlipMode k) {
    return kindName(kFlips, k);
}
Result<FlipMode> parseFlip(const std::string& s) {
    return parseKind(kFlips, "flip mode", s);
}

int Graph::add(Op op, std::vector<int> inputs, DType dtype, Shape shape, NodeAttrs attrs) {
    Node n;
    n.id = static_cast<int>(nodes.size());
    n.op = op;
    n.inputs = std::move(inputs);
    n.dtype = dtype;
    n.shape = std::move(shape);
    n.attrs = std::move(attrs);
    n.layer = layerScope;
    nodes.push_back(std::move(n));
    return nodes.back().id;
}

int Graph::output(const std::string& outputName) const {
    for (const auto& [n, id] : outputs)
        if (n == outputName) return id;
    return -1;
}

std::vector<int> Graph::params() const {
    std::vector<int> out;
    for (const auto& n : nodes)
        if (n.op == Op::Param) out.push_back(n.id);
    return out;
}

std::vector<std::vector<int>> Graph::users() const {
    std::vector<std::vector<int>> u(nodes.size());
    for (const auto& n : nodes)
        for (int i : n.inputs) u[static_cast<size_t>(i)].push_back(n.id);
    return u;
}

// ---- text form
// -----------------------------------------------------------------------------------

namespace {
bool needsQuotes(const std::string& v) {
    if (v.empty()) return true;
    for (char c : v)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
              c == '+'))
            return true;
    return false;
}
}  // namespace

namespace {
// Every attribute of NodeAttrs with its text name, in the order the text form prints them (sorted
// by name), and how its value is written and read.
std::string toText(bool v) {
    return v ? "1" : "0";
}
std::string toText(double v) {
    return fmtNum(v);
}
std::string toText(int64_t v) {
    return std::to_string(v);
}
std::string toText(uint64_t v) {
    return std::to_string(v);
}
std::string toText(const std::string& v) {
    return v;
}
std::string toText(ActKind v) {
    return actName(v);
}
std::string toText(LossKind v) {
    return lossKindName(v);
}
std::string toText(MetricKind v) {
    return metricKindName(v);
}
std::string toText(BufKind v) {
    return bufKindName(v);
}
std::string toText(Interp v) {
    return interpName(v);
}
std::string toText(FillMode v) {
    return fillName(v);
}
std::string toText(FlipMode v) {
    return flipName(v);
}
std::string toText(const std::vector<int64_t>& v) {  // "3x3"
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? "x" : "") + std::to_string(v[i]);
    return out;
}

Status fromText(const std::string& s, bool& out) {
    if (s != "0" && s != "1") return err("expected 0 or 1, got '" + s + "'");
    out = s == "1";
    return Status::success();
}
Status fromText(const std::string& s, double& out) {
    char* end = nullptr;
    errno = 0;
    out = s.empty() ? 0.0 : std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || errno == ERANGE)
        return err("expected a number, got '" + s + "'");
    return Status::success();
}
Status fromText(const std::string& s, int64_t& out) {
    char* end = nullptr;
    errno = 0;
    const long long v = s.empty() ? 0 : std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno == ERANGE)
        return err("expected an integer, got '" + s + "'");
    out = v;
    return Status::success();
}
Status fromText(const std::string& s, uint64_t& out) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = s.empty() ? 0 : std::strtoull(s.c_str(), &end, 10);
    if (s.empty() || s[0] == '-' || *end != '\0' || errno == ERANGE)
        return err("expected an unsigned integer, got '" + s + "'");
    out = v;
    return Status::success();
}
Status fromText(const std::string& s, std::vector<int64_t>& out) {
    out.clear();
    size_t start = 0;
    while (true) {
        const size_t end = s.find('x', start);
        int64_t v = 0;
        const Status st = fromText(s.substr(start, end - start), v);
        if (!st.ok()) return err("expected sizes like 3x3, got '" + s + "'");
        out.push_back(v);
        if (end == std::string::npos) break;
        start = end + 1;
    }
    return Status::success();
}
Status fromText(const std::string& s, std::string& out) {
    out = s;
    return Status::success();
}
template <class E>
Status kindFromText(Result<E> r, E& out) {
    if (!r.ok()) return err(r.error());
    out = *r;
    return Status::success();
}
Status fromText(const std::string& s, ActKind& out) {
    return kindFromText(parseActKind(s), out);
}
Status fromText(const std::string& s, LossKind& out) {
    return kindFromText(parseLossKind(s), out);
}
Status fromText(const std::string& s, MetricKind& out) {
    return kindFromText(parseMetricKind(s), out);
}
Status fromText(const std::string& s, BufKind& out) {
    return kindFromText(parseBufKind(s), out);
}
Status fromText(const std::string& s, Interp& out) {
    return kindFromText(parseInterp(s), out);
}
Status fromText(const std::string& s, FillMode& out) {
    return kindFromText(parseFill(s), out);
}
Status fromText(const std::string& s, FlipMode& out) {
    return kindFromText(parseFlip(s), out);
}

struct AttrField {
    const char* key;
    bool (*has)(const NodeAttrs&);
    std::string (*print)(const NodeAttrs&);
    Status (*parse)(NodeAttrs&, const std::string&);
};

template <auto Member>
constexpr AttrField field(const char* key) {
    return AttrField{key, [](const NodeAttrs& a) { return (a.*Member).has_value(); },
                     [](const NodeAttrs& a) { return toText(*(a.*Member)); },
                     [](NodeAttrs& a, const std::string& text) {
                         typename std::remove_reference_t<decltype(a.*Member)>::value_type v{};
                         Status s = fromText(text, v);
                         if (s.ok()) a.*Member = v;
                         return s;
                     }};
}

constexpr AttrField kAttrFields[] = {
    field<&NodeAttrs::act>("act"),
    field<&NodeAttrs::alpha>("alpha"),
    field<&NodeAttrs::batchStats>("batch_stats"),
    field<&NodeAttrs::biasGrad>("bias_grad"),
    field<&NodeAttrs::box>("box"),
    field<&NodeAttrs::buf>("buf"),
    field<&NodeAttrs::byProducer>("by_producer"),
    field<&NodeAttrs::dilation>("dilation"),
    field<&NodeAttrs::dynamicScale>("dynamic_scale"),
    field<&NodeAttrs::epsilon>("epsilon"),
    field<&NodeAttrs::factorHi>("factor_hi"),
    field<&NodeAttrs::factorLo>("factor_lo"),
    field<&NodeAttrs::fill>("fill"),
    field<&NodeAttrs::fillValue>("fill_value"),
    field<&NodeAttrs::flip>("flip"),
    field<&NodeAttrs::groups>("groups"),
    field<&NodeAttrs::hasBeta>("has_beta"),
    field<&NodeAttrs::hasBias>("has_bias"),
    field<&NodeAttrs::hasGamma>("has_gamma"),
    field<&NodeAttrs::interp>("interp"),
    field<&NodeAttrs::k>("k"),
    field<&NodeAttrs::l1>("l1"),
    field<&NodeAttrs::l2>("l2"),
    field<&NodeAttrs::loss>("loss"),
    field<&NodeAttrs::metric>("metric"),
    field<&NodeAttrs::momentum>("momentum"),
    field<&NodeAttrs::name>("name"),
    field<&NodeAttrs::off>("off"),
    field<&NodeAttrs::offset>("offset"),
    field<&NodeAttrs::onLogits>("on_logits"),
    field<&NodeAttrs::pads>("pads"),
    field<&NodeAttrs::rate>("rate"),
    field<&NodeAttrs::scale>("scale"),
    field<&NodeAttrs::seed>("seed"),
    field<&NodeAttrs::strides>("strides"),
    field<&NodeAttrs::trainable>("trainable"),
    field<&NodeAttrs::transA>("trans_a"),
    field<&NodeAttrs::transB>("trans_b"),
    field<&NodeAttrs::usesOutput>("uses_output"),
    field<&NodeAttrs::valueHi>("value_hi"),
    field<&NodeAttrs::valueLo>("value_lo"),
    field<&NodeAttrs::widthHi>("width_hi"),
    field<&NodeAttrs::widthLo>("width_lo"),
    field<&NodeAttrs::window>("window"),
};

const AttrField* findAttr(const std::string& key) {
    for (const AttrField& f : kAttrFields)
        if (key == f.key) return &f;
    return nullptr;
}
}  // namespace

std::string printGraph(const Graph& g) {
    std::ostringstream os;
    os << "graph " << g.name << " {\n";
    for (const auto& n : g.nodes) {
        os << "  %" << n.id << " = " << opName(n.op) << "(";
        for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", %" : "%") << n.inputs[i];
        os << ")";
        bool first = true;
        for (const AttrField& f : kAttrFields) {
            if (!f.has(n.attrs)) continue;
            const std::string v = f.print(n.attrs);
            os << (first ? " {" : ", ") << f.key << "=";
            if (needsQuotes(v))
                os << '"' << v << '"';
            else
                os << v;
            first = false;
        }
        if (!first) os << "}";
        os << " : " << dtypeName(n.dtype) << shapeToString(n.shape) << "\n";
    }
    for (const auto& [name, id] : g.outputs) os << "  output " << name << " = %" << id << "\n";
    for (const auto& [p, gr] : g.grads) os << "  grad %" << p << " = %" << gr << "\n";
    os << "}\n";
    return os.str();
}

namespace {
class Lexer {
  public:
    explicit Lexer(const std::string& s) : s_(s) {}
    // Skips blanks and '#' comments (to the end of the line).
    void skipWs() {
        while (i_ < s_.size()) {
            if (s_[i_] == '#') {
                while (i_ < s_.size() && s_[i_] != '\n') ++i_;
            } else if (std::isspace(static_cast<unsigned char>(s_[i_]))) {
                if (s_[i_] == '\n') ++line_;
                ++i_;
            } else {
                break;
            }
        }
    }
    bool eat(char c) {
        skipWs();
        if (i_ < s_.size() && s_[i_] == c) {
            ++i_;
            return true;
        }
        return false;
    }
    bool peek(char c) {
        skipWs();
        return i_ < s_.size() && s_[i_] == c;
    }
    std::string word() {
        skipWs();
        size_t b = i_;
        while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) ||
                                  s_[i_] == '_' || s_[i_] == '.' || s_[i_] == '-' || s_[i_] == '+'))
            ++i_;
        return s_.substr(b, i_ - b);
    }
    Result<std::string> quoted() {
        skipWs();
        if (i_ >= s_.size() || s_[i_] != '"') return fail("expected '\"'");
        size_t b = ++i_;
        while (i_ < s_.size() && s_[i_] != '"') ++i_;
        if (i_ >= s_.size()) return fail("unterminated string");
        return s_.substr(b, i_++ - b);
    }
    Result<int> ref() {
        if (!eat('%')) return fail("expected a value reference like %3");
        std::string w = word();
        if (w.empty() || !std::isdigit(static_cast<unsigned char>(w[0])))
            return fail("expected a value number after '%'");
        return std::atoi(w.c_str());
    }
    Error fail(const std::string& what) const {
        return err("IR line " + std::to_string(line_) + ": " + what);
    }
    bool atEnd() {
        skipWs();
        return i_ >= s_.size();
    }

  private:
    const std::string& s_;
    size_t i_ = 0;
    int line_ = 1;
};

Result<std::pair<DType, Shape>> parseType(Lexer& lx) {
    std::string dt = lx.word();
    auto d = parseDType(dt);
    if (!d.ok()) return lx.fail(d.error());
    Shape shape;
    if (!lx.eat('[')) return lx.fail("expected '[' after dtype");
    if (!lx.eat(']')) {
        do {
            std::string w = lx.word();
            if (w.empty()) return lx.fail("expected a dimension");
            shape.push_back(std::atoll(w.c_str()));
        } while (lx.eat(','));
        if (!lx.eat(']')) return lx.fail("expected ']'");
    }
    return std::make_pair(*d, shape);
}
}  // namespace

Result<Graph> parseGraph(const std::string& text) {
    Lexer lx(text);
    Graph g;
    if (lx.word() != "graph") return lx.fail("expected 'graph NAME {'");
    g.name = lx.word();
    if (!lx.eat('{')) return lx.fail("expected '{'");
    while (!lx.eat('}')) {
        if (lx.atEnd()) return lx.fail("unexpected end of text, expected '}'");
        if (lx.peek('%')) {
            TD_ASSIGN_OR_RETURN(int id, lx.ref());
            if (id != static_cast<int>(g.nodes.size()))
                return lx.fail("expected %" + std::to_string(g.nodes.size()) + ", got %" +
                               std::to_string(id) + " (values are numbered in order)");
            if (!lx.eat('=')) return lx.fail("expected '='");
            std::string opn = lx.word();
            auto op = parseOp(opn);
            if (!op.ok()) return lx.fail(op.error());
            if (!lx.eat('(')) return lx.fail("expected '('");
            std::vector<int> ins;
            if (!lx.eat(')')) {
                do {
                    TD_ASSIGN_OR_RETURN(int r, lx.ref());
                    ins.push_back(r);
                } while (lx.eat(','));
                if (!lx.eat(')')) return lx.fail("expected ')'");
            }
            NodeAttrs attrs;
            const std::string where = "%" + std::to_string(id) + " = " + opName(*op) + ": ";
            if (lx.eat('{')) {
                if (!lx.eat('}')) {
                    std::vector<const AttrField*> seen;
                    do {
                        std::string k = lx.word();
                        if (k.empty()) return lx.fail(where + "expected an attribute name");
                        if (!lx.eat('=')) return lx.fail(where + "expected '=' after " + k);
                        std::string v;
                        if (lx.peek('"')) {
                            TD_ASSIGN_OR_RETURN(v, lx.quoted());
                        } else {
                            v = lx.word();
                        }
                        const AttrField* f = findAttr(k);
                        if (!f) return lx.fail(where + "unknown attribute '" + k + "'");
                        if (std::find(seen.begin(), seen.end(), f) != seen.end())
                            return lx.fail(where + "attribute " + k + " given twice");
                        seen.push_back(f);
                        Status ps = f->parse(attrs, v);
                        if (!ps.ok()) return lx.fail(where + "attribute " + k + ": " + ps.error());
                    } while (lx.eat(','));
                    if (!lx.eat('}')) return lx.fail("expected '}'");
                }
            }
            if (!lx.eat(':')) return lx.fail("expected ': TYPE'");
            TD_ASSIGN_OR_RETURN(auto type, parseType(lx));
            g.add(*op, ins, type.first, type.second, std::move(attrs));
        } else {
            std::string kw = lx.word();
            if (kw == "output") {
                std::string name = lx.word();
                if (!lx.eat('=')) return lx.fail("expected '='");
                TD_ASSIGN_OR_RETURN(int r, lx.ref());
                g.outputs.emplace_back(name, r);
            } else if (kw == "grad") {
                TD_ASSIGN_OR_RETURN(int p, lx.ref());
                if (!lx.eat('=')) return lx.fail("expected '='");
                TD_ASSIGN_OR_RETURN(int r, lx.ref());
                g.grads[p] = r;
            } else {
                return lx.fail("expected a node, 'output' or 'grad', got '" + kw + "'");
            }
        }
    }
    TD_RETURN_IF_ERROR(verifyGraph(g));
    return g;
}

// ---- verifier
// ------------------------------------------------------------------------------------

namespace {

bool sizes(const std::optional<std::vector<int64_t>>& v, size_t n, int64_t min) {
    if (!v) return true;
    if (v->size() != n) return false;
    for (int64_t x : *v)
        if (x < min) return false;
    return true;
}

// Shape rules of the convolutional and normalization ops ("" when the node is consistent).
std::string verifyImageOp(const Graph& g, const Node& nd) {
    auto in = [&](size_t j) -> const Node& { return g.node(nd.inputs[j]); };
    const NodeAttrs& a = nd.attrs;
    if (!sizes(a.strides, 2, 1)) return "strides must be two sizes >= 1";
    if (!sizes(a.dilation, 2, 1)) return "dilation must be two sizes >= 1";
    if (!sizes(a.pads, 4, 0)) return "pads must be four sizes >= 0 (top, bottom, left, right)";
    if (!sizes(a.window, 2, 1)) return "window must be two sizes >= 1";
    switch (nd.op) {
        case Op::Conv2D:
        case Op::Conv2DGradInput:
        case Op::Conv2DGradFilter:
        case Op::MaxPool:
        case Op::AvgPool:
        case Op::MaxPoolGrad:
        case Op::AvgPoolGrad:
        case Op::Pad2D:
        case Op::Pad2DGrad: {
            auto geo = convGeometry(g, nd);
            if (!geo.ok()) return geo.error();
            const ConvShapes s = convShapes(g, nd);
            const Shape& y = *s.y;
            const bool conv = s.kernel != nullptr;
            if (conv && y.size() != 4)
                return "expects an image [B,H,W,C] and a kernel [KH,KW,C/groups,F]";
            if (nd.op == Op::MaxPoolGrad && in(1).shape != *s.x) return "x differs from the result";
            const Shape want{geo->B, geo->OH, geo->OW, geo->F};
            if (y != want)
                return (conv                                           ? "output shape "
                        : nd.op == Op::Pad2D || nd.op == Op::Pad2DGrad ? "padded shape "
                                                                       : "pooled shape ") +
                       shapeToString(y) + ", expected " + shapeToString(want);
            if (nd.op == Op::Conv2D && nd.inputs.size() == 3 && in(2).shape != Shape{geo->F})
                return "bias shape " + shapeToString(in(2).shape) + ", expected [" +
                       std::to_string(geo->F) + "]";
            // A convolution reads its two operands in one dtype and writes it or f32, as a
            // matrix product does; its bias is f32.
            if (conv && in(0).dtype != in(1).dtype)
                return std::string("operands in ") + dtypeName(in(0).dtype) + " and " +
                       dtypeName(in(1).dtype) + " (cast one)";
            if (conv && nd.dtype != in(0).dtype && nd.dtype != DType::F32)
                return std::string("result in ") + dtypeName(nd.dtype) + " from " +
                       dtypeName(in(0).dtype) + " operands (expected " + dtypeName(in(0).dtype) +
                       " or f32)";
            if (nd.op == Op::Conv2D && nd.inputs.size() == 3 && in(2).dtype != DType::F32)
                return std::string("bias in ") + dtypeName(in(2).dtype) + ", expected f32";
            return {};
        }
        case Op::Scale:
            if (nd.shape != in(0).shape) return "result shape differs from input";
            return {};
        case Op::ChannelMean:
        case Op::ChannelVar:
            if (in(0).shape.size() < 2 || nd.shape != Shape{in(0).shape.back()})
                return "expects [B,...,C] -> [C]";
            if (nd.op == Op::ChannelVar && in(1).shape != nd.shape) return "mean is not [C]";
            return {};
        case Op::MovingAvg:
            if (in(0).op != Op::Param) return "updates a param, not %" + std::to_string(in(0).id);
            if (in(0).attrs.trainableOr()) return "updates a trainable param";
            if (in(1).shape != in(0).shape || nd.shape != in(0).shape)
                return "statistic shape " + shapeToString(in(1).shape) + " differs from the param";
            if (!a.momentum) return "missing attribute momentum";
            return {};
        case Op::BatchNorm:
        case Op::BatchNormGrad:
        case Op::NormGammaGrad: {
            const bool grad = nd.op != Op::BatchNorm;
            const Shape& x = in(grad ? 1 : 0).shape;
            if (x.size() < 2) return "expects [B,...,C]";
            const Shape c{x.back()};
            const size_t stats = grad ? 2 : 1;
            if (in(stats).shape != c || in(stats + 1).shape != c)
                return "mean and variance must be " + shapeToString(c);
            size_t k = stats + 2;
            const bool gamma = nd.op != Op::NormGammaGrad && a.hasGamma.value_or(false);
            const bool beta = nd.op == Op::BatchNorm && a.hasBeta.value_or(false);
            if (nd.inputs.size() != k + gamma + beta)
                return "operands do not match has_gamma / has_beta";
            for (; k < nd.inputs.size(); ++k)
                if (in(k).shape != c) return "gamma and beta must be " + shapeToString(c);
            const Shape want = nd.op == Op::NormGammaGrad ? c : x;
            if (nd.shape != want) return "result shape must be " + shapeToString(want);
            if (grad && in(0).shape != x) return "dy differs from x";
            return {};
        }
        case Op::LayerNorm:
        case Op::LayerNormGrad:
        case Op::LayerNormGammaGrad: {
            const bool grad = nd.op != Op::LayerNorm;
            const Shape& x = in(grad ? 1 : 0).shape;
            if (x.size() < 2) return "expects [B,...,C]";
            const Shape c{x.back()};
            const bool gamma = nd.op != Op::LayerNormGammaGrad && a.hasGamma.value_or(false);
            const bool beta = nd.op == Op::LayerNorm && a.hasBeta.value_or(false);
            const size_t first = grad ? 2 : 1;
            if (nd.inputs.size() != first + gamma + beta)
                return "operands do not match has_gamma / has_beta";
            for (size_t k = first; k < nd.inputs.size(); ++k)
                if (in(k).shape != c) return "gamma and beta must be " + shapeToString(c);
            const Shape want = nd.op == Op::LayerNormGammaGrad ? c : x;
            if (nd.shape != want) return "result shape must be " + shapeToString(want);
            if (grad && in(0).shape != x) return "dy differs from x";
            return {};
        }
        default:
            if (hasAugmentSpec(nd.op)) {
                auto spec = augmentSpec(g, nd);
                if (!spec.ok()) return spec.error();
            }
            return {};
    }
}

}  // namespace

Status verifyGraph(const Graph& g) {
    const int n = static_cast<int>(g.nodes.size());
    auto where = [&](const Node& nd) {
        return "%" + std::to_string(nd.id) + " = " + opName(nd.op) + ": ";
    };
    for (int i = 0; i < n; ++i) {
        const Node& nd = g.nodes[static_cast<size_t>(i)];
        if (nd.id != i)
            return err("node at position " + std::to_string(i) + " has id " +
                       std::to_string(nd.id));
        const OpEntry& e = entry(nd.op);
        int k = static_cast<int>(nd.inputs.size());
        if (k < e.minInputs || k > e.maxInputs)
            return err(where(nd) + "takes " + std::to_string(e.minInputs) + ".." +
                       std::to_string(e.maxInputs) + " operands, got " + std::to_string(k));
        for (int in : nd.inputs)
            if (in < 0 || in >= i)
                return err(where(nd) + "operand %" + std::to_string(in) +
                           " is not defined before it");
        auto in = [&](int j) -> const Node& { return g.node(nd.inputs[static_cast<size_t>(j)]); };
        auto mismatch = [&](const std::string& what) { return err(where(nd) + what); };
        // The kernel-selecting attributes have no default.
        if ((nd.op == Op::Act || nd.op == Op::ActGrad) && !nd.attrs.act)
            return mismatch("missing attribute act");
        if ((nd.op == Op::Loss || nd.op == Op::LossGrad) && !nd.attrs.loss)
            return mismatch("missing attribute loss");
        if (nd.op == Op::Metric && !nd.attrs.metric) return mismatch("missing attribute metric");
        switch (nd.op) {
            case Op::Reshape:
                if (numElements(in(0).shape) != numElements(nd.shape))
                    return mismatch("cannot reshape " + shapeToString(in(0).shape) + " into " +
                                    shapeToString(nd.shape));
                break;
            case Op::MatMul:
            case Op::Dense: {
                const Shape& a = in(0).shape;
                const Shape& b = in(1).shape;
                if (a.size() != 2 || b.size() != 2) return mismatch("operands must be rank 2");
                const bool ta = nd.attrs.transA.value_or(false);
                const bool tb = nd.attrs.transB.value_or(false);
                int64_t m = ta ? a[1] : a[0], ka = ta ? a[0] : a[1];
                int64_t kb = tb ? b[1] : b[0], nn = tb ? b[0] : b[1];
                if (ka != kb)
                    return mismatch("inner dimensions differ: " + shapeToString(a) + " x " +
                                    shapeToString(b));
                if (nd.shape != Shape{m, nn})
                    return mismatch("result shape " + shapeToString(nd.shape) + ", expected " +
                                    shapeToString({m, nn}));
                if (nd.op == Op::Dense && k == 3 && in(2).shape != Shape{nn})
                    return mismatch("bias shape " + shapeToString(in(2).shape) +
                                    " does not match " + shapeToString(nd.shape));
                // A matrix product reads both operands in one dtype and writes it or f32.
                if (in(0).dtype != in(1).dtype)
                    return mismatch(std::string("operands in ") + dtypeName(in(0).dtype) + " and " +
                                    dtypeName(in(1).dtype) + " (cast one)");
                if (nd.dtype != in(0).dtype && nd.dtype != DType::F32)
                    return mismatch(std::string("result in ") + dtypeName(nd.dtype) + " from " +
                                    dtypeName(in(0).dtype) + " operands (expected " +
                                    dtypeName(in(0).dtype) + " or f32)");
                break;
            }
            case Op::BiasAdd:
                if (in(0).shape.size() < 2 || in(1).shape != Shape{in(0).shape.back()})
                    return mismatch("bias shape " + shapeToString(in(1).shape) +
                                    " does not match " + shapeToString(in(0).shape));
                if (nd.shape != in(0).shape) return mismatch("result shape differs from input");
                break;
            case Op::Act:
            case Op::Dropout:
            case Op::DropoutGrad:
            case Op::Cast:
                if (nd.shape != in(0).shape) return mismatch("result shape differs from input");
                break;
            case Op::ActGrad:
            case Op::Add:
            case Op::RegGrad:
                if (in(0).shape != in(1).shape || nd.shape != in(0).shape)
                    return mismatch("operand shapes differ: " + shapeToString(in(0).shape) +
                                    " and " + shapeToString(in(1).shape));
                break;
            case Op::BiasGrad:
                if (in(0).shape.size() < 2 || nd.shape != Shape{in(0).shape.back()})
                    return mismatch("expects [B,...,N] -> [N]");
                if (nd.attrs.byProducer.value_or(false) &&
                    (in(0).op != Op::ActGrad || !in(0).attrs.biasGrad.value_or(false)))
                    return mismatch("by_producer needs an act_grad operand with bias_grad=1");
                break;
            case Op::Loss:
            case Op::Metric:
            case Op::RegLoss:
                if (nd.shape != Shape{1}) return mismatch("result must be a scalar [1]");
                break;
            case Op::LossGrad:
                if (nd.shape != in(0).shape) return mismatch("result shape differs from pred");
                break;
            default: {
                const std::string why = verifyImageOp(g, nd);
                if (!why.empty()) return mismatch(why);
                break;
            }
        }
    }
    for (const auto& [name, id] : g.outputs)
        if (id < 0 || id >= n) return err("output " + name + " refers to a missing value");
    for (const auto& [p, gr] : g.grads) {
        if (p < 0 || p >= n || g.node(p).op != Op::Param)
            return err("grad binding %" + std::to_string(p) + " is not a param");
        if (gr < 0 || gr >= n) return err("grad of %" + std::to_string(p) + " is missing");
        if (g.node(gr).shape != g.node(p).shape)
            return err("grad %" + std::to_string(gr) + " shape " + shapeToString(g.node(gr).shape) +
                       " differs from param %" + std::to_string(p) + " " +
                       shapeToString(g.node(p).shape));
    }
    return Status::success();
}

}  // namespace td
