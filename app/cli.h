// Headless subcommands of the traindeck binary.
#pragma once

#include <string>

namespace td::cli {

struct TrainArgs {
    std::string project;
    std::string db;
    std::string runName;
    int epochs = 0;  // 0 = project's value
    long long batchSize = 0;
    long long seed = -1;  // -1 = project's value
    bool plain = false;   // force plain lines even on a terminal
    std::string resume;   // a stored run (id or name) to continue from its last good checkpoint
};

int train(const TrainArgs& a);
int summary(const std::string& project);
int runs(const std::string& db, bool json);
// Deletes a stored run; with deleteCheckpoints its checkpoint files too.
int deleteRun(const std::string& db, const std::string& run, bool deleteCheckpoints);
int show(const std::string& db, const std::string& run, bool json);
int devices(bool json);
// Prints the IR after a pass, or (report) the fusion report of the training step.
int compile(const std::string& project, const std::string& dumpAfter, bool report = false);
std::string defaultDbPath();

}  // namespace td::cli
