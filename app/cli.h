// Headless subcommands of the traindeck binary.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/run_records.h"

namespace td {
class Session;
}

namespace td::cli {

struct TrainArgs {
    std::string project;
    std::string db;
    std::string runName;
    int epochs = 0;  // 0 = project's value
    long long batchSize = 0;
    long long seed = -1;    // -1 = project's value
    bool plain = false;     // force plain lines even on a terminal
    bool verbose = false;   // also the engine's detail lines (LogLine::detail)
    std::string resume;     // a stored run (id or name) to continue from its last good checkpoint
    std::string saveModel;  // after a successful run: the trained model as .keras or .onnx
    std::vector<std::string> disablePasses;  // added to the project's disabled_passes
    // Train in a process of its own session, output in <store folder>/logs; print the run's id.
    bool detach = false;
};

// "traindeck: error: MSG" on standard error.
void printError(const std::string& msg);

int train(const TrainArgs& a);
int summary(const std::string& project);
int runs(const std::string& db, bool json);
// Deletes a stored run; with deleteCheckpoints its checkpoint files too.
int deleteRun(const std::string& db, const std::string& run, bool deleteCheckpoints);
int show(const std::string& db, const std::string& run, bool json);
// A run's summary as `runs --json` and `show --json` print it (no documents).
nlohmann::json runJson(const RunRecord& r);
// `follow`: a run's rows as JSON lines, stored then live (cli_follow.cpp).
struct FollowArgs {
    std::string run;
    std::string db;
    long long fromStep = 0;  // steps and replica rows after this global step
    std::string from;        // a cursor of an earlier follow: resume exactly after its line
    int pollMs = 200;
};
int follow(const FollowArgs& a);
// action "stop", "pause" or "continue": signals the headless process training `run` of the store
// `db` on this machine, identified by the run's control file (pid, start time, boot id).
int steer(const std::string& db, const std::string& run, const std::string& action);
int devices(bool json);
// Prints the IR after a pass, or (report) the fusion report of the training step.
int compile(const std::string& project, const std::string& dumpAfter, bool report = false,
            const std::vector<std::string>& disablePasses = {});
std::string defaultDbPath();

// Model files (cli_model.cpp).
struct ExportArgs {
    std::string source;   // a model file (.keras, .tdckpt), else a stored run (id or name)
    std::string project;  // with weights: the project's model with these weights
    std::string weights;
    std::string format;  // "onnx" | "keras"; empty = from the output's extension
    std::string output;
    std::string db;  // the run store a run is looked up in (default: the per-user store)
    bool reportToStderr = false;  // the closing "Exported ..." line on stderr (output "-")
};
// output "-": the file goes to standard output (--format needed), the report to standard error.
int exportModel(const ExportArgs& a);
int importModel(const std::string& model, const std::string& output, const std::string& like);
int predict(const std::string& model, const std::string& input, const std::string& output,
            const std::string& labelColumn);
// `train --save-model`: the session's trained model, in the format the extension names.
int saveTrainedModel(Session& session, const std::string& path);

}  // namespace td::cli
