// Fills a run store with many finished runs through the store API, for measuring viewers on a
// large store (installer/gui_runs_latency.sh):
//   td_fill_store DB RUNS STEPS PROJECT.json
// Each run: the project document, STEPS logged steps with the metrics a CPU run logs, 10 epochs
// with validation metrics, status completed. Values are deterministic.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/store/run_store.h"

namespace {

bool parseCount(const char* text, long long max, long long* out) {
    char* end = nullptr;
    const long long v = std::strtoll(text, &end, 10);
    if (!end || *end != '\0' || v < 1 || v > max) return false;
    *out = v;
    return true;
}

int fail(const std::string& message) {
    std::fprintf(stderr, "td_fill_store: %s\n", message.c_str());
    return 1;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 5) return fail("usage: td_fill_store DB RUNS STEPS PROJECT.json");
    long long runs = 0, steps = 0;
    if (!parseCount(argv[2], 1000000, &runs))
        return fail(std::string("RUNS: expected a count in [1, 1000000], got '") + argv[2] + "'");
    if (!parseCount(argv[3], 1000000, &steps))
        return fail(std::string("STEPS: expected a count in [1, 1000000], got '") + argv[3] + "'");
    std::ifstream in(argv[4], std::ios::binary);
    if (!in) return fail(std::string(argv[4]) + ": cannot read the project file");
    std::stringstream project;
    project << in.rdbuf();

    auto opened = td::RunStore::open(argv[1]);
    if (!opened) return fail(opened.error());
    td::RunStore& store = *opened.value();

    const auto t0 = std::chrono::steady_clock::now();
    const int64_t startMs = 1'700'000'000'000;
    constexpr int kEpochs = 10;
    std::vector<td::StepRow> stepRows(static_cast<size_t>(steps));
    std::vector<td::EpochRow> epochRows(kEpochs);
    for (long long r = 0; r < runs; ++r) {
        td::RunRecord run;
        run.name = "generated-" + std::to_string(r);
        run.projectJson = project.str();
        run.configJson = "{\"epochs\": 10, \"seed\": " + std::to_string(r) + "}";
        run.startedAtMs = startMs + r * 60'000;
        run.modelName = "blobs_mlp";
        run.params = 1'000 + r % 97;
        run.devices = "cpu:0";
        run.pid = 1;  // not this process: the store must not mistake it for a live run
        run.host = "generated";
        auto id = store.createRun(run);
        if (!id) return fail(id.error());
        const double rate = 1.0 + static_cast<double>(r % 13) / 13.0;
        for (long long s = 0; s < steps; ++s) {
            td::StepRow& row = stepRows[static_cast<size_t>(s)];
            row.globalStep = s + 1;
            row.epoch = static_cast<int>(s * kEpochs / steps);
            row.step = s;
            row.timeMs = run.startedAtMs + s * 10;
            const double loss = 2.3 * std::exp(-rate * static_cast<double>(s) / steps);
            row.metrics = {
                {"loss", loss},      {"accuracy", 1.0 - loss / 2.5},
                {"lr", 0.001},       {"input_wait_s", 1e-4},
                {"compute_s", 2e-3}, {"samples_per_s", 30'000.0 + static_cast<double>(s % 100)}};
        }
        for (int e = 0; e < kEpochs; ++e) {
            td::EpochRow& row = epochRows[static_cast<size_t>(e)];
            row.epoch = e;
            row.timeMs = run.startedAtMs + (e + 1) * steps * 10 / kEpochs;
            row.seconds = static_cast<double>(steps) / kEpochs / 100.0;
            const double loss = 2.3 * std::exp(-rate * (e + 1.0) / kEpochs);
            row.metrics = {{"loss", loss},
                           {"accuracy", 1.0 - loss / 2.5},
                           {"val_loss", loss * 1.1},
                           {"val_accuracy", 1.0 - loss * 1.1 / 2.5}};
        }
        td::Status st = store.appendSteps(*id, stepRows);
        if (st.ok()) st = store.appendEpochs(*id, epochRows);
        if (st.ok())
            st = store.finishRun(*id, td::RunStatus::Completed, epochRows.back().metrics, "");
        if (!st.ok()) return fail(st.error());
        if ((r + 1) % 1000 == 0 || r + 1 == runs) {
            const double s =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::fprintf(stderr, "td_fill_store: %lld of %lld runs (%.0f s)\n", r + 1, runs, s);
        }
    }
    return 0;
}
