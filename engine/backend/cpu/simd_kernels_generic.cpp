// CPU kernel loops for the baseline CPU of the build.
#define TD_SIMD_ISA_NAMESPACE isa_generic
#define TD_SIMD_ISA_LEVEL td::CpuIsa::Generic
#include "engine/backend/cpu/simd_kernels_impl.h"

namespace td::cpu {

namespace isa_avx2 {
const simd::Table& table();
}
namespace isa_avx512 {
const simd::Table& table();
}

const simd::Table& simd::kernelsFor(CpuIsa isa) {
    return kernelsForIsa(isa, &isa_generic::table, TD_ISA_X86(&isa_avx2::table),
                         TD_ISA_X86(&isa_avx512::table));
}

const simd::Table& simd::activeKernels() {
    static const Table& t = kernelsFor(activeCpuIsa().isa);
    return t;
}

}  // namespace td::cpu
