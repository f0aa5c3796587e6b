// Typed, path-aware JSON field readers shared by the project and Keras JSON parsers.
#include "engine/io/json_fields.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "engine/core/json_text.h"

namespace td::jsonio {

void fail(const std::string& path, const std::string& message) {
    throw FieldError{path, message};
}

std::string formatError(const std::string& prefix, const FieldError& e) {
    std::string out = prefix;
    if (!e.path.empty()) out += (out.empty() ? "" : ": ") + e.path;
    if (!e.message.empty()) out += (out.empty() ? "" : ": ") + e.message;
    return out;
}

namespace {

// "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error while parsing
// value - invalid literal; last read: 'x'" -> "syntax error while parsing value - invalid
// literal; last read: 'x'".
std::string parseReason(const std::string& what) {
    size_t pos = what.find("parse error");
    if (pos == std::string::npos) return what;
    size_t colon = what.find(": ", pos);
    if (colon == std::string::npos) return what;
    return what.substr(colon + 2);
}

size_t editDistance(const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
        }
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

std::string numberText(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

bool integral(const Json& v, int64_t& out) {
    if (v.is_number_integer()) {
        if (v.is_number_unsigned() &&
            v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            return false;
        out = v.get<int64_t>();
        return true;
    }
    if (v.is_number_float()) {
        double d = v.get<double>();
        if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e15) {
            out = static_cast<int64_t>(d);
            return true;
        }
    }
    return false;
}

}  // namespace

Json parseText(const std::string& text, const std::string& path) {
    // Too deep a value or too large a number, with the field it is in, before the parser sees it.
    if (const JsonTextProblem p = jsonTextProblem(text))
        fail(path.empty() ? p.path : p.path.empty() ? path : child(path, p.path), p.message);
    try {
        return Json::parse(text);
    } catch (const Json::parse_error& e) {
        // nlohmann reports the count of bytes read (1-based position of the offending one).
        auto [line, column] = textLineColumn(text, e.byte == 0 ? 0 : e.byte - 1);
        fail(path, "invalid JSON at line " + std::to_string(line) + ", column " +
                       std::to_string(column) + ": " + parseReason(e.what()));
    }
}

std::string child(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
}

std::string child(const std::string& path, size_t index) {
    return path + "[" + std::to_string(index) + "]";
}

std::string describe(const Json& v) {
    switch (v.type()) {
        case Json::value_t::object:
            return "an object";
        case Json::value_t::array:
            return "an array";
        case Json::value_t::null:
            return "null";
        default:
            return v.dump();
    }
}

const Json* member(const Json& obj, const char* key) {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
}

namespace {

void prettyInto(const Json& v, int indent, std::string& out) {
    const std::string pad(static_cast<size_t>(indent) + 2, ' ');
    const std::string closePad(static_cast<size_t>(indent), ' ');
    if (v.is_object()) {
        if (v.empty()) {
            out += "{}";
            return;
        }
        out += "{\n";
        size_t i = 0;
        for (auto it = v.begin(); it != v.end(); ++it, ++i) {
            out += pad + Json(it.key()).dump() + ": ";
            prettyInto(*it, indent + 2, out);
            out += i + 1 < v.size() ? ",\n" : "\n";
        }
        out += closePad + "}";
    } else if (v.is_array()) {
        bool scalars = true;
        for (const auto& e : v) scalars = scalars && !e.is_structured();
        if (v.empty() || scalars) {
            out += "[";
            for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i].dump();
            out += "]";
            return;
        }
        out += "[\n";
        for (size_t i = 0; i < v.size(); ++i) {
            out += pad;
            prettyInto(v[i], indent + 2, out);
            out += i + 1 < v.size() ? ",\n" : "\n";
        }
        out += closePad + "]";
    } else {
        out += v.dump();
    }
}

}  // namespace

std::string prettyJson(const Json& v) {
    std::string out;
    prettyInto(v, 0, out);
    return out;
}

std::string squote(const std::string& s) {
    return "'" + s + "'";
}

std::string joinQuoted(const std::vector<std::string>& items) {
    std::string out;
    for (const auto& s : items) out += (out.empty() ? "" : ", ") + Json(s).dump();
    return out;
}

std::string joinPlain(const std::vector<std::string>& items) {
    std::string out;
    for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
    return out;
}

void checkKeys(const Json& obj, const std::string& path, const std::vector<std::string>& valid) {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
        const std::string& key = it.key();
        if (std::find(valid.begin(), valid.end(), key) != valid.end()) continue;
        std::string best;
        size_t bestDistance = 3;  // suggest only close matches
        for (const auto& v : valid) {
            size_t d = editDistance(key, v);
            if (d < bestDistance) {
                bestDistance = d;
                best = v;
            }
        }
        std::string msg = "unknown key " + squote(key);
        if (!best.empty()) msg += "; did you mean " + squote(best) + "?";
        msg += " (valid keys: " + joinPlain(valid) + ")";
        fail(path, msg);
    }
}

const Json& requireObject(const Json& v, const std::string& path) {
    if (!v.is_object()) fail(path, "expected an object, got " + describe(v));
    return v;
}

const Json& requireArray(const Json& v, const std::string& path) {
    if (!v.is_array()) fail(path, "expected an array, got " + describe(v));
    return v;
}

const Json& requireMember(const Json& obj, const std::string& path, const char* key) {
    const Json* m = member(obj, key);
    if (!m) fail(child(path, key), "missing (required)");
    return *m;
}

std::string getString(const Json& v, const std::string& path) {
    if (!v.is_string()) fail(path, "expected a string, got " + describe(v));
    return v.get<std::string>();
}

std::string getNonEmptyString(const Json& v, const std::string& path) {
    if (!v.is_string() || v.get<std::string>().empty())
        fail(path, "expected a non-empty string, got " + describe(v));
    return v.get<std::string>();
}

bool getBool(const Json& v, const std::string& path) {
    if (!v.is_boolean()) fail(path, "expected true or false, got " + describe(v));
    return v.get<bool>();
}

double getNumber(const Json& v, const std::string& path) {
    if (!v.is_number()) fail(path, "expected a number, got " + describe(v));
    return v.get<double>();
}

double getPositiveNumber(const Json& v, const std::string& path) {
    if (!v.is_number() || !(v.get<double>() > 0.0))
        fail(path, "expected a positive number, got " + describe(v));
    return v.get<double>();
}

double getNonNegativeNumber(const Json& v, const std::string& path) {
    if (!v.is_number() || !(v.get<double>() >= 0.0))
        fail(path, "expected a non-negative number, got " + describe(v));
    return v.get<double>();
}

double getNumberInRange(const Json& v, const std::string& path, double lo, double hi,
                        bool hiInclusive) {
    bool ok = v.is_number();
    if (ok) {
        double d = v.get<double>();
        ok = d >= lo && (hiInclusive ? d <= hi : d < hi);
    }
    if (!ok)
        fail(path, "expected a number in [" + numberText(lo) + ", " + numberText(hi) +
                       (hiInclusive ? "]" : ")") + ", got " + describe(v));
    return v.get<double>();
}

int64_t getInteger(const Json& v, const std::string& path) {
    int64_t out = 0;
    if (!integral(v, out)) fail(path, "expected an integer, got " + describe(v));
    return out;
}

int64_t getPositiveInteger(const Json& v, const std::string& path) {
    int64_t out = 0;
    if (!integral(v, out) || out <= 0)
        fail(path, "expected a positive integer, got " + describe(v));
    return out;
}

int64_t getNonNegativeInteger(const Json& v, const std::string& path) {
    int64_t out = 0;
    if (!integral(v, out) || out < 0)
        fail(path, "expected a non-negative integer, got " + describe(v));
    return out;
}

uint64_t getUnsigned(const Json& v, const std::string& path) {
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    int64_t out = 0;
    if (!integral(v, out) || out < 0)
        fail(path, "expected a non-negative integer, got " + describe(v));
    return static_cast<uint64_t>(out);
}

std::optional<uint64_t> getOptionalSeed(const Json& v, const std::string& path) {
    if (v.is_null()) return std::nullopt;
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    int64_t out = 0;
    if (!integral(v, out) || out < 0)
        fail(path, "expected null or a non-negative integer seed, got " + describe(v));
    return static_cast<uint64_t>(out);
}

std::optional<double> getOptionalPositive(const Json& v, const std::string& path) {
    if (v.is_null()) return std::nullopt;
    if (!v.is_number() || !(v.get<double>() > 0.0))
        fail(path, "expected null or a positive number, got " + describe(v));
    return v.get<double>();
}

std::string getOneOf(const Json& v, const std::string& path,
                     const std::vector<std::string>& valid) {
    if (v.is_string()) {
        const std::string s = v.get<std::string>();
        if (std::find(valid.begin(), valid.end(), s) != valid.end()) return s;
    }
    fail(path, "expected one of " + joinQuoted(valid) + ", got " + describe(v));
}

KerasRef readKerasRef(const Json& v, const std::string& path, const std::string& what) {
    KerasRef r;
    r.namePath = path;
    if (v.is_string()) {
        r.name = v.get<std::string>();
    } else if (v.is_object()) {
        checkKeys(v, path, {"class_name", "config", "module", "registered_name"});
        r.namePath = child(path, "class_name");
        r.name = getString(requireMember(v, path, "class_name"), r.namePath);
        r.config = member(v, "config");
        if (r.config && r.config->is_null()) r.config = nullptr;
        if (r.config) requireObject(*r.config, child(path, "config"));
    } else {
        fail(path, "expected " + what + " or {\"class_name\", \"config\"}, got " + describe(v));
    }
    return r;
}

}  // namespace td::jsonio
