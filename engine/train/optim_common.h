// Internal helpers shared by optimizer.cpp, schedule.cpp and callbacks.cpp (not a public API).
#pragma once

#include <cctype>
#include <charconv>
#include <string>

#include "engine/core/names.h"

namespace td::optim_detail {

using td::squashName;

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
