// The zero-skipping products (sparse_kernels.h) for AVX2 CPUs; CMake compiles this file alone
// with -mavx2 -mfma -mpopcnt. Only called after activeCpuIsa() found AVX2 (and the CPU has FMA).
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>

// In td::cpu::isa_avx2 with the other AVX2 loops (tests/portable checks that AVX code lives only
// in such namespaces).
namespace td::cpu::isa_avx2 {
namespace {

// For each 8-bit mask, the lanes that are set, in order, as bytes (the rest zero): the
// permutation that packs those lanes to the front. AVX2 has no compress instruction.
constexpr std::array<uint64_t, 256> packTable() {
    std::array<uint64_t, 256> t{};
    for (unsigned m = 0; m < 256; ++m) {
        uint64_t bytes = 0;
        int n = 0;
        for (unsigned lane = 0; lane < 8; ++lane)
            if (m & (1u << lane)) bytes |= static_cast<uint64_t>(lane) << (8 * n++);
        t[m] = bytes;
    }
    return t;
}
constexpr std::array<uint64_t, 256> kPack = packTable();

struct Isa {
    using Vec = __m256;
    using Mask = __m256i;
    using Ints = __m256i;
    static constexpr int kLanes = 8;
    // Two rows of six vectors: 12 of the 16 registers accumulate a tile of 48 columns; the dense
    // row's vector and the two broadcasts take three more.
    // One row per list (45% and 52% of the work listed against 62% and 70% for pairs, a tile of
    // 96 columns) measured no faster, 1.04x and 0.89x oneDNN against 1.19x and 1.00x for pairs
    // (one core of an AMD Zen 3, Fashion-MNIST batches of 32): each vector of the row then
    // serves one FMA, and the loads set the pace.
    static constexpr int kForwardGroup = 2;
    static constexpr int kGradGroup = 2;
    static constexpr int tileVectors(int G) { return G == 1 ? 12 : 6; }
    // Two listed positions per turn of the FMA loop: one core, Fashion-MNIST batches of 32, the
    // variants alternating call by call (traindeck_bench_sparse with a temporary switch, 2,000
    // calls of each a round, 38 rounds in seven invocations): each half's forward product 1-5%
    // shorter in every round (e.g. 28.17 against 28.86 us, 31.31 against 32.50), its weight
    // gradient within 2% either way, mostly shorter. Four per turn: no shorter than one
    // (30.17-31.29 against 29.61-31.09 us for the first half); the lists are short.
    static constexpr int kListUnroll = 2;
    static constexpr int64_t kBlockBytes = 16 * 1024;
    // L1's ways (Zen 3 and Intel's AVX2 cores before Ice Lake: 32 KB, 8 ways), which bound the
    // rows of a block read in place (inPlaceBlockRows).
    static constexpr int kL1Ways = 8;
    // Packed blocks of the forward product (rowsTimesDense), 96 rows of 48 columns.
    static constexpr bool kPackBlocks = true;
    static constexpr int64_t kPackedBlockBytes = 20 * 1024;

    static Mask tail(int64_t n) {
        const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(n, 8))),
                                  iota);
    }
    static Ints lanesTimes(int32_t s) {
        return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(s));
    }
    static Vec zero() { return _mm256_setzero_ps(); }
    static Vec load(const float* p) { return _mm256_loadu_ps(p); }
    static Vec loadMasked(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
    static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
    static void storeMasked(float* p, Mask m, Vec v) { _mm256_maskstore_ps(p, m, v); }
    static Vec broadcast(float s) { return _mm256_set1_ps(s); }
    static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
    static Vec sqrt(Vec a) { return _mm256_sqrt_ps(a); }
    static unsigned nonzeroLanes(Vec v) {
        return static_cast<unsigned>(
            _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_NEQ_UQ)));
    }
    static void keep(Vec& v) { asm("" : "+x"(v)); }

    // The lanes where any is nonzero packed to the front by one permutation from kPack, then
    // stored whole.
    template <int G>
    static int64_t append(const Vec* v, Mask lanes, int32_t first, Ints steps, int32_t* at) {
        __m256 any = _mm256_cmp_ps(v[0], _mm256_setzero_ps(), _CMP_NEQ_UQ);
        for (int g = 1; g < G; ++g)
            any = _mm256_or_ps(any, _mm256_cmp_ps(v[g], _mm256_setzero_ps(), _CMP_NEQ_UQ));
        const auto nz = static_cast<unsigned>(
            _mm256_movemask_ps(_mm256_and_ps(any, _mm256_castsi256_ps(lanes))));
        const __m256i perm =
            _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(kPack[nz])));
        const __m256i pos = _mm256_add_epi32(steps, _mm256_set1_epi32(first));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(at), _mm256_permutevar8x32_epi32(pos, perm));
        return __builtin_popcount(nz);
    }

    // 8 vectors of 8 floats transposed in place: afterwards r[j] holds what was lane j of each.
    static void transpose(Vec r[8]) {
        Vec t[8], u[8];
        for (int p = 0; p < 4; ++p) {
            t[2 * p] = _mm256_unpacklo_ps(r[2 * p], r[2 * p + 1]);
            t[2 * p + 1] = _mm256_unpackhi_ps(r[2 * p], r[2 * p + 1]);
        }
        for (int h = 0; h < 2; ++h) {  // rows 0-3, then 4-7
            Vec* a = t + 4 * h;
            Vec* b = u + 4 * h;
            b[0] = _mm256_shuffle_ps(a[0], a[2], 0x44);
            b[1] = _mm256_shuffle_ps(a[0], a[2], 0xee);
            b[2] = _mm256_shuffle_ps(a[1], a[3], 0x44);
            b[3] = _mm256_shuffle_ps(a[1], a[3], 0xee);
        }
        for (int j = 0; j < 4; ++j) {
            r[j] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x20);
            r[j + 4] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x31);
        }
    }
};

}  // namespace
}  // namespace td::cpu::isa_avx2

#define TD_SPARSE_ISA_NAMESPACE isa_avx2
#include "engine/backend/cpu/sparse_kernels_impl.h"
#endif
