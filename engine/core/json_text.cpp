#include "engine/core/json_text.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace td {

namespace {

// One open array or object on the way to the current value.
struct Frame {
    bool object = false;
    bool expectKey = false;  // objects: the next string is a key
    std::string key;         // objects: the current member's key
    size_t index = 0;        // arrays: the current element
};

// The path of the value the frames lead to, as the project parser writes it ("a.b[2].c"); at most
// `parts` components, then "...".
std::string pathOf(const std::vector<Frame>& frames, size_t parts = 12) {
    std::string out;
    size_t n = 0;
    for (const Frame& f : frames) {
        if (++n > parts) return out + "...";
        if (f.object) {
            if (!out.empty()) out += '.';
            out += f.key;
        } else {
            out += '[' + std::to_string(f.index) + ']';
        }
    }
    return out;
}

std::string where(std::string_view text, size_t offset) {
    auto [line, column] = textLineColumn(text, offset);
    return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

}  // namespace

std::pair<size_t, size_t> textLineColumn(std::string_view text, size_t offset) {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < offset && i < text.size(); ++i) {
        if (text[i] == '\n') {
            ++line;
            column = 1;
        } else {
            ++column;
        }
    }
    return {line, column};
}

JsonTextProblem jsonTextProblem(std::string_view text, int maxDepth) {
    std::vector<Frame> frames;
    size_t i = 0;
    const size_t n = text.size();
    while (i < n) {
        const char c = text[i];
        if (c == '"') {
            const size_t start = ++i;
            while (i < n && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
            if (!frames.empty() && frames.back().object && frames.back().expectKey) {
                frames.back().key = std::string(text.substr(start, std::min(i, n) - start));
                frames.back().expectKey = false;
            }
            ++i;
        } else if (c == '[' || c == '{') {
            if (static_cast<int>(frames.size()) >= maxDepth) {
                JsonTextProblem p;
                p.path = pathOf(frames);
                p.offset = i;
                p.message = "nested deeper than " + std::to_string(maxDepth) +
                            " levels of arrays and objects (at " + where(text, i) +
                            "); TrainDeck reads JSON nested at most " + std::to_string(maxDepth) +
                            " deep";
                return p;
            }
            Frame f;
            f.object = c == '{';
            f.expectKey = f.object;
            frames.push_back(std::move(f));
            ++i;
        } else if (c == ']' || c == '}') {
            if (!frames.empty()) frames.pop_back();
            ++i;
        } else if (c == ',') {
            if (!frames.empty()) {
                Frame& f = frames.back();
                if (f.object)
                    f.expectKey = true;
                else
                    ++f.index;
            }
            ++i;
        } else if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
            const size_t start = i;
            while (i < n && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '-' ||
                             text[i] == '+' || text[i] == '.' || text[i] == 'e' || text[i] == 'E'))
                ++i;
            const std::string number(text.substr(start, i - start));
            // Only numbers with a fraction or an exponent become doubles; integers too large for
            // 64 bits become doubles as well, and so are judged the same way.
            const double v = std::strtod(number.c_str(), nullptr);
            if (std::isinf(v)) {
                JsonTextProblem p;
                p.path = pathOf(frames);
                p.offset = start;
                p.message = "the number " +
                            (number.size() > 40 ? number.substr(0, 40) + "..." : number) +
                            " is out of range (at " + where(text, start) +
                            "); numbers must lie within +-1.8e308";
                return p;
            }
        } else {
            ++i;
        }
    }
    return {};
}

std::string describeJsonTextProblem(const JsonTextProblem& p) {
    if (!p) return {};
    return p.path.empty() ? p.message : p.path + ": " + p.message;
}

}  // namespace td
