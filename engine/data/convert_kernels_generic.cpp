// Batch-forming kernels for the baseline CPU of the build (SSE2 on x86-64), and the choice of
// level.
#define TD_CONVERT_ISA_NAMESPACE isa_generic
#define TD_CONVERT_ISA_LEVEL td::CpuIsa::Generic
#include "engine/data/convert_kernels_impl.h"

namespace td::data_kernels {

#if defined(__x86_64__)
namespace isa_avx2 {
const Table& table();
}
namespace isa_avx512 {
const Table& table();
}
#endif

const Table& kernelsFor(CpuIsa isa) {
    return kernelsForIsa(isa, &isa_generic::table, TD_ISA_X86(&isa_avx2::table),
                         TD_ISA_X86(&isa_avx512::table));
}

const Table& activeKernels() {
    static const Table& t = kernelsFor(activeCpuIsa().isa);
    return t;
}

}  // namespace td::data_kernels
