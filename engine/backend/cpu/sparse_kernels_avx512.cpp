// The zero-skipping products (sparse_kernels.h) for AVX-512 CPUs; CMake compiles this file alone
// with -mavx512f -mpopcnt. Only called after activeCpuIsa() found AVX-512.
#if defined(__x86_64__)
// GCC 12's unpack intrinsics start from _mm512_undefined_ps(), which its flow analysis then
// reports as maybe uninitialized in every caller.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "engine/backend/cpu/sparse_kernels.h"

// In td::cpu::isa_avx512 with the other AVX-512 loops (tests/portable checks that AVX-512 code
// lives only in such namespaces).
namespace td::cpu::isa_avx512 {
namespace {

using sparse::Kernels;

// Rows (or columns) of the sparse operand taken together: each listed row of the dense operand
// is loaded once for all of them. Two rows of eight vectors are 16 accumulators (a tile of 128
// columns); four of four the same 16 (64 columns). Measured on one core of a 2-core AVX-512
// machine (AMD Zen 5), a Fashion-MNIST batch of 32 ([32,392] at stride 784, 128 outputs) against
// oneDNN: two rows 1.27x (forward) and 1.48x (weight gradient), four 1.03x and 1.38x, the four
// rows' union holding more zeros to multiply; at full density both 0.85-0.92x. The FMAs, not
// the loads, set the pace once a row's vector serves two.
constexpr int kForwardGroup = 2;
constexpr int kGradGroup = 2;
constexpr int tileVectors(int group) {
    return 32 / group / 2;
}
// Bytes of the dense operand a block keeps in L1 while every group's list runs over it.
constexpr int64_t kBlockBytes = 32 * 1024;
// Rows of dy per block of the weight gradient (a 64 x 128 block is 32 KB).
constexpr int64_t kGradRows = 64;

inline __mmask16 tailMask(int64_t n) {
    return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}

// The positions where any of G rows (or columns) of the sparse operand is nonzero, with the G
// values there. Room for a whole vector stored past the end.
template <int G>
struct GroupList {
    std::vector<int32_t> at;
    std::vector<float> value[G];
    void reserve(int64_t n) {
        if (static_cast<int64_t>(at.size()) < n + 16) {
            at.resize(static_cast<size_t>(n + 16));
            for (auto& v : value) v.resize(static_cast<size_t>(n + 16));
        }
    }
};

// Appends the lanes among `lanes` where any of v[0..G) is nonzero (positions first + lane) at
// `count`; returns the new count. Compressed in registers, then stored whole: a compress
// straight to memory is slow on some AVX-512 CPUs.
template <int G>
inline int64_t appendGroup(GroupList<G>& list, int64_t count, const __m512* v, __mmask16 lanes,
                           int32_t first) {
    __mmask16 nz = 0;
    for (int g = 0; g < G; ++g)
        nz = static_cast<__mmask16>(
            nz | _mm512_mask_cmp_ps_mask(lanes, v[g], _mm512_setzero_ps(), _CMP_NEQ_UQ));
    const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i pos = _mm512_add_epi32(iota, _mm512_set1_epi32(first));
    _mm512_storeu_si512(list.at.data() + count, _mm512_maskz_compress_epi32(nz, pos));
    for (int g = 0; g < G; ++g)
        _mm512_storeu_ps(list.value[g].data() + count, _mm512_maskz_compress_ps(nz, v[g]));
    return count + __builtin_popcount(nz);
}

// acc[g][0..NV) += value[g][j] * row(at[j]) for every listed position j in [s0, s1), where
// row(p) is the NV vectors at base + p * stride (the last masked by `last`). Each vector of the
// row is loaded into a register once for the G FMAs: folded into each FMA as a memory operand
// (what GCC does otherwise) it is loaded G times, and the loads, not the FMAs, set the pace.
template <int G, int NV>
inline void accumulate(__m512* acc, const GroupList<G>& list, int64_t s0, int64_t s1,
                       const float* base, int64_t stride, __mmask16 last) {
    for (int64_t j = s0; j < s1; ++j) {
        const float* row = base + static_cast<int64_t>(list.at[static_cast<size_t>(j)]) * stride;
        __m512 s[G];
        for (int g = 0; g < G; ++g) s[g] = _mm512_set1_ps(list.value[g][static_cast<size_t>(j)]);
        for (int t = 0; t < NV; ++t) {
            __m512 v = t == NV - 1 ? _mm512_maskz_loadu_ps(last, row + 16 * t)
                                   : _mm512_loadu_ps(row + 16 * t);
            asm("" : "+v"(v));
            for (int g = 0; g < G; ++g) acc[g * NV + t] = _mm512_fmadd_ps(s[g], v, acc[g * NV + t]);
        }
    }
}

template <int NV>
inline void loadRow(__m512* acc, const float* p, __mmask16 last) {
    for (int t = 0; t < NV - 1; ++t) acc[t] = _mm512_loadu_ps(p + 16 * t);
    acc[NV - 1] = _mm512_maskz_loadu_ps(last, p + 16 * (NV - 1));
}

template <int NV>
inline void storeRow(float* p, const __m512* acc, __mmask16 last) {
    for (int t = 0; t < NV - 1; ++t) _mm512_storeu_ps(p + 16 * t, acc[t]);
    _mm512_mask_storeu_ps(p + 16 * (NV - 1), last, acc[NV - 1]);
}

// Group p's list over block b runs from seg[p * (blocks + 1) + b] to the next entry. For every
// block, every group: its output rows out(G p + g) (row stride ldo; those past `rows` absent)
// += its list over the block, from zero for the first block.
template <int G, int NV>
void groupTile(const GroupList<G>& list, const std::vector<int64_t>& seg, int64_t blocks,
               int64_t blockRows, int64_t denseRows, int64_t rows, const float* base,
               int64_t stride, float* out, int64_t ldo, __mmask16 last) {
    const int64_t groups = (rows + G - 1) / G;
    // The lists reach the dense rows in no order a hardware prefetcher follows, and those rows
    // may be in another core's cache (weights its update just wrote): each group fetches its
    // share of the next block's rows while it works on this one.
    const int64_t share = blockRows > 0 ? (blockRows + groups - 1) / groups : 0;
    for (int64_t b = 0; b < blocks; ++b) {
        for (int64_t p = 0; p < groups; ++p) {
            const int64_t r0 = (b + 1) * blockRows + p * share;
            const int64_t r1 = std::min({r0 + share, (b + 2) * blockRows, denseRows});
            for (int64_t r = r0; r < r1; ++r)
                for (int t = 0; t < NV; ++t)
                    _mm_prefetch(reinterpret_cast<const char*>(base + r * stride + 16 * t),
                                 _MM_HINT_T1);
            const int present = static_cast<int>(std::min<int64_t>(G, rows - G * p));
            // One flat array: GCC keeps it in registers (an array of arrays it kept on the stack,
            // stored on every step of the list).
            __m512 acc[G * NV];
            for (int g = 0; g < G; ++g) {
                if (b == 0 || g >= present) {
                    for (int t = 0; t < NV; ++t) acc[g * NV + t] = _mm512_setzero_ps();
                } else {
                    loadRow<NV>(acc + g * NV, out + (G * p + g) * ldo, last);
                }
            }
            const size_t at = static_cast<size_t>(p * (blocks + 1) + b);
            accumulate<G, NV>(acc, list, seg[at], seg[at + 1], base, stride, last);
            for (int g = 0; g < G; ++g)  // a fixed count, unrolled: acc stays in registers
                if (g < present) storeRow<NV>(out + (G * p + g) * ldo, acc + g * NV, last);
        }
    }
}

// out[rows, N] (row stride ldo) from the groups' lists over base[*, N] (row stride `stride`),
// tile of columns by tile.
template <int G>
void runGroups(const GroupList<G>& list, const std::vector<int64_t>& seg, int64_t blocks,
               int64_t blockRows, int64_t denseRows, int64_t rows, const float* base,
               int64_t stride, int64_t N, float* out, int64_t ldo) {
    constexpr int64_t tileCols = 16 * tileVectors(G);
    for (int64_t c0 = 0; c0 < N; c0 += tileCols) {
        const int64_t cols = std::min(tileCols, N - c0);
        const int nv = static_cast<int>((cols + 15) / 16);
        const __mmask16 last = tailMask(cols - 16 * (nv - 1));
        auto tile = [&](auto vectors) {
            groupTile<G, decltype(vectors)::value>(list, seg, blocks, blockRows, denseRows, rows,
                                                   base + c0, stride, out + c0, ldo, last);
        };
        switch (nv) {
            case 1:
                tile(std::integral_constant<int, 1>{});
                break;
            case 2:
                tile(std::integral_constant<int, 2>{});
                break;
            case 3:
                tile(std::integral_constant<int, 3>{});
                break;
            case 4:
                tile(std::integral_constant<int, 4>{});
                break;
            default:
                if constexpr (tileVectors(G) > 4) {
                    switch (nv) {
                        case 5:
                            tile(std::integral_constant<int, 5>{});
                            break;
                        case 6:
                            tile(std::integral_constant<int, 6>{});
                            break;
                        case 7:
                            tile(std::integral_constant<int, 7>{});
                            break;
                        default:
                            tile(std::integral_constant<int, 8>{});
                            break;
                    }
                }
        }
    }
}

// y = x . w: the lists run over groups of x's rows, by blocks of K (w's block stays in L1).
int64_t rowsTimesDense(const float* x, int64_t ldx, int64_t M, int64_t K, const float* w,
                       int64_t ldw, int64_t N, float* y, int64_t ldy) {
    constexpr int G = kForwardGroup;
    thread_local GroupList<G> list;
    thread_local std::vector<int64_t> seg;
    const int64_t kBlock = std::max<int64_t>(
        16, kBlockBytes / (4 * std::min<int64_t>(N, 16 * tileVectors(G))) / 16 * 16);
    const int64_t blocks = std::max<int64_t>(1, (K + kBlock - 1) / kBlock);
    const int64_t groups = (M + G - 1) / G;
    list.reserve(groups * K);
    seg.resize(static_cast<size_t>(groups * (blocks + 1)));
    int64_t count = 0;
    for (int64_t p = 0; p < groups; ++p) {
        const int64_t present = std::min<int64_t>(G, M - G * p);
        for (int64_t b = 0; b < blocks; ++b) {
            seg[static_cast<size_t>(p * (blocks + 1) + b)] = count;
            const int64_t k1 = std::min(K, (b + 1) * kBlock);
            for (int64_t k = b * kBlock; k < k1; k += 16) {
                const __mmask16 lanes = tailMask(k1 - k);
                __m512 v[G];
                for (int g = 0; g < G; ++g)
                    v[g] = g < present ? _mm512_maskz_loadu_ps(lanes, x + (G * p + g) * ldx + k)
                                       : _mm512_setzero_ps();
                count = appendGroup<G>(list, count, v, lanes, static_cast<int32_t>(k));
            }
        }
        seg[static_cast<size_t>(p * (blocks + 1) + blocks)] = count;
    }
    // No prefetching (blockRows 0): the forward product runs along K, on the weight rows this
    // core updated, already in its cache; prefetching them measured slower.
    runGroups<G>(list, seg, blocks, 0, K, M, w, ldw, N, y, ldy);
    return count;
}

// 16 vectors of 16 floats transposed in place: afterwards r[j] holds what was lane j of each.
inline void transpose16(__m512 r[16]) {
    __m512 a[16], b[16], c[16];
    for (int p = 0; p < 8; ++p) {
        a[2 * p] = _mm512_unpacklo_ps(r[2 * p], r[2 * p + 1]);
        a[2 * p + 1] = _mm512_unpackhi_ps(r[2 * p], r[2 * p + 1]);
    }
    auto lo = [](__m512 u, __m512 v) {
        return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u), _mm512_castps_pd(v)));
    };
    auto hi = [](__m512 u, __m512 v) {
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

// dw = x^T . dy: the lists run over groups of x's neighbouring columns (neighbouring inputs,
// such as pixels, are often zero together), by blocks of dy's rows; 16 x 16 tiles of x are
// transposed in registers to read its columns.
int64_t transposedTimesDense(const float* x, int64_t ldx, int64_t B, int64_t K, const float* dy,
                             int64_t ldy, int64_t N, float* dw, int64_t lddw) {
    constexpr int G = kGradGroup;
    static_assert(16 % G == 0);
    thread_local GroupList<G> list;
    thread_local std::vector<int64_t> seg;
    const int64_t blocks = std::max<int64_t>(1, (B + kGradRows - 1) / kGradRows);
    const int64_t groups = (K + G - 1) / G;
    // Group p's list starts at p * room (its entries in row order, so row blocks follow each
    // other); seg[p * (blocks + 1) + b] where row block b starts in it, then its end.
    const int64_t room = (B + 15) / 16 * 16 + 16;
    list.reserve(groups * room);
    seg.resize(static_cast<size_t>(groups * (blocks + 1)));
    int64_t entries = 0;
    for (int64_t k0 = 0; k0 < K; k0 += 16) {
        const __mmask16 cols = tailMask(K - k0);
        const int64_t width = std::min<int64_t>(16, K - k0);
        const int64_t firstGroup = k0 / G, groupsHere = (width + G - 1) / G;
        int64_t count[16 / G];
        for (int64_t q = 0; q < groupsHere; ++q) count[q] = (firstGroup + q) * room;
        for (int64_t r0 = 0; r0 < B; r0 += 16) {
            __m512 r[16];
            const int64_t height = std::min<int64_t>(16, B - r0);
            for (int64_t i = 0; i < 16; ++i)
                r[i] = i < height ? _mm512_maskz_loadu_ps(cols, x + (r0 + i) * ldx + k0)
                                  : _mm512_setzero_ps();
            transpose16(r);  // lanes past `width` are zero columns
            const __mmask16 rows = tailMask(height);
            for (int64_t q = 0; q < groupsHere; ++q) {
                const int64_t p = firstGroup + q;
                if (r0 % kGradRows == 0)
                    seg[static_cast<size_t>(p * (blocks + 1) + r0 / kGradRows)] = count[q];
                count[q] =
                    appendGroup<G>(list, count[q], r + G * q, rows, static_cast<int32_t>(r0));
            }
        }
        for (int64_t q = 0; q < groupsHere; ++q) {
            seg[static_cast<size_t>((firstGroup + q) * (blocks + 1) + blocks)] = count[q];
            entries += count[q] - (firstGroup + q) * room;
        }
    }
    runGroups<G>(list, seg, blocks, kGradRows, B, K, dy, ldy, N, dw, lddw);
    return entries;
}

}  // namespace

const Kernels& sparseTable() {
    static constexpr Kernels k{&rowsTimesDense, &transposedTimesDense, kForwardGroup, kGradGroup};
    return k;
}

}  // namespace td::cpu::isa_avx512
#endif
