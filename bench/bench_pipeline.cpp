// Input-side benchmark: what a training run pays before and around its steps, without a model.
//   load:     loadSource of a project's data source (Fashion-MNIST by default): a cold run decodes
//             the files, a warm one reads the decoded-source cache (TRAINDECK_DECODE_CACHE=off
//             measures decoding every time)
//   pipeline: epochs of a Pipeline over the loaded training split with the project's map steps,
//             shuffle and batch size, formed inline (prefetch 0: one thread, the cost of forming
//             batches alone) and with the project's own prefetch and workers
//
//   stream:   with --stream, an image or record source is streamed (each sample read and decoded
//             when a batch needs it, on the pipeline's workers) and the pipeline caches nothing:
//             every epoch reads, decodes, resizes and batches, as a data-loading benchmark does
//
//   traindeck_bench_pipeline [--project projects/fashion_mnist_mlp.json] [--loads 3]
//                            [--epochs 3] [--repeat 3] [--stream]
// Prints one line per measurement: the median and the spread of the repeats, and samples/s.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/data/pipeline.h"
#include "engine/io/project.h"
#include "tests/source_dir.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

void report(const char* what, std::vector<double> v, const char* unit, double scale) {
    std::sort(v.begin(), v.end());
    std::printf("%-34s median %10.3f %s   min %10.3f   max %10.3f\n", what, v[v.size() / 2] * scale,
                unit, v.front() * scale, v.back() * scale);
}

// Seconds per batch over `epochs` epochs (after one untimed epoch that fills a cache).
td::Result<double> timeEpochs(const td::Dataset& data, td::PipelineConfig cfg, int64_t batch,
                              int epochs) {
    TD_ASSIGN_OR_RETURN(auto pipe, td::Pipeline::create(data, cfg, batch, true, 42));
    double checksum = 0;
    int64_t batches = 0;
    Clock::time_point start;
    for (int e = 0; e <= epochs; ++e) {
        if (e == 1) start = Clock::now();
        TD_RETURN_IF_ERROR(pipe->beginEpoch(e));
        while (true) {
            TD_ASSIGN_OR_RETURN(const td::Batch* b, pipe->next());
            if (!b) break;
            checksum += b->x.data<float>()[0];
            if (e > 0) ++batches;
        }
    }
    const double total = seconds(start, Clock::now());
    if (checksum < 0) std::printf("(checksum %g)\n", checksum);
    return total / static_cast<double>(batches);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"TrainDeck input-side benchmark: source loading and batch forming"};
    std::string projectPath = std::string(td::dev::kSourceDir) + "/projects/fashion_mnist_mlp.json";
    int loads = 3, epochs = 3, repeat = 3;
    app.add_option("--project", projectPath, "Project whose data section is measured");
    app.add_option("--loads", loads, "Source loads to time")->check(CLI::PositiveNumber);
    app.add_option("--epochs", epochs, "Timed epochs per pipeline measurement")
        ->check(CLI::PositiveNumber);
    app.add_option("--repeat", repeat, "Pipeline measurements")->check(CLI::PositiveNumber);
    bool stream = false;
    app.add_flag("--stream", stream,
                 "Stream the source and cache nothing: every epoch reads and decodes");
    CLI11_PARSE(app, argc, argv);

    auto project = td::loadProject(projectPath);
    if (!project.ok()) {
        std::fprintf(stderr, "%s\n", project.error().c_str());
        return 1;
    }
    td::DataConfig data = project.value().data;
    if (stream) data.pipeline.cache = "none";
    const int64_t batch = project.value().training.batchSize;

    std::vector<double> loadTimes;
    td::Result<td::DataSplits> splits = td::err("not loaded");
    for (int i = 0; i < loads; ++i) {
        const auto t0 = Clock::now();
        splits = td::loadSource(data.source, stream);
        loadTimes.push_back(seconds(t0, Clock::now()));
        if (!splits.ok()) {
            std::fprintf(stderr, "%s\n", splits.error().c_str());
            return 1;
        }
    }
    report("load source", loadTimes, "ms", 1e3);

    const td::Dataset& train = splits.value().train;
    td::PipelineConfig inlineCfg = data.pipeline;
    inlineCfg.prefetch = 0;
    inlineCfg.parallelCalls = 1;
    std::vector<double> inlineTimes, asyncTimes;
    for (int r = 0; r < repeat; ++r) {
        using Run = std::pair<const td::PipelineConfig*, std::vector<double>*>;
        for (auto [cfg, out] : {Run{&inlineCfg, &inlineTimes}, Run{&data.pipeline, &asyncTimes}}) {
            auto t = timeEpochs(train, *cfg, batch, epochs);
            if (!t.ok()) {
                std::fprintf(stderr, "%s\n", t.error().c_str());
                return 1;
            }
            out->push_back(t.value());
        }
    }
    report("batch, inline (one thread)", inlineTimes, "us", 1e6);
    report("batch, project prefetch/workers", asyncTimes, "us", 1e6);
    std::sort(asyncTimes.begin(), asyncTimes.end());
    std::printf("samples/s, project prefetch/workers: %.0f (batch %lld)\n",
                static_cast<double>(batch) / asyncTimes[asyncTimes.size() / 2],
                static_cast<long long>(batch));
    return 0;
}
