// Optimizer kernels for AVX-512 CPUs; CMake compiles this file alone with -mavx512f. Only called
// after activeCpuIsa() found AVX-512.
#if defined(__x86_64__)
#define TD_OPTIM_ISA_NAMESPACE isa_avx512
#define TD_OPTIM_ISA_LEVEL td::CpuIsa::Avx512
#include "engine/backend/cpu/optim_kernels_impl.h"
#endif
