#include "engine/backend/cpu/sparse_kernels.h"

#include <cstdlib>
#include <string_view>

#include "engine/core/cpu_isa.h"

#if defined(__x86_64__)
namespace td::cpu::isa_avx512 {
const sparse::Kernels& sparseTable();  // sparse_kernels_avx512.cpp
}
#endif

namespace td::cpu::sparse {

const Kernels* avx512() {
#if defined(__x86_64__)
    if (detectedCpuIsa() == CpuIsa::Avx512) return &isa_avx512::sparseTable();
#endif
    return nullptr;
}

const Kernels* active() {
    if (activeCpuIsa().isa != CpuIsa::Avx512) return nullptr;
    const char* off = std::getenv("TRAINDECK_NO_SPARSE");
    return off && *off && std::string_view(off) != "0" ? nullptr : avx512();
}

}  // namespace td::cpu::sparse
