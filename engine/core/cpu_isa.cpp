#include "engine/core/cpu_isa.h"

#include <cstdlib>

namespace td {

const char* cpuIsaName(CpuIsa isa) {
    switch (isa) {
        case CpuIsa::Avx512:
            return "avx512";
        case CpuIsa::Avx2:
            return "avx2";
        case CpuIsa::Generic:
            break;
    }
    return "generic";
}

CpuIsa detectedCpuIsa() {
#if defined(__x86_64__)
    // libgcc's cpuinfo also checks XCR0, so a CPU whose OS does not save the AVX or AVX-512
    // register state reports the feature as absent.
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return CpuIsa::Avx512;
    if (__builtin_cpu_supports("avx2")) return CpuIsa::Avx2;
#endif
    return CpuIsa::Generic;
}

CpuIsaChoice chooseCpuIsa(const char* requested, CpuIsa detected) {
    CpuIsaChoice c{detected, {}};
    if (requested == nullptr || *requested == '\0') return c;
    const std::string want = requested;
    CpuIsa level;
    if (want == "generic") {
        level = CpuIsa::Generic;
    } else if (want == "avx2") {
        level = CpuIsa::Avx2;
    } else if (want == "avx512") {
        level = CpuIsa::Avx512;
    } else {
        c.error = "TRAINDECK_ISA: expected generic, avx2 or avx512, got '" + want + "'";
        return c;
    }
    if (static_cast<int>(level) > static_cast<int>(detected)) {
        c.error = std::string("TRAINDECK_ISA: ") + want + " is not available on this CPU" +
                  " (the highest level here is " + cpuIsaName(detected) + ")";
        return c;
    }
    c.isa = level;
    return c;
}

const CpuIsaChoice& activeCpuIsa() {
    static const CpuIsaChoice choice = chooseCpuIsa(std::getenv("TRAINDECK_ISA"), detectedCpuIsa());
    return choice;
}

}  // namespace td
