// Instruction-set level of the engine's own vector kernels (optimizer updates), chosen once per
// process at run time, as oneDNN does for its primitives. The binaries are compiled for the
// baseline x86-64 CPU; only kernels built for a higher level in their own translation units use
// AVX2 or AVX-512, and only when this CPU and its operating system support them.
//
// TRAINDECK_ISA=generic|avx2|avx512 lowers the level (to compare paths or to rule one out); it
// cannot raise it above what the CPU supports.
#pragma once

#include <string>
#include <type_traits>

namespace td {

enum class CpuIsa { Generic, Avx2, Avx512 };

const char* cpuIsaName(CpuIsa isa);

// Highest level this CPU supports for which this build has kernels (Generic off x86-64).
CpuIsa detectedCpuIsa();

struct CpuIsaChoice {
    CpuIsa isa = CpuIsa::Generic;
    std::string error;  // non-empty: why the request was not followed ("TRAINDECK_ISA: ...")
};

// The level for a TRAINDECK_ISA value (nullptr or "" when unset) on a CPU whose best level is
// `detected`. A value that is not a level, or names one above `detected`, gives `detected` and
// an error that names the variable, the value and what would be accepted.
CpuIsaChoice chooseCpuIsa(const char* requested, CpuIsa detected);

// chooseCpuIsa(getenv("TRAINDECK_ISA"), detectedCpuIsa()), evaluated once per process. The
// command-line front end refuses to start when its error is set; library code only follows isa.
const CpuIsaChoice& activeCpuIsa();

// The 16-bit matrix-product instructions of this CPU (CPUID, with the OS saving AVX-512 state):
// what mixed precision can run fast. oneDNN picks among them itself.
struct CpuHalfSupport {
    bool avx512Bf16 = false;  // AVX512_BF16: bf16 dot products
    bool amxBf16 = false;     // AMX-BF16 tiles
    bool avx512Fp16 = false;  // AVX512-FP16 arithmetic
};
CpuHalfSupport cpuHalfSupport();

// The kernels of `isa` for a family compiled once per level, each level's table in its own
// translation unit: `generic` always, `avx2` and `avx512` where the build has them (null
// elsewhere; see TD_ISA_X86). A level this build lacks gives the generic table.
template <typename Table>
const Table& kernelsForIsa(CpuIsa isa, const Table& (*generic)(),
                           std::type_identity_t<const Table& (*)()> avx2,
                           std::type_identity_t<const Table& (*)()> avx512) {
    if (isa == CpuIsa::Avx512 && avx512) return avx512();
    if (isa == CpuIsa::Avx2 && avx2) return avx2();
    return generic();
}

}  // namespace td

// A level's table where the build compiles the x86-64 levels, else null.
#if defined(__x86_64__)
#define TD_ISA_X86(table) (table)
#else
#define TD_ISA_X86(table) nullptr
#endif

namespace td {}  // namespace td
