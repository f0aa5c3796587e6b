// Internal helpers shared by optimizer.cpp, schedule.cpp and callbacks.cpp (not a public API).
#pragma once

#include <cctype>
#include <charconv>
#include <string>

namespace td::optim_detail {

// "Exponential_Decay", "exponential-decay" and "ExponentialDecay" all become "exponentialdecay",
// so Keras class names and snake_case names are both accepted.
inline std::string normalizeName(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        if (c == '_' || c == '-' || c == ' ') continue;
        out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    return out;
}

// Shortest text that reads back to the same double ("0.1", "2", "1e-07", "inf", "nan").
inline std::string fmt(double v) {
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, res.ptr);
}

// The same for the float the optimizer will actually use ("0.0001" rather than
// "0.00010000000000000002").
inline std::string fmtFloat(double v) {
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, static_cast<float>(v));
    return std::string(buf, res.ptr);
}

}  // namespace td::optim_detail
