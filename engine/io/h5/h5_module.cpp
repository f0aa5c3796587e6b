// libtraindeck_h5.so: model.weights.h5 of a Keras 3 `.keras` archive through the HDF5 C library,
// in memory (the layout: engine/io/keras_weights_h5.h). The only code that links HDF5; the engine
// loads it on first use through engine/io/keras_weights_h5.cpp (interface: h5_abi.h).
#include <hdf5.h>

#include <algorithm>
#include <memory>
#include <mutex>

#include "engine/io/h5/h5_abi.h"

namespace {

using td::h5abi::AllocateFn;
using td::h5abi::GroupView;

// The name HDF5 gives the in-memory file. The core driver may still look for a file of that name
// on disk (an open found one in the working folder), so it is a path no file can have.
constexpr const char* kMemoryFileName = "/dev/null/traindeck-in-memory.h5";

// Debian's serial HDF5 is not thread-safe: one call sequence at a time in this process.
std::mutex& h5Mutex() {
    static std::mutex mu;
    return mu;
}

// Silences HDF5's own error printing while alive (errors come back as values here).
class QuietH5 {
  public:
    QuietH5() {
        H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
        H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    }
    ~QuietH5() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
    QuietH5(const QuietH5&) = delete;
    QuietH5& operator=(const QuietH5&) = delete;

  private:
    H5E_auto2_t func_ = nullptr;
    void* data_ = nullptr;
};

// Closes an HDF5 identifier with its close function at scope exit.
class Id {
  public:
    Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
    ~Id() {
        if (id_ >= 0) close_(id_);
    }
    Id(const Id&) = delete;
    Id& operator=(const Id&) = delete;
    hid_t get() const { return id_; }
    bool ok() const { return id_ >= 0; }

  private:
    hid_t id_;
    herr_t (*close_)(hid_t);
};

// Creation properties for every group and dataset written: no modification times in their
// headers, so the same weights give the same file bytes.
hid_t untimed(hid_t cls) {
    const hid_t plist = H5Pcreate(cls);
    if (plist >= 0) H5Pset_obj_track_times(plist, false);
    return plist;
}

bool writeGroup(hid_t file, const GroupView& g, std::string* error) {
    auto fail = [error](std::string message) {
        *error = std::move(message);
        return false;
    };
    const std::string where = "HDF5 group '" + (g.path.empty() ? "/" : g.path) + "'";
    std::vector<std::unique_ptr<Id>> parents;
    hid_t parent = file;
    Id gcpl(untimed(H5P_GROUP_CREATE), H5Pclose);
    Id dcpl(untimed(H5P_DATASET_CREATE), H5Pclose);
    if (!gcpl.ok() || !dcpl.ok()) return fail(where + ": cannot set up its creation properties");
    // Intermediate groups ("layers") may exist already.
    size_t start = 0;
    while (!g.path.empty() && start <= g.path.size()) {
        const size_t slash = std::min(g.path.find('/', start), g.path.size());
        const std::string part = g.path.substr(start, slash - start);
        start = slash + 1;
        const bool exists = H5Lexists(parent, part.c_str(), H5P_DEFAULT) > 0;
        auto id = std::make_unique<Id>(
            exists ? H5Gopen2(parent, part.c_str(), H5P_DEFAULT)
                   : H5Gcreate2(parent, part.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT),
            H5Gclose);
        if (!id->ok()) return fail(where + ": cannot create '" + part + "'");
        parent = id->get();
        parents.push_back(std::move(id));
    }
    Id vars(H5Gcreate2(parent, "vars", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose);
    if (!vars.ok()) return fail(where + ": cannot create its vars group");
    {
        Id type(H5Tcopy(H5T_C_S1), H5Tclose);
        H5Tset_size(type.get(), H5T_VARIABLE);
        H5Tset_cset(type.get(), H5T_CSET_UTF8);
        Id space(H5Screate(H5S_SCALAR), H5Sclose);
        Id attr(H5Acreate2(vars.get(), "name", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                H5Aclose);
        const char* value = g.name.c_str();
        if (!attr.ok() || H5Awrite(attr.get(), type.get(), &value) < 0)
            return fail(where + ": cannot write its name attribute");
    }
    for (size_t i = 0; i < g.vars.size(); ++i) {
        const td::h5abi::VarView& t = g.vars[i];
        std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
        Id space(dims.empty()
                     ? H5Screate(H5S_SCALAR)
                     : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                 H5Sclose);
        const std::string name = std::to_string(i);
        Id ds(H5Dcreate2(vars.get(), name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                         dcpl.get(), H5P_DEFAULT),
              H5Dclose);
        if (!space.ok() || !ds.ok() ||
            H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.values) < 0)
            return fail(where + ": cannot write variable " + name);
    }
    return true;
}

// Child link names of a group, in name order.
std::vector<std::string> childNames(hid_t group) {
    std::vector<std::string> out;
    H5G_info_t info;
    if (H5Gget_info(group, &info) < 0) return out;
    for (hsize_t i = 0; i < info.nlinks; ++i) {
        const ssize_t n =
            H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
        if (n <= 0) continue;
        std::string name(static_cast<size_t>(n) + 1, '\0');
        H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(),
                           H5P_DEFAULT);
        name.resize(static_cast<size_t>(n));
        out.push_back(name);
    }
    return out;
}

bool isGroup(hid_t parent, const std::string& name) {
    if (H5Lexists(parent, name.c_str(), H5P_DEFAULT) <= 0) return false;
    H5O_info_t info;
    if (H5Oget_info_by_name(parent, name.c_str(), &info, H5P_DEFAULT) < 0) return false;
    return info.type == H5O_TYPE_GROUP;
}

std::string shapeText(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
    return out + "]";
}

struct ReadContext {
    AllocateFn allocate;
    void* ctx;
    std::string* error;
    bool fail(std::string message) const {
        *error = std::move(message);
        return false;
    }
};

bool readVars(hid_t vars, const std::string& path, const std::string& where,
              const ReadContext& rc) {
    const std::vector<std::string> names = childNames(vars);
    for (size_t i = 0; i < names.size(); ++i) {
        const std::string name = std::to_string(i);
        if (std::find(names.begin(), names.end(), name) == names.end())
            return rc.fail(where + ": variables are not numbered 0.." +
                           std::to_string(names.size() - 1) + " (found '" + names[i] + "')");
        const std::string what = where + "/" + name;
        Id ds(H5Dopen2(vars, name.c_str(), H5P_DEFAULT), H5Dclose);
        if (!ds.ok()) return rc.fail(what + ": not a dataset");
        Id type(H5Dget_type(ds.get()), H5Tclose);
        if (!type.ok() || H5Tget_class(type.get()) != H5T_FLOAT)
            return rc.fail(what + ": expected floating-point values");
        Id space(H5Dget_space(ds.get()), H5Sclose);
        const int rank = H5Sget_simple_extent_ndims(space.get());
        if (rank < 0 || rank > 8) return rc.fail(what + ": unsupported dataspace");
        std::vector<hsize_t> dims(static_cast<size_t>(rank));
        H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
        std::vector<int64_t> shape;
        int64_t count = 1;
        for (hsize_t d : dims) {
            if (d > (hsize_t{1} << 40) || count > (int64_t{1} << 40) / std::max<int64_t>(1, d))
                return rc.fail(what + ": dimensions too large");
            shape.push_back(static_cast<int64_t>(d));
            count *= static_cast<int64_t>(d);
        }
        // A damaged dataset may declare more values than the file holds (Keras writes them
        // contiguous and uncompressed): refused before anything is allocated, as is one over the
        // memory budget.
        const size_t typeBytes = H5Tget_size(type.get());
        const hsize_t stored = H5Dget_storage_size(ds.get());
        if (typeBytes == 0 || typeBytes > 8 || double(stored) < double(count) * double(typeBytes))
            return rc.fail(what + ": declares shape " + shapeText(shape) + " of " +
                           std::to_string(typeBytes) + "-byte values but stores " +
                           std::to_string(stored) + " bytes (damaged, or compressed)");
        float* values = rc.allocate(rc.ctx, path, what, shape, rc.error);
        if (!values) return false;
        if (count > 0 &&
            H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) < 0)
            return rc.fail(what + ": cannot read its values (damaged file?)");
    }
    return true;
}

bool writeFile(const std::vector<GroupView>& groups, std::string* bytes, std::string* error) {
    std::lock_guard<std::mutex> lock(h5Mutex());
    QuietH5 quiet;
    auto fail = [error](std::string message) {
        *error = std::move(message);
        return false;
    };
    Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    if (!fapl.ok() || H5Pset_fapl_core(fapl.get(), size_t{1} << 20, 0) < 0)
        return fail("model.weights.h5: cannot set up an in-memory HDF5 file");
    // The root group's header untimed too (a file creation list is a group creation list).
    Id fcpl(untimed(H5P_FILE_CREATE), H5Pclose);
    Id file(H5Fcreate(kMemoryFileName, H5F_ACC_TRUNC, fcpl.get(), fapl.get()), H5Fclose);
    if (!fcpl.ok() || !file.ok())
        return fail("model.weights.h5: cannot create an in-memory HDF5 file");
    for (const GroupView& g : groups) {
        std::string why;
        if (!writeGroup(file.get(), g, &why)) return fail("model.weights.h5: " + why);
    }
    if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0)
        return fail("model.weights.h5: cannot flush the HDF5 file");
    const ssize_t size = H5Fget_file_image(file.get(), nullptr, 0);
    if (size <= 0) return fail("model.weights.h5: cannot take the HDF5 file image");
    bytes->resize(static_cast<size_t>(size));
    if (H5Fget_file_image(file.get(), bytes->data(), bytes->size()) != size)
        return fail("model.weights.h5: cannot take the HDF5 file image");
    return true;
}

bool readFile(const std::string& bytes, const std::string& what, AllocateFn allocate,
              void (*announceGroup)(void*, const std::string&), void* ctx, std::string* error) {
    std::lock_guard<std::mutex> lock(h5Mutex());
    QuietH5 quiet;
    const ReadContext rc{allocate, ctx, error};
    if (bytes.size() < 8 || bytes.compare(0, 8, "\x89HDF\r\n\x1a\n") != 0)
        return rc.fail(what + ": not an HDF5 file (no HDF5 signature)");
    Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    // H5F_CLOSE_STRONG: closing the file closes whatever a damaged file left open in the library.
    if (!fapl.ok() || H5Pset_fapl_core(fapl.get(), size_t{1} << 20, 0) < 0 ||
        H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG) < 0 ||
        H5Pset_file_image(fapl.get(), const_cast<char*>(bytes.data()), bytes.size()) < 0)
        return rc.fail(what + ": cannot set up an in-memory HDF5 file");
    Id file(H5Fopen(kMemoryFileName, H5F_ACC_RDONLY, fapl.get()), H5Fclose);
    if (!file.ok()) return rc.fail(what + ": not a readable HDF5 file (damaged?)");
    if (isGroup(file.get(), "vars")) {
        Id vars(H5Gopen2(file.get(), "vars", H5P_DEFAULT), H5Gclose);
        announceGroup(ctx, "");
        if (!readVars(vars.get(), "", what + ": vars", rc)) return false;
    }
    if (!isGroup(file.get(), "layers"))
        return rc.fail(what +
                       ": no 'layers' group (expected the weights of a Keras 3 Sequential "
                       "model, layers/<layer>/vars/<i>)");
    Id layers(H5Gopen2(file.get(), "layers", H5P_DEFAULT), H5Gclose);
    for (const std::string& name : childNames(layers.get())) {
        if (!isGroup(layers.get(), name)) continue;
        Id g(H5Gopen2(layers.get(), name.c_str(), H5P_DEFAULT), H5Gclose);
        if (!g.ok() || !isGroup(g.get(), "vars")) continue;
        Id vars(H5Gopen2(g.get(), "vars", H5P_DEFAULT), H5Gclose);
        const std::string path = "layers/" + name;
        announceGroup(ctx, path);
        if (!readVars(vars.get(), path, what + ": " + path + "/vars", rc)) return false;
    }
    return true;
}

const td::h5abi::Api kApi{td::h5abi::kAbiVersion, &writeFile, &readFile};

}  // namespace

extern "C" __attribute__((visibility("default"))) const td::h5abi::Api* traindeck_h5_api() {
    return &kApi;
}
