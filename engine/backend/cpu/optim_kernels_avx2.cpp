// Optimizer kernels for AVX2 CPUs; CMake compiles this file alone with -mavx2. Only called after
// activeCpuIsa() found AVX2.
#if defined(__x86_64__)
#define TD_OPTIM_ISA_NAMESPACE isa_avx2
#define TD_OPTIM_ISA_LEVEL td::CpuIsa::Avx2
#include "engine/backend/cpu/optim_kernels_impl.h"
#endif
