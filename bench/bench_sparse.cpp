// The zero-skipping products (engine/backend/cpu/sparse_kernels.h) against oneDNN, side by side
// on one thread, at the shapes of the first layer of an MLP trained with the batch split along K
// between two threads: each half of the pixels' forward product, [B,K/2]x[K/2,N] with the batch
// at stride K, and its weight gradient, [K/2,B]x[B,N] (the batch read transposed). The batches
// are Fashion-MNIST's (scaled to [0, 1], so the background's zeros stay zeros), drawn at random,
// or random values with the given share of nonzeros (--density). Prints each product's time per
// run both ways (the median of --rounds alternating rounds), the ratio, and the share of the
// dense work the kernel listed.
//
//   traindeck_bench_sparse [--batch 32] [--units 128] [--rounds 7] [--repeat 400]
//                          [--density 0.5] [--fresh]
//
// By default each round repeats one batch, so the caches and the branch predictor see the same
// data on every call; --fresh gives every call the next of kFreshBatches batches of the round,
// as training does (a new batch every step).
//
// Run it pinned to one core for steady figures: taskset -c 0 build/traindeck_bench_sparse
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "dnnl.hpp"
#include "engine/backend/cpu/sparse_kernels.h"
#include "engine/data/pipeline.h"

namespace {

constexpr int kFreshBatches = 64;
using Clock = std::chrono::steady_clock;

dnnl::memory::desc strided(int64_t rows, int64_t cols, int64_t rowStride, int64_t colStride) {
    return dnnl::memory::desc({rows, cols}, dnnl::memory::data_type::f32,
                              dnnl::memory::dims{rowStride, colStride});
}

template <class F>
double microsPerRun(int repeat, F&& run) {
    for (int i = 0; i < repeat / 10 + 1; ++i) run();
    const auto t0 = Clock::now();
    for (int i = 0; i < repeat; ++i) run();
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / repeat;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Zero-skipping products against oneDNN at an MLP's first-layer shapes"};
    int64_t batch = 32, units = 128;
    int rounds = 7, repeat = 400;
    bool fresh = false;
    double density = -1;
    app.add_option("--batch", batch, "Batch size")->check(CLI::PositiveNumber);
    app.add_option("--units", units, "Outputs of the layer")->check(CLI::PositiveNumber);
    app.add_option("--rounds", rounds, "Alternating rounds (the median is printed)")
        ->check(CLI::PositiveNumber);
    app.add_option("--repeat", repeat, "Runs per round and product")->check(CLI::PositiveNumber);
    app.add_flag("--fresh", fresh,
                 "A new batch every call (one of 64 per round), as in training, instead of one "
                 "batch repeated");
    app.add_option("--density", density,
                   "Random values with this share of nonzeros instead of Fashion-MNIST")
        ->check(CLI::Range(0.0, 1.0));
    CLI11_PARSE(app, argc, argv);

    // The level TRAINDECK_ISA chose (the CPU's best by default), as the engine picks it.
    const td::CpuIsaChoice& isa = td::activeCpuIsa();
    if (!isa.error.empty()) {
        std::fprintf(stderr, "%s\n", isa.error.c_str());
        return 2;
    }
    const td::cpu::sparse::Kernels* kernels = td::cpu::sparse::forIsa(isa.isa);
    if (!kernels) {
        std::fprintf(stderr, "no zero-skipping kernels at the %s level: the products stay dense\n",
                     td::cpuIsaName(isa.isa));
        return 1;
    }
    // The batches: `rounds` of them, each [batch, K] row-major.
    int64_t K = 784;
    std::mt19937 rng(7);
    // 64-byte aligned, as the engine's buffers are (td::Tensor): rows of 128 floats then start on
    // cache lines.
    auto floats = [](int64_t n) { return td::Tensor(td::DType::F32, td::Shape{n}); };
    const int perRound = fresh ? kFreshBatches : 1;
    std::vector<td::Tensor> batches(static_cast<size_t>(rounds * perRound));
    std::string what;
    if (density < 0) {
        td::SourceConfig cfg;
        cfg.type = "fashion_mnist";
        auto splits = td::loadSource(cfg);
        if (!splits.ok()) {
            std::fprintf(stderr, "%s\n", splits.error().c_str());
            return 1;
        }
        const td::Tensor& x = splits.value().train.x;
        if (x.dtype() != td::DType::U8) {
            std::fprintf(stderr, "Fashion-MNIST: expected u8 images\n");
            return 1;
        }
        K = x.size() / x.dim(0);
        const auto* pixels = x.data<uint8_t>();
        std::uniform_int_distribution<int64_t> pick(0, x.dim(0) - 1);
        for (auto& b : batches) {
            b = floats(batch * K);
            for (int64_t i = 0; i < batch; ++i) {
                const uint8_t* row = pixels + pick(rng) * K;
                for (int64_t k = 0; k < K; ++k)
                    b.data<float>()[i * K + k] = static_cast<float>(row[k]) / 255.0f;
            }
        }
        what = "Fashion-MNIST batches";
    } else {
        std::uniform_real_distribution<float> unit(0.f, 1.f);
        for (auto& b : batches) {
            b = floats(batch * K);
            for (int64_t i = 0; i < b.size(); ++i)
                b.data<float>()[i] = unit(rng) < density ? unit(rng) : 0.f;
        }
        what = "random batches, " + std::to_string(density) + " nonzero";
    }
    int64_t nonzero = 0;
    for (const auto& b : batches)
        nonzero += std::count_if(b.data<float>(), b.data<float>() + b.size(),
                                 [](float v) { return v != 0.f; });
    std::printf(
        "%s (%.1f%% nonzero), batch %lld, %lld units, one thread, %s kernels\n", what.c_str(),
        100.0 * static_cast<double>(nonzero) /
            static_cast<double>(static_cast<int64_t>(batches.size()) * batch * K),
        static_cast<long long>(batch), static_cast<long long>(units), td::cpuIsaName(isa.isa));

    std::uniform_real_distribution<float> uni(-0.1f, 0.1f);
    td::Tensor wt = floats(K * units), dyt = floats(batch * units), yt = floats(batch * units),
               dwt = floats(K * units);
    float* w = wt.data<float>();
    float* dy = dyt.data<float>();
    float* y = yt.data<float>();
    float* dw = dwt.data<float>();
    for (int64_t i = 0; i < wt.size(); ++i) w[i] = uni(rng);
    for (int64_t i = 0; i < dyt.size(); ++i) dy[i] = uni(rng);

    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    const int64_t halves[2][2] = {{0, K / 2}, {K / 2, K}};
    std::printf("%-32s %12s %12s %8s %14s\n", "product", "oneDNN us", "skipping us", "x",
                "work listed");
    for (const auto& h : halves) {
        const int64_t lo = h[0], n = h[1] - h[0];
        // Forward: y[B,N] = x[:, lo:lo+n] . w[lo:lo+n, :]; gradient: dw[lo:lo+n, :] = x^T dy.
        dnnl::matmul fwd(dnnl::matmul::primitive_desc(
            dnnl::matmul::desc(strided(batch, n, K, 1), strided(n, units, units, 1),
                               strided(batch, units, units, 1)),
            eng));
        dnnl::matmul grad(dnnl::matmul::primitive_desc(
            dnnl::matmul::desc(strided(n, batch, 1, K), strided(batch, units, units, 1),
                               strided(n, units, units, 1)),
            eng));
        std::vector<double> fwdDense, fwdSkip, gradDense, gradSkip;
        double fwdWork = 0, gradWork = 0;
        for (int r = 0; r < rounds; ++r) {
            float* x = batches[static_cast<size_t>(r * perRound)].data<float>();
            // The batch of each call: the round's one, or with --fresh the next of the round's.
            int call = 0;
            auto next = [&] {
                call = (call + 1) % perRound;
                return batches[static_cast<size_t>(r * perRound + call)].data<float>();
            };
            std::unordered_map<int, dnnl::memory> fwdArgs{
                {DNNL_ARG_SRC, dnnl::memory(strided(batch, n, K, 1), eng, x + lo)},
                {DNNL_ARG_WEIGHTS, dnnl::memory(strided(n, units, units, 1), eng, w + lo * units)},
                {DNNL_ARG_DST, dnnl::memory(strided(batch, units, units, 1), eng, y)}};
            std::unordered_map<int, dnnl::memory> gradArgs{
                {DNNL_ARG_SRC, dnnl::memory(strided(n, batch, 1, K), eng, x + lo)},
                {DNNL_ARG_WEIGHTS, dnnl::memory(strided(batch, units, units, 1), eng, dy)},
                {DNNL_ARG_DST, dnnl::memory(strided(n, units, units, 1), eng, dw + lo * units)}};
            int64_t listed = 0, listedT = 0;
            fwdDense.push_back(microsPerRun(repeat, [&] {
                if (fresh) fwdArgs.at(DNNL_ARG_SRC).set_data_handle(next() + lo);
                fwd.execute(strm, fwdArgs);
            }));
            fwdSkip.push_back(microsPerRun(repeat, [&] {
                listed = kernels->rowsTimesDense(next() + lo, K, batch, n, w + lo * units, units,
                                                 units, y, units);
            }));
            gradDense.push_back(microsPerRun(repeat, [&] {
                if (fresh) gradArgs.at(DNNL_ARG_SRC).set_data_handle(next() + lo);
                grad.execute(strm, gradArgs);
            }));
            gradSkip.push_back(microsPerRun(repeat, [&] {
                listedT = kernels->transposedTimesDense(next() + lo, K, batch, n, dy, units, units,
                                                        dw + lo * units, units);
            }));
            const int64_t g = kernels->rowsGroup, gt = kernels->colsGroup;
            fwdWork += static_cast<double>(listed) / static_cast<double>((batch + g - 1) / g * n);
            gradWork +=
                static_cast<double>(listedT) / static_cast<double>((n + gt - 1) / gt * batch);
        }
        auto row = [&](const std::string& name, const std::vector<double>& dense,
                       const std::vector<double>& skip, double work) {
            const double d = median(dense), s = median(skip);
            std::printf("%-32s %12.2f %12.2f %7.2fx %13.0f%%\n", name.c_str(), d, s, d / s,
                        100.0 * work / rounds);
        };
        const std::string cols = "pixels " + std::to_string(lo) + "-" + std::to_string(lo + n - 1);
        row("forward, " + cols, fwdDense, fwdSkip, fwdWork);
        row("weight gradient, " + cols, gradDense, gradSkip, gradWork);
    }
    return 0;
}
