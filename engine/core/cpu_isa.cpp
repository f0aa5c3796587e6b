#include "engine/core/cpu_isa.h"

#include <cstdlib>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

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

CpuHalfSupport cpuHalfSupport() {
    CpuHalfSupport h;
#if defined(__x86_64__)
    if (detectedCpuIsa() != CpuIsa::Avx512) return h;  // no AVX-512 state saved by the OS
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        h.amxBf16 = (d >> 22) & 1u;
        h.avx512Fp16 = (d >> 23) & 1u;
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) h.avx512Bf16 = (a >> 5) & 1u;
#endif
    return h;
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
