// CUDA device discovery through the runtime API. A machine without a driver or GPU makes
// cudaGetDeviceCount fail: that is zero devices, not an error. Running Programs on CUDA devices
// is not implemented yet; openDevice("cuda:N") says so.
#include <cuda_runtime_api.h>

#include "engine/backend/backend.h"

namespace td {

namespace {

// CUDA encodes versions as 1000 * major + 10 * minor (13000 = "13.0").
std::string cudaVersionString(int v) {
    if (v <= 0) return {};
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace

std::vector<DeviceDesc> cudaDevices() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky error
        return {};
    }
    int driver = 0;
    int runtime = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
    // cudaSetDevice below changes the calling thread's current device: put it back afterwards.
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
    std::vector<DeviceDesc> out;
    for (int i = 0; i < count; ++i) {
        cudaDeviceProp prop{};
        if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
        }
        DeviceDesc d;
        d.kind = DeviceKind::Cuda;
        d.index = i;
        d.id = "cuda:" + std::to_string(i);
        d.name = prop.name;
        d.memoryBytes = static_cast<int64_t>(prop.totalGlobalMem);
        d.computeCapability = std::to_string(prop.major) + "." + std::to_string(prop.minor);
        d.driverVersion = cudaVersionString(driver);
        d.runtimeVersion = cudaVersionString(runtime);
        // Free memory needs a context on the device: made here (the primary context, which the
        // device would use anyway); a device that refuses one still gets listed.
        size_t freeBytes = 0;
        size_t totalBytes = 0;
        if (cudaSetDevice(i) == cudaSuccess &&
            cudaMemGetInfo(&freeBytes, &totalBytes) == cudaSuccess)
            d.memoryFreeBytes = static_cast<int64_t>(freeBytes);
        else
            (void)cudaGetLastError();
        out.push_back(d);
    }
    if (previous >= 0) (void)cudaSetDevice(previous);
    (void)cudaGetLastError();
    return out;
}

Result<std::unique_ptr<Device>> makeCudaDevice(int index) {
    const auto devs = cudaDevices();
    if (index < 0 || index >= static_cast<int>(devs.size()))
        return err("cuda:" + std::to_string(index) + ": no such GPU (" +
                   std::to_string(devs.size()) + " detected)");
    return err("cuda:" + std::to_string(index) + " (" + devs[static_cast<size_t>(index)].name +
               "): the CUDA backend detects GPUs but does not run training programs yet; use "
               "cpu:0");
}

}  // namespace td
