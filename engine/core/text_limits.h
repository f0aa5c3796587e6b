// Limits on the free text a user can give (project name and description, run name, run notes):
// the store keeps every run's text, so an unbounded field grows it without bound, and a C string
// (SQLite text, a window title) silently ends at an embedded NUL. One check, used by every entry
// point that accepts such text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace td {

constexpr size_t kMaxNameChars = 200;                   // project name, run name (code points)
constexpr size_t kMaxLongTextBytes = size_t{64} << 10;  // description, notes: 64 KiB of UTF-8

// Byte offset of the first byte that does not start or continue a well-formed UTF-8 sequence
// (overlong forms, surrogates and code points above U+10FFFF count as ill-formed), or npos.
inline size_t invalidUtf8Offset(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        const auto c = static_cast<unsigned char>(s[i]);
        size_t len = 0;
        uint32_t cp = 0;
        if (c < 0x80) {
            ++i;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            cp = c & 0x07;
        } else {
            return i;
        }
        if (i + len > s.size()) return i;
        for (size_t k = 1; k < len; ++k) {
            const auto cc = static_cast<unsigned char>(s[i + k]);
            if ((cc & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (cc & 0x3F);
        }
        const bool overlong =
            (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
        if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += len;
    }
    return std::string_view::npos;
}

// Code points of well-formed UTF-8 text.
inline size_t utf8Length(std::string_view s) {
    size_t n = 0;
    for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    return n;
}

enum class TextKind {
    Name,      // one line, at most kMaxNameChars code points
    LongText,  // may span lines, at most kMaxLongTextBytes bytes
};

// "" when `value` is acceptable, else what is wrong with it, e.g. "is 250 characters long; at most
// 200 are allowed" or "contains a NUL character at byte 3". The caller prefixes the field.
inline std::string textProblem(std::string_view value, TextKind kind) {
    if (const size_t nul = value.find('\0'); nul != std::string_view::npos)
        return "contains a NUL character at byte " + std::to_string(nul) +
               " (text fields cannot hold NUL)";
    if (const size_t bad = invalidUtf8Offset(value); bad != std::string_view::npos)
        return "is not valid UTF-8 (byte " + std::to_string(bad) + ")";
    if (kind == TextKind::Name) {
        if (const size_t n = utf8Length(value); n > kMaxNameChars)
            return "is " + std::to_string(n) + " characters long; at most " +
                   std::to_string(kMaxNameChars) + " are allowed";
        if (value.find_first_of("\n\r") != std::string_view::npos)
            return "contains a line break (a name is one line)";
    } else if (value.size() > kMaxLongTextBytes) {
        return "is " + std::to_string(value.size()) + " bytes long; at most " +
               std::to_string(kMaxLongTextBytes) + " (64 KiB) are allowed";
    }
    return {};
}

// A stored run's name when none was given: its project's name and the run's id
// ("Fashion-MNIST MLP #12"), the project's name cut at a code point so the whole fits a Name.
inline std::string defaultRunName(std::string_view projectName, int64_t runId) {
    const std::string suffix = " #" + std::to_string(runId);
    std::string base(projectName.empty() ? std::string_view("run") : projectName);
    while (utf8Length(base) + suffix.size() > kMaxNameChars) {
        size_t cut = base.size() - 1;
        while (cut > 0 && (static_cast<unsigned char>(base[cut]) & 0xC0) == 0x80) --cut;
        base.resize(cut);
    }
    return base + suffix;
}

}  // namespace td
