#include "engine/backend/backend.h"
#include "engine/distribute/collectives.h"

namespace td {

std::vector<DeviceDesc> enumerateDevices() {
    std::vector<DeviceDesc> out{cpuDeviceDesc()};
    for (const DeviceDesc& d : cudaDevices()) out.push_back(d);
    return out;
}

Result<std::unique_ptr<Device>> openDevice(const std::string& id) {
    if (id == "cpu" || id == "cpu:0") return makeCpuDevice(0);
    if (id.rfind("cuda:", 0) == 0) {
        const int index = std::atoi(id.c_str() + 5);
        return makeCudaDevice(index);
    }
    std::string known;
    for (const DeviceDesc& d : enumerateDevices()) known += (known.empty() ? "" : ", ") + d.id;
    return err("unknown device '" + id + "' (this machine has: " + known + ")");
}

#ifndef TRAINDECK_HAVE_CUDA
std::vector<DeviceDesc> cudaDevices() {
    return {};
}
Result<std::unique_ptr<Device>> makeCudaDevice(int index) {
    return err("cuda:" + std::to_string(index) +
               ": this build has no CUDA backend (configure with the CUDA toolkit installed)");
}
Result<std::vector<std::unique_ptr<Collectives>>> deviceCollectives(
    const std::vector<Device*>&, const std::vector<Collectives*>&) {
    return err("this build has no CUDA backend: collectives sum host memory");
}
#endif

}  // namespace td
