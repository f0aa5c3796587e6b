// Name matching shared by every parser of Keras names: "SparseCategoricalCrossentropy",
// "sparse_categorical_crossentropy" and "Sparse-Categorical-Crossentropy" are the same name.
#pragma once

#include <cctype>
#include <string>

namespace td {

// Lower case without '_', '-' and ' ': the key two spellings of one Keras name share.
inline std::string squashName(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        if (c == '_' || c == '-' || c == ' ') continue;
        out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    return out;
}

}  // namespace td
