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
        // Free memory needs a context on the device: its primary context is made here (the one a
        // cuda:N device uses, and which stays for the process's life); a device that refuses one
        // is still listed, without free memory.
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
    // Properties only: cudaDevices() would make a context on every GPU to read its free memory.
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        count = 0;
    }
    cudaDeviceProp prop{};
    if (index < 0 || index >= count || cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
        (void)cudaGetLastError();
        return err("cuda:" + std::to_string(index) + ": no such GPU (" + std::to_string(count) +
                   " detected)");
    }
    return err("cuda:" + std::to_string(index) + " (" + prop.name +
               "): the CUDA backend detects GPUs but does not run training programs yet; use "
               "cpu:0");
}

}  // namespace td
