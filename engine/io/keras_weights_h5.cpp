// The engine's side of model.weights.h5: the HDF5 work itself runs in libtraindeck_h5.so
// (engine/io/h5/h5_module.cpp), loaded the first time a Keras file is read or written, so that
// no other run maps HDF5 and the libraries it brings.
#include "engine/io/keras_weights_h5.h"

#include <mutex>

#include "engine/core/module_loader.h"
#include "engine/data/resource_plan.h"
#include "engine/io/h5/h5_abi.h"

namespace td {

namespace {

Result<const h5abi::Api*> h5Api() {
    static std::once_flag once;
    static Result<const h5abi::Api*> api = err("unset");
    std::call_once(once, [] {
        auto sym =
            loadModuleSymbol("libtraindeck_h5.so", "TRAINDECK_H5_MODULE", "traindeck_h5_api");
        if (!sym.ok()) {
            api = err("reading or writing Keras weights (model.weights.h5) needs HDF5 through " +
                      sym.error());
            return;
        }
        const auto* a = reinterpret_cast<const h5abi::Api* (*)()>(*sym)();
        if (!a || a->abiVersion != h5abi::kAbiVersion)
            api = err("libtraindeck_h5.so is from another TrainDeck build (interface version " +
                      std::to_string(a ? a->abiVersion : 0) + ", expected " +
                      std::to_string(h5abi::kAbiVersion) + "): install them together");
        else
            api = a;
    });
    return api;
}

struct ReadTarget {
    std::map<std::string, std::vector<Tensor>> out;
};

void announce(void* ctx, const std::string& path) {
    static_cast<ReadTarget*>(ctx)->out[path];
}

float* allocate(void* ctx, const std::string& path, const std::string& what,
                const std::vector<int64_t>& shape, std::string* error) {
    const Shape s(shape.begin(), shape.end());
    double count = 1;
    for (int64_t d : shape) count *= double(d);
    Status fits = checkFileFits(what, "a variable of shape " + shapeToString(s), 4.0 * count);
    if (!fits.ok()) {
        *error = fits.error();
        return nullptr;
    }
    auto& vars = static_cast<ReadTarget*>(ctx)->out[path];
    vars.emplace_back(DType::F32, s);
    return vars.back().data<float>();
}

}  // namespace

Result<std::string> kerasWeightsH5Bytes(const std::vector<H5Group>& groups) {
    TD_ASSIGN_OR_RETURN(const h5abi::Api* api, h5Api());
    std::vector<h5abi::GroupView> views;
    views.reserve(groups.size());
    for (const H5Group& g : groups) {
        h5abi::GroupView v{g.path, g.name, {}};
        for (const Tensor& t : g.vars) {
            if (t.dtype() != DType::F32)
                return err("model.weights.h5: group '" + g.path + "': expected f32 variables");
            v.vars.push_back(
                {std::vector<int64_t>(t.shape().begin(), t.shape().end()), t.data<float>()});
        }
        views.push_back(std::move(v));
    }
    std::string bytes, error;
    if (!api->write(views, &bytes, &error)) return err(error);
    return bytes;
}

Result<std::map<std::string, std::vector<Tensor>>> readKerasWeightsH5(const std::string& bytes,
                                                                      const std::string& what) {
    TD_ASSIGN_OR_RETURN(const h5abi::Api* api, h5Api());
    ReadTarget target;
    std::string error;
    if (!api->read(bytes, what, &allocate, &announce, &target, &error)) return err(error);
    return std::move(target.out);
}

}  // namespace td
