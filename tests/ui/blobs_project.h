// The small synthetic project the run-controller suites train: epochs as asked, batch 16, a step
// event after every step.
#pragma once

#include <QtGlobal>
#include <string>

#include "engine/io/project.h"
#include "tests/source_dir.h"

namespace tdtest {

inline td::Project blobs(int epochs) {
    auto p = td::loadProject(std::string(td::dev::kSourceDir) + "/projects/synthetic_blobs.json");
    if (!p.ok()) qFatal("%s", p.error().c_str());
    p->training.epochs = epochs;
    p->training.batchSize = 16;
    p->training.logEverySteps = 1;
    return std::move(p).value();
}

}  // namespace tdtest
