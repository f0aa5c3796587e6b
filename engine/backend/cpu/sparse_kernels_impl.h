// Body of the zero-skipping products (sparse_kernels.h), included once per instruction-set level
// by sparse_kernels_{avx2,avx512}.cpp, each compiled with its own -m flags. The including file
// defines, in an unnamed namespace inside td::cpu::TD_SPARSE_ISA_NAMESPACE, a struct `Isa` with
// the level's vector operations:
//   Vec, Mask                      a vector of kLanes floats and a lane mask
//   kLanes                         floats per vector
//   kTileVectors                   vectors per row of a tile when two rows share it (the
//                                  accumulators, the dense row's vector and the two broadcasts
//                                  fill the register file)
//   kListUnroll                    listed positions per turn of the FMA loop (accumulate)
//   kBlockBytes                    bytes of the dense operand a block keeps in L1
//   kL1Ways                        L1's ways, which bound the rows of a block read in place
//                                  (inPlaceBlockRows; 0: no bound)
//   kPackBlocks                    whether rowsTimesDense copies each block of a tile of the
//   kPackedBlockBytes              dense operand into a buffer before reading it (Packed) where
//                                  its rows lie far apart, and the bytes of such a block
//   tail(n)                        lanes [0, n)
//   zero, load, loadMasked, store, storeMasked, broadcast, fmadd, sqrt
//   nonzeroLanes(v)                a bit per lane, set where v is nonzero (or NaN)
//   keep(v)                        an empty asm that makes v a register
//   append<G>(v, lanes, first, steps, at)
//                                  stores the positions first + lane of the lanes among `lanes`
//                                  where any of v[0..G) is nonzero at `at`, a whole vector;
//                                  returns how many
//   transpose(r)                   kLanes vectors transposed in place
// Everything lives in that unnamed namespace, so no inline copy compiled for one level can be
// merged by the linker into another's code.
#if !defined(TD_SPARSE_ISA_NAMESPACE)
#error "define TD_SPARSE_ISA_NAMESPACE and the struct Isa before including this file"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/backend/cpu/sparse_kernels.h"

namespace td::cpu::TD_SPARSE_ISA_NAMESPACE {
namespace {

using sparse::Kernels;
using Vec = Isa::Vec;
using Mask = Isa::Mask;
using Ints = Isa::Ints;
constexpr int kLanes = Isa::kLanes;

// Rows (or columns) of the sparse operand taken together: each listed row of the dense operand
// is loaded once for both. Measured on one core of a 2-core AVX-512 machine (AMD Zen 5), a
// Fashion-MNIST batch of 32 ([32,392] at stride 784, 128 outputs) against oneDNN: two rows 1.27x
// (forward) and 1.48x (weight gradient), four 1.03x and 1.38x, the four rows' union holding more
// zeros to multiply; at full density both 0.85-0.92x. The FMAs, not the loads, set the pace once
// a row's vector serves two.
constexpr int kForwardGroup = Isa::kForwardGroup;
constexpr int kGradGroup = Isa::kGradGroup;
// Columns of a tile when G rows share it.
template <int G>
constexpr int64_t kTileCols = kLanes* Isa::tileVectors(G);
// Rows of dy per block of the weight gradient.
constexpr int64_t kGradRows = 64;
static_assert(kGradRows % kLanes == 0 && kLanes % kGradGroup == 0);

// The positions where any of a group's G rows (or columns) of the sparse operand is nonzero: the
// indices of the dense operand's rows they multiply (the values are read from the sparse operand
// itself, see Sparse). Room for a whole vector stored past the end.
struct GroupList {
    std::vector<int32_t> at;
    void reserve(int64_t n) {
        if (static_cast<int64_t>(at.size()) < n + kLanes)
            at.resize(static_cast<size_t>(n + kLanes));
    }
};

// Where a list's entries are written: a raw pointer, read once per list, not again after each
// store (the vector stores may alias anything, the container's data pointer included).
struct ListOut {
    int32_t* at;
    explicit ListOut(GroupList& list) : at(list.at.data()) {}
};

template <int G>
inline int64_t appendGroup(const ListOut& out, int64_t count, const Vec* v, Mask lanes,
                           int32_t first, Ints steps) {
    return count + Isa::append<G>(v, lanes, first, steps, out.at + count);
}

// The sparse operand x (row stride ldx) as the groups read its values: by rows (the forward
// product: group p's member g is x's row G p + g, or outRows[G p + g], and a listed position is a
// column of it) or by columns (the weight gradient: member g is x's column G p + g, a listed
// position a row of it). A member past the last (count) reads the group's first instead: its
// sums are never stored. Only the positions are listed, not the values with them: storing two
// values beside each position tripled the lists' stores and bytes (for a Fashion-MNIST batch of
// 32, 75 KB of lists per half of the pixels, more than L1 holds), where the groups' values are
// a few lines of x that stay in L1 while a block's lists run. One core of the BF16 Xeon
// (AVX-512), Fashion-MNIST batches of 32, traindeck_bench_sparse, three alternating runs of
// each: the forward halves 16.2-18.1 us against 18.9-21.0 with the values listed (1.09-1.21x
// oneDNN's dense product against 0.93-1.04x), the weight gradient's 15.5-17.5 against 17.3-18.8;
// the same bits. The AVX2 kernels on that core: forward 2-3% shorter, weight gradient 3-7%
// longer alone, the seed MLP's step even or shorter (four alternating pairs).
struct Sparse {
    const float* x = nullptr;
    int64_t ldx = 0;
    int64_t count = 0;  // x's rows (by rows) or columns (by columns)
};

// Where group p's member g reads its values: vals[g][position * step], step 1 by rows and ldx
// by columns.
template <int G, bool Columns>
inline void memberValues(const Sparse& sx, const int32_t* outRows, int64_t p, const float** vals) {
    for (int g = 0; g < G; ++g) {
        const int64_t i = G * p + g < sx.count ? G * p + g : G * p;
        if constexpr (Columns)
            vals[g] = sx.x + i;
        else
            vals[g] = sx.x + (outRows ? int64_t{outRows[i]} : i) * sx.ldx;
    }
}

// acc[g][0..NV) += value(g, at[j]) * row(at[j]) for every listed position j in [s0, s1), where
// row(k) is the NV vectors at base + k * stride (the last masked by `last` when Masked) and
// value(g, k) is vals[g][k] by rows, vals[g][k * ldx] by columns. Each vector of the row is
// loaded into a register once for the G FMAs: folded into each FMA as a memory operand (what GCC
// does otherwise) it is loaded G times, and the loads, not the FMAs, set the pace.
// Isa::kListUnroll positions per turn of the loop (one where Masked).
template <int G, int NV, bool Masked, bool Columns>
inline void accumulate(Vec* acc, const GroupList& list, int64_t s0, int64_t s1, const float* base,
                       int64_t stride, const float* const* vals, int64_t ldx, Mask last) {
    const auto entry = [&](int64_t j) __attribute__((always_inline)) {
        const int64_t k = list.at[static_cast<size_t>(j)];
        const float* row = base + k * stride;
        const int64_t at = Columns ? k * ldx : k;
        Vec s[G];
        for (int g = 0; g < G; ++g) s[g] = Isa::broadcast(vals[g][at]);
        for (int t = 0; t < NV; ++t) {
            Vec v = Masked && t == NV - 1 ? Isa::loadMasked(row + kLanes * t, last)
                                          : Isa::load(row + kLanes * t);
            if constexpr (G > 1) Isa::keep(v);
            for (int g = 0; g < G; ++g) acc[g * NV + t] = Isa::fmadd(s[g], v, acc[g * NV + t]);
        }
    };
    // Masked, the mask takes a register, and two positions' operands no longer fit: GCC spilled
    // accumulators to the stack.
    constexpr int U = Masked ? 1 : Isa::kListUnroll;
    int64_t j = s0;
    for (; j + U <= s1; j += U)
#pragma GCC unroll 4
        for (int u = 0; u < U; ++u) entry(j + u);
    for (; j < s1; ++j) entry(j);
}

template <int NV, bool Masked>
inline void loadRow(Vec* acc, const float* p, Mask last) {
    for (int t = 0; t < NV; ++t)
        acc[t] = Masked && t == NV - 1 ? Isa::loadMasked(p + kLanes * t, last)
                                       : Isa::load(p + kLanes * t);
}

template <int NV, bool Masked>
inline void storeRow(float* p, const Vec* acc, Mask last) {
    for (int t = 0; t < NV; ++t) {
        if (Masked && t == NV - 1)
            Isa::storeMasked(p + kLanes * t, last, acc[t]);
        else
            Isa::store(p + kLanes * t, acc[t]);
    }
}

// Where a block of the dense operand's tile is copied before the groups read it (`to` null:
// read in place). The block's rows then lie kTileCols<G> floats apart in `to`, where the lists'
// positions (the rows) are read at that stride. Only the rows some list holds are copied (listed[k]
// nonzero): above the first layer, where the lists run over a ReLU's outputs, they may hold a
// tenth of the rows.
struct Packed {
    float* to = nullptr;
    int64_t rows = 0;  // rows per block
    const uint8_t* listed = nullptr;
};

// Group p's list over block b runs from seg[p * (blocks + 1) + b] to the next entry. For every
// block, every group p in [p0, p1): its output rows out(G p + g) (row stride ldo; those past
// `rows` absent) += its list over the block, from zero for the first block. blockRows: rows per
// block, for fetching the next block ahead (0: none).
template <int G, int NV, bool Masked, bool Columns>
void groupTile(const GroupList& list, const std::vector<int64_t>& seg, int64_t blocks,
               int64_t blockRows, int64_t denseRows, int64_t rows, const float* base,
               int64_t stride, float* out, int64_t ldo, Mask last, const int32_t* outRows,
               int64_t p0, int64_t p1, Packed pack, const Sparse& sx, int64_t outFirst) {
    // Group p's row g is output row outRows[G p + g] (null: G p + g), stored at out's row
    // (that row - outFirst).
    const auto outRow = [outRows, outFirst](int64_t r) {
        return (outRows ? int64_t{outRows[r]} : r) - outFirst;
    };
    const float* const dense = base;
    const int64_t groups = (rows + G - 1) / G;
    // The lists reach the dense rows in no order a hardware prefetcher follows, and those rows
    // may be in another core's cache (weights its update just wrote): each group fetches its
    // share of the next block's rows (where they lie, also when each block is packed) while it
    // works on this one.
    const int64_t share = blockRows > 0 ? (blockRows + groups - 1) / groups : 0;
    for (int64_t b = 0; b < blocks; ++b) {
        if (pack.to) {  // the block's tile, its rows one after the other; base as the lists see it
            constexpr int64_t P = kTileCols<G>;
            const int64_t k0 = b * pack.rows, k1 = std::min(denseRows, k0 + pack.rows);
            for (int64_t k = k0; k < k1; ++k) {
                if (!pack.listed[k]) continue;
                Vec row[NV];
                loadRow<NV, Masked>(row, dense + k * stride, last);
                for (int t = 0; t < NV; ++t)
                    Isa::store(pack.to + (k - k0) * P + kLanes * t, row[t]);
            }
            base = pack.to - k0 * P;
        }
        // The lists' positions are the dense operand's rows, at its stride or the packed one.
        const int64_t listStride = pack.to ? kTileCols<G> : stride;
        for (int64_t p = p0; p < p1; ++p) {
            const int64_t r0 = (b + 1) * blockRows + p * share;
            const int64_t r1 = std::min({r0 + share, (b + 2) * blockRows, denseRows});
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t c = 0; c < NV * kLanes; c += 16)  // a cache line at a time
                    _mm_prefetch(reinterpret_cast<const char*>(dense + r * stride + c),
                                 _MM_HINT_T1);
            const int present = static_cast<int>(std::min<int64_t>(G, rows - G * p));
            // One flat array: GCC keeps it in registers (an array of arrays it kept on the stack,
            // stored on every step of the list).
            Vec acc[G * NV];
            for (int g = 0; g < G; ++g) {
                if (b == 0 || g >= present) {
                    for (int t = 0; t < NV; ++t) acc[g * NV + t] = Isa::zero();
                } else {
                    loadRow<NV, Masked>(acc + g * NV, out + outRow(G * p + g) * ldo, last);
                }
            }
            const size_t at = static_cast<size_t>(p * (blocks + 1) + b);
            const float* vals[G];
            memberValues<G, Columns>(sx, outRows, p, vals);
            accumulate<G, NV, Masked, Columns>(acc, list, seg[at], seg[at + 1], base, listStride,
                                               vals, sx.ldx, last);
            for (int g = 0; g < G; ++g)  // a fixed count, unrolled: acc stays in registers
                if (g < present)
                    storeRow<NV, Masked>(out + outRow(G * p + g) * ldo, acc + g * NV, last);
        }
    }
}

// Calls f(std::integral_constant<int, nv>) for nv in [1, V].
template <int V, class F>
inline void withVectors(int nv, F&& f) {
    if constexpr (V > 1) {
        if (nv < V) return withVectors<V - 1>(nv, std::forward<F>(f));
    }
    f(std::integral_constant<int, V>{});
}

// out[rows, N] (row stride ldo) from the groups' lists over base[*, N] (row stride `stride`),
// tile of columns by tile; only groups [p0, p1) (their rows), output row r at out's row
// r - outFirst. The values from sx, by columns where Columns.
template <int G, bool Columns>
void runGroups(const GroupList& list, const std::vector<int64_t>& seg, int64_t blocks,
               int64_t blockRows, int64_t denseRows, int64_t rows, const float* base,
               int64_t stride, int64_t N, float* out, int64_t ldo, const int32_t* outRows,
               int64_t p0, int64_t p1, const Sparse& sx, Packed pack = {}, int64_t outFirst = 0) {
    for (int64_t c0 = 0; c0 < N; c0 += kTileCols<G>) {
        const int64_t cols = std::min(kTileCols<G>, N - c0);
        const int nv = static_cast<int>((cols + kLanes - 1) / kLanes);
        const int64_t lastLanes = cols - kLanes * (nv - 1);
        const Mask last = Isa::tail(lastLanes);
        withVectors<Isa::tileVectors(G)>(nv, [&](auto vectors) {
            constexpr int NV = decltype(vectors)::value;
            if (lastLanes == kLanes)
                groupTile<G, NV, false, Columns>(list, seg, blocks, blockRows, denseRows, rows,
                                                 base + c0, stride, out + c0, ldo, last, outRows,
                                                 p0, p1, pack, sx, outFirst);
            else
                groupTile<G, NV, true, Columns>(list, seg, blocks, blockRows, denseRows, rows,
                                                base + c0, stride, out + c0, ldo, last, outRows, p0,
                                                p1, pack, sx, outFirst);
        });
    }
}

// The order of x's rows that rowsTimesDense groups (rows order[G p .. G p + G) together):
// rows whose zeros sit in the same places, so a group's list (the positions where any of them is
// nonzero) is short. Each row's signature has one bit per run of 8 columns (modulo 64) that holds
// a nonzero; taking the rows in order, each unpaired row is paired with the later unpaired row
// whose signature differs in the fewest bits (the first such). On Fashion-MNIST batches of 32
// (each half of the pixels) pairs formed this way list 54% and 63% of the dense work, against 62%
// and 71% for neighbouring rows (random batches, 200 of them). Depends on the data alone. Above
// kPairRowsMax rows (or for groups other than pairs) the rows keep their order.
constexpr int64_t kPairRowsMax = 128;
void pairRows(const float* x, int64_t ldx, int64_t M, int64_t K, int32_t* order) {
    for (int64_t r = 0; r < M; ++r) order[r] = static_cast<int32_t>(r);
    if (kForwardGroup != 2 || M > kPairRowsMax || M < 3) return;
    uint64_t sig[kPairRowsMax];
    for (int64_t r = 0; r < M; ++r) {
        uint64_t bits = 0;
        const float* row = x + r * ldx;
        // The first line of every two (16 columns of 32): reading the rest pairs the rows no
        // better (simulated on Fashion-MNIST batches of 32, each half of the pixels: 53.8% and
        // 63.4% of the dense work listed, against 53.6% and 63.4%) and took 0.4-0.6 us more of
        // each thread's forward piece in the step (2.2-3.0 us against 1.8-2.4).
        for (int64_t k0 = 0; k0 < K; k0 += 32) {
            for (int64_t k = k0; k < std::min(K, k0 + 16); k += kLanes) {
                const Vec v = k + kLanes <= K ? Isa::load(row + k)
                                              : Isa::loadMasked(row + k, Isa::tail(K - k));
                const uint64_t lanes = Isa::nonzeroLanes(v);
                // Without a branch: a new batch each call leaves the predictor nothing to
                // learn (traindeck_bench_sparse --fresh on one core of the BF16 Xeon, three
                // alternating runs: the forward halves 1.09-1.16x and 0.98-1.00x oneDNN's dense
                // product against 1.05-1.08x and 0.91-1.02x with a branch per run of 8 columns).
                for (int64_t c = 0; c < kLanes / 8; ++c)
                    bits |= uint64_t{((lanes >> (8 * c)) & 0xFF) != 0} << ((k / 8 + c) % 64);
            }
        }
        sig[r] = bits;
    }
    bool used[kPairRowsMax] = {};
    int64_t n = 0;
    for (int64_t i = 0; i < M; ++i) {
        if (used[i]) continue;
        used[i] = true;
        order[n++] = static_cast<int32_t>(i);
        // The first unpaired row with the fewest differing bits, without a branch per row: a
        // key orders by differing bits, then by row, and a paired row's is past every other.
        uint64_t bestKey = ~uint64_t{0};
        for (int64_t j = i + 1; j < M; ++j) {
            const auto d = static_cast<uint64_t>(__builtin_popcountll(sig[i] ^ sig[j])) +
                           (used[j] ? 128u : 0u);
            bestKey = std::min(bestKey, d << 32 | static_cast<uint64_t>(j));
        }
        const int64_t best =
            (bestKey >> 32) < 128 ? static_cast<int64_t>(bestKey & 0xFFFFFFFFu) : -1;
        if (best >= 0) {
            used[best] = true;
            order[n++] = static_cast<int32_t>(best);
        }
    }
}

// y = x . w: the lists run over groups of x's rows, by blocks of K (w's block stays in L1).
// A tile narrower than w's rows takes a few of the cache lines of each row, and where the rows
// lie 2 KB apart or more (kPackMinStrideBytes: 512 outputs and up) those lines fall in one or
// two ranges of L1's sets, which hold 8 or 16 rows of a block of 80: the block keeps evicting
// itself. There (where the Isa packs, kPackBlocks) each block of a tile of w is first copied into
// a buffer of the thread's, its rows one after the other (Packed). The same sums in the same
// order, so the same bits. One core of the 2-core AVX2 machine, Fashion-MNIST batches of 32, the
// variants alternating call by call (means of 600 calls, two runs): half of K (392 rows) with 1024
// outputs, 371-385 us packed in blocks of 96 rows against 480-499 in place; at 10% density (a
// ReLU's output), 230-232 against 231-233. At 128 outputs (512 bytes a row) it saved nothing:
// half of K, four runs, 42.4, 53.3, 60.4 and 67.2 us packed in blocks of 144 rows against 40.7,
// 53.6, 55.7 and 67.5 in place.
constexpr int64_t kPackMinStrideBytes = 2048;

// The most rows of a block read in place whose tile stays in L1 (Isa::kL1Ways; 0: no bound but
// the block's bytes). A line at address a sits in L1 set (a / 64) mod 64, so rows rowBytes apart
// come back to the same sets every kL1WayBytes / gcd(rowBytes, kL1WayBytes) rows: past that many
// times the ways, a block's rows evict each other. The seed MLP's rows (128 outputs, 512 bytes)
// return every 8 rows, and the AVX2 machine's L1 (Zen 3, 8 ways) holds 64 of them: blocks of 80
// rows (what the block's 16 KB held) kept 10 rows in 8 ways. One core, Fashion-MNIST batches of
// 32, half of K, the variants alternating call by call (traindeck_bench_sparse, medians of five
// runs): the first half 29.4-50.5 us in blocks of 64 against 30.3-53.2 in blocks of 80, the
// second half 31.9-51.8 against 33.9-55.4 (the host's load moved both between runs); blocks of
// 48 took as long as 64, 32 and fewer longer (each block's partial sums loaded and stored again).
constexpr int64_t kL1WayBytes = 64 * 64;
constexpr int64_t inPlaceBlockRows(int64_t rowBytes) {
    if (Isa::kL1Ways == 0) return std::numeric_limits<int64_t>::max();
    return kL1WayBytes / std::gcd(rowBytes, kL1WayBytes) * Isa::kL1Ways;
}

int64_t rowsTimesDense(const float* x, int64_t ldx, int64_t M, int64_t K, const float* w,
                       int64_t ldw, int64_t N, float* y, int64_t ldy) {
    constexpr int G = kForwardGroup;
    thread_local GroupList list;
    thread_local std::vector<int64_t> seg;
    thread_local std::vector<int32_t> order;
    thread_local std::vector<float> packed;
    thread_local std::vector<uint8_t> listedRows;
    order.resize(static_cast<size_t>(M));
    pairRows(x, ldx, M, K, order.data());
    const bool packs = Isa::kPackBlocks && ldw * 4 >= kPackMinStrideBytes;
    const int64_t tileBytes = 4 * std::min<int64_t>(N, kTileCols<G>);
    const int64_t kBlock = std::max<int64_t>(
        16, (packs ? Isa::kPackedBlockBytes / tileBytes
                   : std::min(Isa::kBlockBytes / tileBytes, inPlaceBlockRows(ldw * 4))) /
                16 * 16);
    const int64_t blocks = std::max<int64_t>(1, (K + kBlock - 1) / kBlock);
    const int64_t groups = (M + G - 1) / G;
    list.reserve(groups * K);
    seg.resize(static_cast<size_t>(groups * (blocks + 1)));
    int64_t count = 0;
    const Ints steps = Isa::lanesTimes(1);
    const ListOut out(list);
    const Mask all = Isa::tail(kLanes);
    // Whole vectors, then the block's tail; the rows' addresses and the list's read once. With
    // pairRows' cheaper signature: pairing and listing both halves of a Fashion-MNIST batch of
    // 32 (one core of the AVX2 machine, no product) 7.2 us against 10.1-10.4.
    for (int64_t p = 0; p < groups; ++p) {
        const int64_t present = std::min<int64_t>(G, M - G * p);
        const float* src[G];
        for (int g = 0; g < G; ++g)  // past the last row: no row to read (nor an order entry)
            src[g] = g < present ? x + order[static_cast<size_t>(G * p + g)] * ldx : nullptr;
        for (int64_t b = 0; b < blocks; ++b) {
            seg[static_cast<size_t>(p * (blocks + 1) + b)] = count;
            const int64_t k1 = std::min(K, (b + 1) * kBlock);
            int64_t k = b * kBlock;
            for (; k + kLanes <= k1; k += kLanes) {
                Vec v[G];
                for (int g = 0; g < G; ++g) v[g] = src[g] ? Isa::load(src[g] + k) : Isa::zero();
                count = appendGroup<G>(out, count, v, all, static_cast<int32_t>(k), steps);
            }
            if (k < k1) {
                const Mask lanes = Isa::tail(k1 - k);
                Vec v[G];
                for (int g = 0; g < G; ++g)
                    v[g] = src[g] ? Isa::loadMasked(src[g] + k, lanes) : Isa::zero();
                count = appendGroup<G>(out, count, v, lanes, static_cast<int32_t>(k), steps);
            }
        }
        seg[static_cast<size_t>(p * (blocks + 1) + blocks)] = count;
    }
    // No prefetching (blockRows 0): the forward product runs along K, on the weight rows this
    // core updated, already in its cache; prefetching them measured slower (on the AVX2 machine
    // too, where those rows no longer fit its L2 with their slots: 37.8-38.9 us against
    // 39.4-41.6 with prefetching, six alternating pairs in the step).
    Packed pack;
    if (packs) {
        packed.resize(static_cast<size_t>(kBlock * kTileCols<G>));
        listedRows.assign(static_cast<size_t>(K), 0);
        for (int64_t j = 0; j < count; ++j)
            listedRows[static_cast<size_t>(list.at[static_cast<size_t>(j)])] = 1;
        pack = Packed{packed.data(), kBlock, listedRows.data()};
    }
    runGroups<G, false>(list, seg, blocks, 0, K, M, w, ldw, N, y, ldy, order.data(), 0, groups,
                        Sparse{x, ldx, M}, pack);
    return count;
}

// The lists of transposedTimesDense's groups of columns [k0, k0 + width) of x (all kLanes of them
// where Whole), kLanes rows at a time: the tile of x transposed in registers, then each group's
// list appended. Group p's list starts at p * room; seg[p * (blocks + 1) + b] where row block b
// starts in it, then its end. The counts stay in registers (a constant number of groups where
// Whole), and whole tiles load without masks. Listing both halves of a Fashion-MNIST batch of 32
// (one core of the AVX2 machine, no product): 5.4 us against 6.0-6.3.
template <int G, bool Whole>
inline void listColumns(const float* x, int64_t ldx, int64_t B, int64_t k0, int64_t width,
                        int64_t room, int64_t blocks, const ListOut& out, Ints steps, int64_t* seg,
                        int64_t& entries) {
    constexpr int64_t kMaxGroups = kLanes / G;
    const Mask cols = Isa::tail(width);
    const int64_t firstGroup = k0 / G;
    const int64_t groupsHere = Whole ? kMaxGroups : (width + G - 1) / G;
    int64_t count[kMaxGroups];
#pragma GCC unroll 16
    for (int64_t q = 0; q < kMaxGroups; ++q) count[q] = (firstGroup + q) * room;
    for (int64_t r0 = 0; r0 < B; r0 += kLanes) {
        Vec r[kLanes];
        const int64_t height = std::min<int64_t>(kLanes, B - r0);
        const float* src = x + r0 * ldx + k0;
#pragma GCC unroll 16
        for (int64_t i = 0; i < kLanes; ++i)
            r[i] = height < kLanes && i >= height ? Isa::zero()
                   : Whole                        ? Isa::load(src + i * ldx)
                                                  : Isa::loadMasked(src + i * ldx, cols);
        Isa::transpose(r);  // lanes past `width` are zero columns
        const Mask rows = Isa::tail(height);
        const bool blockStart = r0 % kGradRows == 0;
#pragma GCC unroll 16
        for (int64_t q = 0; q < kMaxGroups; ++q) {
            if (!Whole && q >= groupsHere) break;
            if (blockStart) seg[(firstGroup + q) * (blocks + 1) + r0 / kGradRows] = count[q];
            count[q] =
                appendGroup<G>(out, count[q], r + G * q, rows, static_cast<int32_t>(r0), steps);
        }
    }
    for (int64_t q = 0; q < groupsHere; ++q) {
        seg[(firstGroup + q) * (blocks + 1) + blocks] = count[q];
        entries += count[q] - (firstGroup + q) * room;
    }
}

// Whether the weight gradient copies each block of dy's tile into a buffer of the thread's before
// the groups read it (Packed), as rowsTimesDense does where the Isa packs: where dy's rows lie
// kPackMinStrideBytes apart or more, a block's 64 rows read in place fall in a few of L1's sets
// (rows 4 KiB apart: eight of its 64) and evict each other. One core, Fashion-MNIST batches,
// 1,024 outputs, `taskset -c 1 build/traindeck_bench_sparse --units 1024 --fresh`, each half of
// the pixels against oneDNN: batch 256 0.90-0.97x packed against 0.75-0.82x in place (AVX-512
// kernels) and 0.54-0.61x against 0.43-0.45x (AVX2 kernels on the same core), batch 128 0.89-1.00x
// against 0.69-0.76x, batch 32 1.09-1.35x against 0.89-1.04x; `--density 1` at batch 256
// 0.77-0.80x against 0.51-0.52x (the in-place reads measured with a switch since removed). The
// same sums in the same order, so the same bits.
inline bool packsGradBlocks(int64_t ldy) {
    return ldy * 4 >= kPackMinStrideBytes;
}

// dw = x^T . dy: the lists run over groups of x's neighbouring columns (neighbouring inputs,
// such as pixels, are often zero together), by blocks of dy's rows; kLanes x kLanes tiles of x
// are transposed in registers to read its columns.
int64_t transposedTimesDense(const float* x, int64_t ldx, int64_t B, int64_t K, const float* dy,
                             int64_t ldy, int64_t N, float* dw, int64_t lddw) {
    constexpr int G = kGradGroup;
    thread_local GroupList list;
    thread_local std::vector<int64_t> seg;
    const int64_t blocks = std::max<int64_t>(1, (B + kGradRows - 1) / kGradRows);
    const int64_t groups = (K + G - 1) / G;
    // Group p's list starts at p * room (its entries in row order, so row blocks follow each
    // other); seg[p * (blocks + 1) + b] where row block b starts in it, then its end.
    const int64_t room = (B + kLanes - 1) / kLanes * kLanes + kLanes;
    list.reserve(groups * room);
    seg.resize(static_cast<size_t>(groups * (blocks + 1)));
    int64_t entries = 0;
    const Ints steps = Isa::lanesTimes(1);
    const ListOut out(list);
    for (int64_t k0 = 0; k0 < K; k0 += kLanes) {
        if (K - k0 >= kLanes)
            listColumns<G, true>(x, ldx, B, k0, kLanes, room, blocks, out, steps, seg.data(),
                                 entries);
        else
            listColumns<G, false>(x, ldx, B, k0, K - k0, room, blocks, out, steps, seg.data(),
                                  entries);
    }
    thread_local std::vector<float> packed;
    thread_local std::vector<uint8_t> everyRow;
    Packed pack;
    if (packsGradBlocks(ldy)) {
        packed.resize(static_cast<size_t>(kGradRows * kTileCols<G>));
        if (everyRow.size() < static_cast<size_t>(B)) everyRow.assign(static_cast<size_t>(B), 1);
        pack = Packed{packed.data(), kGradRows, everyRow.data()};
    }
    if (K > 0)
        runGroups<G, true>(list, seg, blocks, kGradRows, B, K, dy, ldy, N, dw, lddw, nullptr, 0,
                           (K + G - 1) / G, Sparse{x, ldx, K}, pack, 0);
    return entries;
}

// Rows r0 .. r0 + R of the narrow product, NV vectors of columns (the last masked by `last`,
// except in the first `wholeTails` rows: see narrowAll).
template <int R, int NV>
inline void narrowRows(const float* a, int64_t sr, int64_t sk, int64_t K, const float* b,
                       int64_t ldb, const float* bias, float* c, int64_t ldc, Mask last,
                       int wholeTails) {
    Vec acc[R * NV];
#pragma GCC unroll 16
    for (int i = 0; i < R * NV; ++i) acc[i] = Isa::zero();
    for (int64_t k = 0; k < K; ++k) {
        const float* bk = b + k * ldb;
        Vec v[NV];
#pragma GCC unroll 2
        for (int t = 0; t < NV; ++t)
            v[t] =
                t == NV - 1 ? Isa::loadMasked(bk + kLanes * t, last) : Isa::load(bk + kLanes * t);
        const float* ak = a + k * sk;
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const Vec s = Isa::broadcast(ak[r * sr]);
#pragma GCC unroll 2
            for (int t = 0; t < NV; ++t) acc[r * NV + t] = Isa::fmadd(s, v[t], acc[r * NV + t]);
        }
    }
    if (bias) {
#pragma GCC unroll 2
        for (int t = 0; t < NV; ++t) {
            const Vec bv = t == NV - 1 ? Isa::loadMasked(bias + kLanes * t, last)
                                       : Isa::load(bias + kLanes * t);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) acc[r * NV + t] = acc[r * NV + t] + bv;
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
        for (int t = 0; t < NV; ++t) {
            float* p = c + r * ldc + kLanes * t;
            if (t == NV - 1 && r >= wholeTails)
                Isa::storeMasked(p, last, acc[r * NV + t]);
            else
                Isa::store(p, acc[r * NV + t]);
        }
}

// Rows R at a time, R * NV accumulators (12 with two vectors, 8 with one: the broadcasts are
// loads too), then the rest one by one. Where c's rows follow each other (ldc == N), a row's last
// vector is stored whole when it ends inside c: what it writes past the row belongs to the rows
// after it, stored later (in row order); the last rows' are masked. AMD's masked stores are slow
// (the seed MLP's weight gradient [128,32] x [32,10] has 128 of them: see narrowProduct).
template <int NV>
void narrowAll(const float* a, int64_t sr, int64_t sk, int64_t M, int64_t K, const float* b,
               int64_t ldb, int64_t N, const float* bias, float* c, int64_t ldc, Mask last) {
    constexpr int R = NV == 1 ? 8 : 4;
    // The rows r + i (i < rows) whose whole last vector ends inside c: i <= lastWhole - r.
    const int64_t lastWhole = (M * ldc - kLanes * NV) / std::max<int64_t>(ldc, 1);
    const auto whole = [&](int64_t r, int64_t rows) {
        return ldc != N || M * ldc < kLanes * NV
                   ? 0
                   : static_cast<int>(std::clamp<int64_t>(lastWhole - r + 1, 0, rows));
    };
    int64_t r = 0;
    for (; r + R <= M; r += R)
        narrowRows<R, NV>(a + r * sr, sr, sk, K, b, ldb, bias, c + r * ldc, ldc, last, whole(r, R));
    for (; r < M; ++r)
        narrowRows<1, NV>(a + r * sr, sr, sk, K, b, ldb, bias, c + r * ldc, ldc, last, whole(r, 1));
}

// A narrow product (sparse_kernels.h). The seed MLP's output layer on the AVX2 machine (Zen 3),
// TRAINDECK_PROFILE=1 against the pass cpu_narrow_kernel off: its forward product [32,128] x
// [128,10] with the bias 1.7 us against oneDNN's 3.7-4.0, its weight gradient [128,32] x
// [32,10] 2.2 against 3.0; at batch 256 12.4 against 15.6 and 12.6 against 14.4. Four rows at a
// time with two vectors (five or six measured slower: 1.9 us), eight with one. The loops over the
// accumulators are unrolled explicitly: left to GCC, it kept them in registers but also stored
// every one to the stack on every step of k (3x slower). With the rows' last vectors stored whole
// (narrowAll) the weight gradient took 1.8 us in the step (timestamps, a quiet run)
// against 2.3.
void narrowProduct(const float* a, int64_t sr, int64_t sk, int64_t M, int64_t K, const float* b,
                   int64_t ldb, int64_t N, const float* bias, float* c, int64_t ldc) {
    const int64_t lastLanes = N > kLanes ? N - kLanes : N;
    const Mask last = Isa::tail(lastLanes);
    if (N > kLanes)
        narrowAll<2>(a, sr, sk, M, K, b, ldb, N, bias, c, ldc, last);
    else
        narrowAll<1>(a, sr, sk, M, K, b, ldb, N, bias, c, ldc, last);
}

// Rows r0, r0 + 1 (R of them) of the short product, NV vectors of columns from bt (a [K,N]
// buffer, row stride ldt), the last vector masked by `last` when Masked.
template <int R, int NV, bool Masked>
inline void shortRows(const float* a, int64_t lda, int64_t K, const float* bt, int64_t ldt,
                      float* c, int64_t ldc, Mask last) {
    Vec acc[R * NV];
#pragma GCC unroll 16
    for (int i = 0; i < R * NV; ++i) acc[i] = Isa::zero();
    for (int64_t k = 0; k < K; ++k) {
        Vec s[R];
#pragma GCC unroll 2
        for (int r = 0; r < R; ++r) s[r] = Isa::broadcast(a[r * lda + k]);
        const float* row = bt + k * ldt;
#pragma GCC unroll 8
        for (int t = 0; t < NV; ++t) {
            Vec v = Masked && t == NV - 1 ? Isa::loadMasked(row + kLanes * t, last)
                                          : Isa::load(row + kLanes * t);
            Isa::keep(v);
#pragma GCC unroll 2
            for (int r = 0; r < R; ++r) acc[r * NV + t] = Isa::fmadd(s[r], v, acc[r * NV + t]);
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) storeRow<NV, Masked>(c + r * ldc, acc + r * NV, last);
}

constexpr int64_t kShortMaxInner = 16;

// The short product (sparse_kernels.h). The seed MLP's output layer's input gradient, [32,10] x
// [128,10]^T, on the AVX2 machine (Zen 3): 1.40 us on one core; in the step (beside the other
// backward instructions, timestamps) 1.6-1.9 us against oneDNN's 2.9-3.3, the backward
// instructions between the two large products 8.9-9.4 us against 10.3-10.8 (three alternating
// pairs).
void shortProduct(const float* a, int64_t lda, int64_t M, int64_t K, const float* b, int64_t ldb,
                  int64_t N, float* c, int64_t ldc) {
    thread_local std::vector<float> bt;
    const int64_t ldt = (N + kLanes - 1) / kLanes * kLanes;
    if (static_cast<int64_t>(bt.size()) < K * ldt) bt.resize(static_cast<size_t>(K * ldt));
    // kLanes x kLanes tiles of b transposed in registers (rows past N and columns past K zero).
    for (int64_t n0 = 0; n0 < N; n0 += kLanes) {
        const int64_t height = std::min<int64_t>(kLanes, N - n0);
        for (int64_t k0 = 0; k0 < K; k0 += kLanes) {
            const int64_t width = std::min<int64_t>(kLanes, K - k0);
            const Mask cols = Isa::tail(width);
            Vec r[kLanes];
            for (int64_t i = 0; i < kLanes; ++i)
                r[i] = i < height ? Isa::loadMasked(b + (n0 + i) * ldb + k0, cols) : Isa::zero();
            Isa::transpose(r);
            for (int64_t j = 0; j < width; ++j) Isa::store(bt.data() + (k0 + j) * ldt + n0, r[j]);
        }
    }
    constexpr int kTile = Isa::tileVectors(2);
    for (int64_t c0 = 0; c0 < N; c0 += kTile * kLanes) {
        const int64_t cols = std::min<int64_t>(kTile * kLanes, N - c0);
        const int nv = static_cast<int>((cols + kLanes - 1) / kLanes);
        const int64_t lastLanes = cols - kLanes * (nv - 1);
        const Mask last = Isa::tail(lastLanes);
        withVectors<kTile>(nv, [&](auto vectors) {
            constexpr int NV = decltype(vectors)::value;
            auto rows = [&](auto masked) {
                constexpr bool Masked = decltype(masked)::value;
                int64_t r = 0;
                for (; r + 2 <= M; r += 2)
                    shortRows<2, NV, Masked>(a + r * lda, lda, K, bt.data() + c0, ldt,
                                             c + r * ldc + c0, ldc, last);
                if (r < M)
                    shortRows<1, NV, Masked>(a + r * lda, lda, K, bt.data() + c0, ldt,
                                             c + r * ldc + c0, ldc, last);
            };
            if (lastLanes == kLanes)
                rows(std::false_type{});
            else
                rows(std::true_type{});
        });
    }
}

}  // namespace

const Kernels& sparseTable() {
    static constexpr Kernels k{&rowsTimesDense, &transposedTimesDense, &pairRows,  &narrowProduct,
                               2 * kLanes,      kForwardGroup,         kGradGroup, &shortProduct,
                               kShortMaxInner};
    return k;
}

}  // namespace td::cpu::TD_SPARSE_ISA_NAMESPACE
