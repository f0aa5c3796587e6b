// Project files and model checks for a front end: load, parse, save and validate a project,
// compare two, and the Keras-style summary of a model. The records (Project, ModelSpec,
// LayerSpec, ModelInfo...) are the plain structs of engine/io/project.h and the headers it
// includes; this header adds no state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/result.h"
#include "engine/io/project.h"

namespace td::api {

// Reads and parses a project file; relative data paths become absolute (against the file's
// folder). Errors name the file and the field path
// ("p.json: training.optimizer.config.learning_rate: expected a positive number, got -1").
Result<Project> loadProjectFile(const std::string& path);
// Parses project JSON text that has no file (an example, an embedded default). `name` stands for
// the file in error messages; relative data paths stay as written.
Result<Project> parseProjectText(const std::string& jsonText, const std::string& name);
// Writes the file atomically; data paths inside its folder are written relative to it.
Status saveProjectFile(const Project& project, const std::string& path);
// The project as its file holds it (every field; parses back to an equal Project). Two projects
// with the same text are the same project.
std::string projectText(const Project& project);
// Every rule a project file must follow, applied to an edited Project (the rules the parser
// applies, by field path, e.g. "training.callbacks[0].config.monitor: ..."), then the host
// resources a run would take. Reads no data.
Status validateProject(const Project& project);
// "" when equal, else the field path of the first field that differs
// ("training.optimizer.config.beta_1", "model.config.layers[2]").
std::string firstProjectDifference(const Project& a, const Project& b);

// A model after shape inference: its layers with generated names filled in, each layer's output
// shape and parameter count, and the model.summary() table.
struct ModelSummary {
    ModelSpec model;    // the input with generated layer names
    ModelInfo info;     // per layer (the InputLayer excluded, as Keras' summary does)
    std::string table;  // Keras' model.summary() text, one '\n' per line
};
// Errors name the layer index and name and what was expected
// ("layer 2 'reshape': cannot reshape [784] into [30,30]").
Result<ModelSummary> summarizeModel(const ModelSpec& model);

// What the compiler makes of a project's training step, with its fusions and without any: ops
// in the graph, kernels launched per step, bytes those kernels read and write per step, the
// arena's peak bytes; each fusion group with its ops, each refusal with its reason; and what the
// CPU device's own passes did to the step (compiled on cpu:0 with zeroed parameters). Reads no
// data (the model's shapes and the training configuration are enough).
struct CompileReport {
    struct Side {
        int ops = 0;        // graph nodes that compute (inputs, parameters and views excluded)
        int kernels = 0;    // instructions run per step (a shadow refresh excluded)
        int64_t bytes = 0;  // bytes the kernels read and write per step
        int64_t arenaBytes = 0;
    };
    Side unfused, fused;
    std::string precision;  // the policy's name
    // Led by the model's layers: "dense: matmul + bias_add + act(relu) -> dense (fusion)".
    std::vector<std::string> groups;
    std::vector<std::string> refusals;  // "dense, dropout: dropout after dense stays apart: ..."
    // The same in the IR's node ids: "fusion: matmul %5 + bias_add %7 + act(relu) %8 -> dense".
    std::vector<std::string> groupsIr, refusalsIr;
    std::vector<std::string> disabled;  // passes this project turns off
    // The CPU device's own passes (backend/cpu/cpu_passes.h) over the training step as a
    // one-device run compiles it on cpu:0, in the order they act.
    struct DevicePass {
        std::string name;
        std::string what;       // one line
        bool disabled = false;  // turned off by the project
        int64_t applied = 0;    // the places it changed in this step (0: none)
    };
    std::vector<DevicePass> cpuPasses;
    std::string cpuSetting;  // how cpu:0 compiled the step ("the step on 1 of 2 threads"), or
                             // why it did not
    std::string text;        // all of it, as `traindeck compile --report` prints it
};
Result<CompileReport> compileReport(const Project& project);

}  // namespace td::api
