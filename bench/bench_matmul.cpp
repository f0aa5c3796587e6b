// The matrix products of one training step of an MLP, alone, through oneDNN with the same
// thread count: the rate a trainer could reach if nothing but its matmuls took time. Prints the
// time per step of those products and, given a measured training rate (samples/s), the share of
// the step they account for: the fraction of oneDNN's own matmul rate the trainer reaches.
//
//   traindeck_bench_matmul --layers 784,1024,1024,10 --batch 256 [--threads 2] [--repeat 50]
//                          [--trainer-samples-per-s 20000]
//
// Per layer with input width K, output width N and batch M: forward [M,K]x[K,N]; the weight
// gradient [K,M]x[M,N] (the input transposed); the input gradient [M,N]x[N,K] (the weights
// transposed) for every layer but the first, as a trainer computes them. Every operand starts on
// a cache line, but the right operands of the forward and input-gradient products (the weights)
// are placed as TrainDeck's CPU device places them on this CPU (cpu::weightsOffsetFor): 16 bytes
// past a line where oneDNN runs AVX2 kernels and the rows are a multiple of 1 KiB long (there
// its gemm is fastest so), on the line elsewhere. --weights-aligned and --weights-offset force
// one placement, to see the difference.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "dnnl.hpp"
#include "engine/backend/cpu/weight_placement.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Product {
    std::string what;
    int64_t m, k, n;
    bool transA, transB;
};

dnnl::memory::desc matDesc(int64_t rows, int64_t cols, bool transposed) {
    using dnnl::memory;
    memory::dims strides = transposed ? memory::dims{1, rows} : memory::dims{cols, 1};
    return memory::desc({rows, cols}, memory::data_type::f32, strides);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"oneDNN matmul rate at the shapes of an MLP's training step"};
    std::string layersText = "784,1024,1024,10";
    int64_t batch = 256;
    int threads = 2, repeat = 50;
    double trainerRate = 0;
    bool weightsAligned = false, weightsOffset = false;
    app.add_option("--layers", layersText, "Widths from the input to the output");
    app.add_option("--batch", batch, "Batch size")->check(CLI::PositiveNumber);
    app.add_option("--threads", threads, "OpenMP threads")->check(CLI::PositiveNumber);
    app.add_option("--repeat", repeat, "Timed steps (after 5 warm-up steps)")
        ->check(CLI::PositiveNumber);
    app.add_option("--trainer-samples-per-s", trainerRate,
                   "A trainer's measured samples/s on this model and batch, to compare with");
    auto* aligned = app.add_flag("--weights-aligned", weightsAligned,
                                 "Every weight matrix on a cache line (default: as TrainDeck "
                                 "places them on this CPU)");
    app.add_flag("--weights-offset", weightsOffset,
                 "Every weight matrix 16 bytes past a cache line")
        ->excludes(aligned);
    CLI11_PARSE(app, argc, argv);

    std::vector<int64_t> widths;
    {
        std::stringstream ss(layersText);
        std::string item;
        while (std::getline(ss, item, ',')) widths.push_back(std::atoll(item.c_str()));
    }
    if (widths.size() < 2 ||
        std::any_of(widths.begin(), widths.end(), [](int64_t w) { return w <= 0; })) {
        std::fprintf(stderr, "bench_matmul: --layers: expected at least two positive widths\n");
        return 2;
    }
    omp_set_num_threads(threads);

    std::vector<Product> products;
    for (size_t l = 0; l + 1 < widths.size(); ++l) {
        const int64_t k = widths[l], n = widths[l + 1];
        const std::string name = "layer " + std::to_string(l + 1);
        products.push_back({name + " forward", batch, k, n, false, false});
        products.push_back({name + " weight gradient", k, batch, n, true, false});
        if (l > 0) products.push_back({name + " input gradient", batch, n, k, false, true});
    }

    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    // Floats starting `offset` bytes past a cache line.
    struct Floats {
        std::unique_ptr<char, decltype(&std::free)> raw{nullptr, &std::free};
        float* p = nullptr;
        void assign(size_t n, float v, size_t offset) {
            raw.reset(static_cast<char*>(std::aligned_alloc(64, (n * 4 + offset + 63) / 64 * 64)));
            p = reinterpret_cast<float*>(raw.get() + offset);
            std::fill(p, p + n, v);
        }
        float* data() { return p; }
    };
    struct Prepared {
        dnnl::matmul prim;
        Floats a, b, c;
        std::unordered_map<int, dnnl::memory> args;
        double flops = 0;
    };
    std::vector<Prepared> prepared(products.size());
    bool anyOffset = false, anyAligned = false;  // how the weights were placed
    for (size_t i = 0; i < products.size(); ++i) {
        const Product& p = products[i];
        Prepared& q = prepared[i];
        const bool weights = !p.transA;  // forward and input gradient: b is a weight matrix
        q.a.assign(static_cast<size_t>(p.m * p.k), 0.01f, 0);
        // The weights' rows are n floats apart (k for the input gradient's transposed read of
        // the same [n, k] matrix, stored with rows of k).
        const auto rowBytes = static_cast<size_t>(p.transB ? p.k : p.n) * sizeof(float);
        const bool offset =
            weights && !weightsAligned &&
            (weightsOffset || td::cpu::weightsOffsetFor(dnnl::get_effective_cpu_isa(), rowBytes));
        if (weights) (offset ? anyOffset : anyAligned) = true;
        q.b.assign(static_cast<size_t>(p.k * p.n), 0.02f, offset ? td::cpu::kWeightsOffset : 0);
        q.c.assign(static_cast<size_t>(p.m * p.n), 0.0f, 0);
        auto aMd = matDesc(p.m, p.k, p.transA), bMd = matDesc(p.k, p.n, p.transB),
             cMd = matDesc(p.m, p.n, false);
        dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(aMd, bMd, cMd), eng);
        q.prim = dnnl::matmul(pd);
        q.args[DNNL_ARG_SRC] = dnnl::memory(aMd, eng, q.a.data());
        q.args[DNNL_ARG_WEIGHTS] = dnnl::memory(bMd, eng, q.b.data());
        q.args[DNNL_ARG_DST] = dnnl::memory(cMd, eng, q.c.data());
        q.flops =
            2.0 * static_cast<double>(p.m) * static_cast<double>(p.k) * static_cast<double>(p.n);
    }
    auto step = [&] {
        for (Prepared& q : prepared) q.prim.execute(strm, q.args);
        strm.wait();
    };
    for (int i = 0; i < 5; ++i) step();
    // The median of the timed steps, and each product's share measured on its own.
    std::vector<double> times;
    for (int i = 0; i < repeat; ++i) {
        const auto t0 = Clock::now();
        step();
        times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    double flops = 0;
    for (const Prepared& q : prepared) flops += q.flops;

    std::printf(
        "oneDNN %d.%d f32 matmuls of one training step: MLP %s, batch %lld, %d threads, weights "
        "%s\n",
        dnnl_version()->major, dnnl_version()->minor, layersText.c_str(),
        static_cast<long long>(batch), threads,
        !anyOffset    ? "on a cache line"
        : !anyAligned ? "16 bytes past a cache line"
                      : "16 bytes past a cache line where TrainDeck places them so");
    for (size_t i = 0; i < products.size(); ++i) {
        std::vector<double> t;
        for (int r = 0; r < std::max(5, repeat / 5); ++r) {
            const auto t0 = Clock::now();
            prepared[i].prim.execute(strm, prepared[i].args);
            strm.wait();
            t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
        std::sort(t.begin(), t.end());
        const Product& p = products[i];
        std::printf("  %-26s [%lld x %lld] x [%lld x %lld]  %8.1f us  %7.1f GFLOP/s\n",
                    p.what.c_str(), static_cast<long long>(p.m), static_cast<long long>(p.k),
                    static_cast<long long>(p.k), static_cast<long long>(p.n), t[t.size() / 2] * 1e6,
                    prepared[i].flops / t[t.size() / 2] * 1e-9);
    }
    const double matmulRate = static_cast<double>(batch) / median;
    std::printf(
        "step of matmuls: %.1f us, %.1f GFLOP/s, %.0f samples/s if nothing else took time\n",
        median * 1e6, flops / median * 1e-9, matmulRate);
    if (trainerRate > 0)
        std::printf("trainer at %.0f samples/s reaches %.0f%% of that matmul rate\n", trainerRate,
                    100.0 * trainerRate / matmulRate);
    return 0;
}
