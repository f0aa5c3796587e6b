// model.weights.h5 of a Keras 3 `.keras` archive, through the HDF5 C library, in memory.
//
// Layout (Keras 3 saving_lib's H5IOStore): a group per saveable at its path, each with a "vars"
// group holding the variables as datasets "0", "1", ... in the layer's variable order, and a
// "name" attribute on "vars". The model's own group is "/vars"; a Sequential model's layers
// (the InputLayer excluded) are "/layers/<snake_case class name>[_<n>]" with n counting earlier
// layers of the same class: "layers/dense/vars/0" is the first Dense layer's kernel.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/core/result.h"
#include "engine/core/tensor.h"

namespace td {

struct H5Group {
    std::string path;          // "layers/dense" ("" = the model's own group)
    std::string name;          // the "name" attribute of its vars group
    std::vector<Tensor> vars;  // f32
};

// The bytes of an HDF5 file holding these groups (each with its vars group, even when empty).
Result<std::string> kerasWeightsH5Bytes(const std::vector<H5Group>& groups);

// Reads every "<path>/vars" group under "/layers" (and "/vars") of an HDF5 file held in memory:
// path -> variables in index order, read as f32 (any floating-point type HDF5 can convert).
// `what` names the file in errors: "m.keras: model.weights.h5: not an HDF5 file or damaged".
Result<std::map<std::string, std::vector<Tensor>>> readKerasWeightsH5(const std::string& bytes,
                                                                      const std::string& what);

}  // namespace td
