// The interface between engine/io/keras_weights_h5.cpp and libtraindeck_h5.so (h5_module.cpp),
// the only code that links HDF5. Plain standard-library types only: the module holds no engine
// code, and both sides are built together (kAbiVersion guards against a stray older module).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace td::h5abi {

constexpr uint32_t kAbiVersion = 1;

// One variable to write: f32 values, row-major, shape.size() == 0 for a scalar.
struct VarView {
    std::vector<int64_t> shape;
    const float* values = nullptr;
};

// A group to write: "<path>/vars" with a "name" attribute and datasets "0", "1", ...
struct GroupView {
    std::string path;  // "layers/dense" ("" = the model's own group)
    std::string name;
    std::vector<VarView> vars;
};

// Called by read() for each variable of each vars group, in index order: returns where to store
// the shape's f32 values, or nullptr with *error set to refuse it (e.g. over the memory budget).
// `path` is the group ("" or "layers/<name>"), `what` names the variable for messages.
using AllocateFn = float* (*)(void* ctx, const std::string& path, const std::string& what,
                              const std::vector<int64_t>& shape, std::string* error);

struct Api {
    uint32_t abiVersion;
    // The bytes of an HDF5 file holding `groups`. False with *error on failure.
    bool (*write)(const std::vector<GroupView>& groups, std::string* bytes, std::string* error);
    // Reads "/vars" and every "/layers/<name>/vars" of the HDF5 file in `bytes`; `what` names
    // the file in errors. Every group found is announced with allocate() for each variable (a
    // group with no variables calls announceGroup). False with *error on failure.
    bool (*read)(const std::string& bytes, const std::string& what, AllocateFn allocate,
                 void (*announceGroup)(void* ctx, const std::string& path), void* ctx,
                 std::string* error);
};

}  // namespace td::h5abi

// The module's one export.
extern "C" const td::h5abi::Api* traindeck_h5_api();
