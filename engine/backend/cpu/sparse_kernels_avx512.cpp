// The zero-skipping products (sparse_kernels.h) for AVX-512 CPUs; CMake compiles this file alone
// with -mavx512f -mpopcnt. Only called after activeCpuIsa() found AVX-512.
#if defined(__x86_64__)
// GCC 12's unpack intrinsics start from _mm512_undefined_ps(), which its flow analysis then
// reports as maybe uninitialized in every caller.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

// In td::cpu::isa_avx512 with the other AVX-512 loops (tests/portable checks that AVX-512 code
// lives only in such namespaces).
namespace td::cpu::isa_avx512 {
namespace {

struct Isa {
    using Vec = __m512;
    using Mask = __mmask16;
    using Ints = __m512i;
    static constexpr int kLanes = 16;
    // Two rows of eight vectors: 16 of the 32 registers accumulate a tile of 128 columns.
    static constexpr int kForwardGroup = 2;
    static constexpr int kGradGroup = 2;
    static constexpr int tileVectors(int G) { return G == 1 ? 16 : 8; }
    // One listed position per turn of the FMA loop (two, as on AVX2, not measured here).
    static constexpr int kListUnroll = 1;
    static constexpr int64_t kBlockBytes = 32 * 1024;
    // No bound from L1's ways on a block's rows (inPlaceBlockRows; not measured on an AVX-512
    // machine).
    static constexpr int kL1Ways = 0;
    // Blocks read in place (packing them was not measured on an AVX-512 machine).
    static constexpr bool kPackBlocks = false;
    static constexpr int64_t kPackedBlockBytes = 0;

    static Mask tail(int64_t n) {
        return n >= 16 ? static_cast<Mask>(0xffff) : static_cast<Mask>((1u << n) - 1u);
    }
    static Ints lanesTimes(int32_t s) {
        return _mm512_mullo_epi32(
            _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
            _mm512_set1_epi32(s));
    }
    static Vec zero() { return _mm512_setzero_ps(); }
    static Vec load(const float* p) { return _mm512_loadu_ps(p); }
    static Vec loadMasked(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
    static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
    static void storeMasked(float* p, Mask m, Vec v) { _mm512_mask_storeu_ps(p, m, v); }
    static Vec broadcast(float s) { return _mm512_set1_ps(s); }
    static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
    // The masked form with every lane set (GCC 12 warns that _mm512_sqrt_ps reads an
    // uninitialised source).
    static Vec sqrt(Vec a) { return _mm512_mask_sqrt_ps(a, static_cast<__mmask16>(0xFFFF), a); }
    static unsigned nonzeroLanes(Vec v) {
        return _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    }
    static void keep(Vec& v) { asm("" : "+v"(v)); }

    // Compressed in registers, then stored whole: a compress straight to memory is slow on some
    // AVX-512 CPUs.
    template <int G>
    static int64_t append(const Vec* v, Mask lanes, int32_t first, Ints steps, int32_t* at) {
        Mask nz = 0;
        for (int g = 0; g < G; ++g)
            nz = static_cast<Mask>(
                nz | _mm512_mask_cmp_ps_mask(lanes, v[g], _mm512_setzero_ps(), _CMP_NEQ_UQ));
        const __m512i pos = _mm512_add_epi32(steps, _mm512_set1_epi32(first));
        _mm512_storeu_si512(at, _mm512_maskz_compress_epi32(nz, pos));
        return __builtin_popcount(nz);
    }

    // 16 vectors of 16 floats transposed in place: afterwards r[j] holds what was lane j of each.
    static void transpose(Vec r[16]) {
        Vec a[16], b[16], c[16];
        for (int p = 0; p < 8; ++p) {
            a[2 * p] = _mm512_unpacklo_ps(r[2 * p], r[2 * p + 1]);
            a[2 * p + 1] = _mm512_unpackhi_ps(r[2 * p], r[2 * p + 1]);
        }
        auto lo = [](Vec u, Vec v) {
            return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u), _mm512_castps_pd(v)));
        };
        auto hi = [](Vec u, Vec v) {
            return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(u), _mm512_castps_pd(v)));
        };
        for (int q = 0; q < 4; ++q) {
            b[4 * q + 0] = lo(a[4 * q + 0], a[4 * q + 2]);
            b[4 * q + 1] = hi(a[4 * q + 0], a[4 * q + 2]);
            b[4 * q + 2] = lo(a[4 * q + 1], a[4 * q + 3]);
            b[4 * q + 3] = hi(a[4 * q + 1], a[4 * q + 3]);
        }
        for (int j = 0; j < 4; ++j) {
            c[j] = _mm512_shuffle_f32x4(b[j], b[j + 4], 0x88);
            c[j + 4] = _mm512_shuffle_f32x4(b[j], b[j + 4], 0xdd);
            c[j + 8] = _mm512_shuffle_f32x4(b[j + 8], b[j + 12], 0x88);
            c[j + 12] = _mm512_shuffle_f32x4(b[j + 8], b[j + 12], 0xdd);
        }
        for (int j = 0; j < 8; ++j) {
            r[j] = _mm512_shuffle_f32x4(c[j], c[j + 8], 0x88);
            r[j + 8] = _mm512_shuffle_f32x4(c[j], c[j + 8], 0xdd);
        }
    }
};

}  // namespace
}  // namespace td::cpu::isa_avx512

#define TD_SPARSE_ISA_NAMESPACE isa_avx512
#include "engine/backend/cpu/sparse_kernels_impl.h"
#endif
