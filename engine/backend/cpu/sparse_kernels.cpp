#include "engine/backend/cpu/sparse_kernels.h"

#if defined(__x86_64__)
namespace td::cpu::isa_avx512 {
const sparse::Kernels& sparseTable();  // sparse_kernels_avx512.cpp
}
namespace td::cpu::isa_avx2 {
const sparse::Kernels& sparseTable();  // sparse_kernels_avx2.cpp
}
#endif

namespace td::cpu::sparse {

const Kernels* forIsa(CpuIsa isa) {
#if defined(__x86_64__)
    const CpuIsa detected = detectedCpuIsa();
    if (isa == CpuIsa::Avx512 && detected == CpuIsa::Avx512) return &isa_avx512::sparseTable();
    if (isa == CpuIsa::Avx2 && detected != CpuIsa::Generic && __builtin_cpu_supports("fma"))
        return &isa_avx2::sparseTable();
#else
    (void)isa;
#endif
    return nullptr;
}

const Kernels* active() {
    return forIsa(activeCpuIsa().isa);
}

}  // namespace td::cpu::sparse
