// NVML, opened on first use (core/module_loader.h). The few declarations used are NVML's stable C
// ABI (nvml.h), restated here so the build does not need the header either.
#include "engine/backend/cuda/nvml_stats.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "engine/core/module_loader.h"

namespace td {

namespace {

using nvmlReturn_t = int;  // NVML_SUCCESS = 0
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlMemory_t {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
};
struct nvmlUtilization_t {
    unsigned int gpu;     // percent of the sample period a kernel ran
    unsigned int memory;  // percent of it device memory was read or written
};

class Nvml {
  public:
    nvmlReturn_t (*init)() = nullptr;  // nvmlInit_v2
    nvmlReturn_t (*byBusId)(const char*, nvmlDevice_t*) = nullptr;
    nvmlReturn_t (*memoryInfo)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
    nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
    std::string error;  // empty: usable

    static Nvml& get() {
        static Nvml nvml;
        return nvml;
    }

    // The NVML handle of CUDA device `index` (looked up once; null when NVML does not know it).
    nvmlDevice_t handle(int index) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = handles_.find(index);
        if (it != handles_.end()) return it->second;
        nvmlDevice_t h = nullptr;
        char bus[64] = {};
        if (cudaDeviceGetPCIBusId(bus, sizeof bus, index) != cudaSuccess) {
            (void)cudaGetLastError();
        } else if (auto id = cuda::nvmlBusId(bus)) {
            if (byBusId(id->c_str(), &h) != 0) h = nullptr;
        }
        handles_[index] = h;
        return h;
    }

  private:
    Nvml() { load(*this); }
    static void load(Nvml& n) {
        // The library stays loaded for the process (NVML is shut down by the driver at exit).
        auto lib = SystemLibrary::open("NVML", {"libnvidia-ml.so.1"});
        if (!lib.ok()) {
            n.error = lib.error();
            return;
        }
        const Status resolved = lib->resolve({{"nvmlInit_v2", n.init},
                                              {"nvmlDeviceGetHandleByPciBusId_v2", n.byBusId},
                                              {"nvmlDeviceGetMemoryInfo", n.memoryInfo},
                                              {"nvmlDeviceGetUtilizationRates", n.utilization}});
        if (!resolved.ok()) {
            n.error = resolved.error();
            return;
        }
        const nvmlReturn_t r = n.init();
        if (r != 0) n.error = "nvmlInit_v2 failed (NVML error " + std::to_string(r) + ")";
    }

    std::mutex mu_;
    std::map<int, nvmlDevice_t> handles_;
};

}  // namespace

std::optional<std::string> cuda::nvmlBusId(const std::string& pciBusId) {
    // domain:bus:device.function, or bus:device.function; hexadecimal numbers.
    unsigned domain = 0, bus = 0, device = 0, function = 0;
    int used = 0;
    std::string s;
    for (char c : pciBusId)
        if (!std::isspace(static_cast<unsigned char>(c))) s += c;
    if (s.empty()) return std::nullopt;
    const bool all = std::count(s.begin(), s.end(), ':') == 2;
    if (std::count(s.begin(), s.end(), ':') > 2 || std::count(s.begin(), s.end(), '.') != 1)
        return std::nullopt;
    for (char c : s)
        if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.')
            return std::nullopt;
    const int got =
        all ? std::sscanf(s.c_str(), "%x:%x:%x.%x%n", &domain, &bus, &device, &function, &used)
            : std::sscanf(s.c_str(), "%x:%x.%x%n", &bus, &device, &function, &used);
    if (got != (all ? 4 : 3) || used != static_cast<int>(s.size())) return std::nullopt;
    if (bus > 0xff || device > 0x1f || function > 0x7) return std::nullopt;
    char out[32];
    std::snprintf(out, sizeof out, "%08x:%02x:%02x.%x", domain, bus, device, function);
    return std::string(out);
}

std::string cuda::nvmlUnavailableReason() {
    return Nvml::get().error;
}

std::optional<DeviceTelemetry> cuda::nvmlTelemetry(int index) {
    Nvml& nvml = Nvml::get();
    if (!nvml.error.empty() || index < 0) return std::nullopt;
    nvmlDevice_t h = nvml.handle(index);
    if (!h) return std::nullopt;
    DeviceTelemetry t;
    nvmlMemory_t m{};
    if (nvml.memoryInfo(h, &m) == 0) {
        t.memoryUsedBytes = static_cast<int64_t>(m.used);
        t.memoryTotalBytes = static_cast<int64_t>(m.total);
    }
    nvmlUtilization_t u{};
    if (nvml.utilization(h, &u) == 0) t.gpuUtilization = static_cast<double>(u.gpu) / 100.0;
    if (t.memoryUsedBytes < 0 && t.gpuUtilization < 0) return std::nullopt;
    return t;
}

std::optional<DeviceTelemetry> deviceTelemetry(const std::string& deviceId) {
    if (deviceId.rfind("cuda:", 0) != 0) return std::nullopt;
    const std::string n = deviceId.substr(5);
    if (n.empty() || n.size() > 4 ||
        !std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return std::nullopt;
    return cuda::nvmlTelemetry(std::atoi(n.c_str()));
}

}  // namespace td
