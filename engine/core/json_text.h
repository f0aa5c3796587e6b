// Checks on JSON text made before it is parsed, for every JSON document TrainDeck reads (project
// files, a .keras archive's config and metadata, the documents in a run store): a value nested
// deeper than kMaxJsonDepth, which the JSON library would copy and destroy recursively until the
// stack runs out, and a number too large for a double (1e999), which the library reports without
// saying where. Both are found with the field path of the value, so the error names it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace td {

// Far deeper than any project or Keras config (about 8 levels), far shallower than the stack.
constexpr int kMaxJsonDepth = 256;

struct JsonTextProblem {
    std::string path;     // "training.optimizer.config.learning_rate", "description[0][0]..."
    std::string message;  // "the number 1e999 is out of range ..."; empty: no problem
    size_t offset = 0;    // byte offset of the value
    explicit operator bool() const { return !message.empty(); }
};

// The first value nested deeper than maxDepth, or the first number whose magnitude is too large
// for a double. Text that is not valid JSON is not judged here (the parser says what is wrong);
// the scan never reads past the text and costs one pass.
JsonTextProblem jsonTextProblem(std::string_view text, int maxDepth = kMaxJsonDepth);

// The 1-based line and column of byte `offset` of `text`.
std::pair<size_t, size_t> textLineColumn(std::string_view text, size_t offset);

// "<path>: <message>" or "<message>" when the path is empty; "" when there is no problem.
std::string describeJsonTextProblem(const JsonTextProblem& p);

}  // namespace td
