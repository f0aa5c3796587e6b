// traindeck: the desktop app by default; headless subcommands for servers and scripts.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "app/cli.h"
#include "engine/api/session.h"
#include "engine/core/cpu_isa.h"
#ifdef TRAINDECK_HAVE_GUI
#include "app/gui_loader.h"
#endif

namespace {

// A whole number of at least `lo`: "expected a whole number of at least 1, got 0" (CLI11's own
// range checks print the limits of a double).
CLI::Validator wholeNumberAtLeast(long long lo) {
    return CLI::Validator(
        [lo](std::string& text) -> std::string {
            errno = 0;
            char* end = nullptr;
            const long long v = std::strtoll(text.c_str(), &end, 10);
            if (text.empty() || *end != '\0' || errno == ERANGE || v < lo)
                return "expected a whole number of at least " + std::to_string(lo) + ", got '" +
                       text + "'";
            return {};
        },
        "INT>=" + std::to_string(lo));
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"TrainDeck: design, train and monitor neural networks"};
    app.set_version_flag("--version", std::string("traindeck ") + TRAINDECK_VERSION);
    std::string db, project;
    bool start = false;
    app.add_option("--db", db, "SQLite run store (default: the per-user store)");
    app.add_option("project", project, "Project file to open in the app");
    app.add_flag("--start", start, "Start training the opened project at once");
    bool quitWhenDone = false;
    app.add_flag("--quit-when-done", quitWhenDone, "With --start: quit the app when the run ends");
    app.require_subcommand(0, 1);

    td::cli::TrainArgs ta;
    auto* train = app.add_subcommand("train", "Train a project headless with a progress bar");
    train->add_option("project", ta.project,
                      "Project file (JSON), or - for standard input; not with --resume");
    train->add_flag("--detach", ta.detach,
                    "Train in the background, beyond this session (an SSH logout): print the "
                    "run's id, the output goes to a log beside the store");
    train->add_option("--epochs", ta.epochs, "Override training.epochs")
        ->check(wholeNumberAtLeast(1));
    train->add_option("--batch-size", ta.batchSize, "Override training.batch_size")
        ->check(wholeNumberAtLeast(1));
    train->add_option("--seed", ta.seed, "Override training.seed")->check(wholeNumberAtLeast(0));
    train->add_option("--run-name", ta.runName, "Name of the stored run");
    train->add_option("--db", ta.db, "SQLite run store");
    train->add_flag("--plain", ta.plain, "Plain progress lines even on a terminal");
    train->add_flag("--verbose", ta.verbose,
                    "Also print the engine's detail lines (how the input pipeline ran each epoch; "
                    "the store keeps them either way)");
    train->add_option("--disable-pass", ta.disablePasses,
                      "Turn a compiler or CPU device pass off by name (repeatable; traindeck "
                      "compile --report lists the fusions and the CPU passes)");
    train->add_option("--resume", ta.resume,
                      "Continue a stored run (id or name) from its last good checkpoint");
    train
        ->add_option("--save-model", ta.saveModel,
                     "After the run: write the trained model (.keras or .onnx)")
        ->check([](const std::string& p) -> std::string {
            const auto ext = std::filesystem::path(p).extension();
            return ext == ".keras" || ext == ".onnx" ? "" : "expected a .keras or .onnx file";
        });

    std::string sumProject;
    auto* summary = app.add_subcommand("summary", "Print the Keras-style model summary");
    summary->add_option("project", sumProject, "Project file (JSON)")->required();

    bool json = false;
    std::string runsDb;
    auto* runs = app.add_subcommand("runs", "List stored runs");
    runs->add_option("--db", runsDb, "SQLite run store");
    runs->add_flag("--json", json, "JSON output");
    std::string deleteRun;
    bool deleteCheckpoints = false;
    auto* runsDelete = runs->add_subcommand("delete", "Delete a stored run (id or name)");
    runsDelete->add_option("run", deleteRun, "Run id or name")->required();
    runsDelete->add_option("--db", runsDb, "SQLite run store");
    runsDelete->add_flag("--delete-checkpoints", deleteCheckpoints,
                         "Delete the run's checkpoint files too");

    std::string steerRun, steerDb;
    CLI::App* steerCmds[3] = {};
    const char* steerNames[3] = {"stop", "pause", "continue"};
    const char* steerHelp[3] = {
        "Stop a run trained headless on this machine: its step ends, a checkpoint is written",
        "Pause a run trained headless on this machine, after its current step",
        "Continue a paused run"};
    for (int i = 0; i < 3; ++i) {
        steerCmds[i] = app.add_subcommand(steerNames[i], steerHelp[i]);
        steerCmds[i]->add_option("run", steerRun, "Run id or name")->required();
        steerCmds[i]->add_option("--db", steerDb, "SQLite run store");
    }

    td::cli::FollowArgs fa;
    auto* followCmd = app.add_subcommand(
        "follow", "A run's rows as JSON lines: what is stored, then live until the run ends");
    followCmd->add_option("run", fa.run, "Run id or name")->required();
    followCmd->add_option("--db", fa.db, "SQLite run store");
    followCmd->add_option("--from-step", fa.fromStep, "Only the rows stored after this step")
        ->check(CLI::NonNegativeNumber);
    followCmd->add_option("--from", fa.from,
                          "A line's cursor from an earlier follow: continue right after it");
    followCmd->add_option("--poll-ms", fa.pollMs, "How often to look for new rows (ms)")
        ->check(CLI::Range(10, 10000));

    std::string showRun, showDb;
    bool showJson = false;
    auto* show = app.add_subcommand("show", "Show one stored run (id or name)");
    show->add_option("run", showRun, "Run id or name")->required();
    show->add_option("--db", showDb, "SQLite run store");
    show->add_flag("--json", showJson, "JSON output");

    bool devJson = false;
    auto* devices = app.add_subcommand("devices", "List the devices TrainDeck can use");
    devices->add_flag("--json", devJson, "JSON output");

    std::string compProject, dumpAfter = "final";
    auto* compile = app.add_subcommand("compile", "Compile a project and print its IR");
    compile->add_option("project", compProject, "Project file (JSON)")->required();
    compile->add_option("--dump-after", dumpAfter,
                        "Stage to print: forward, autodiff, fusion, fold_casts, "
                        "fuse_act_bias_grad, fuse_elementwise, dce, memory, final, lowered");
    std::vector<std::string> compDisable;
    compile->add_option("--disable-pass", compDisable,
                        "Turn a compiler or CPU device pass off (repeatable)");
    bool compReport = false;
    compile->add_flag("--report", compReport,
                      "Print the fusion report: ops, kernels and bytes per step with and without "
                      "fusion, the fusion groups and what was kept apart, and where each CPU "
                      "device pass applied");

    td::cli::ExportArgs ea;
    auto* exportCmd = app.add_subcommand(
        "export", "Export a model with its weights as ONNX or a Keras 3 .keras file");
    exportCmd->add_option("model", ea.source,
                          "Model file (.keras, .tdckpt), or a stored run (id or name): its "
                          "latest good checkpoint");
    exportCmd->add_option("--project", ea.project,
                          "Project whose model to export (with --weights)");
    exportCmd->add_option("--weights", ea.weights, "Weights for the project's model (.keras)");
    exportCmd->add_option("--format", ea.format, "onnx or keras (default: from -o's extension)");
    exportCmd
        ->add_option("-o,--output", ea.output,
                     "Output file, or - for standard output (with --format)")
        ->required();
    exportCmd->add_option("--db", ea.db, "SQLite run store a run is looked up in");

    std::string importModel, importOut, importLike;
    auto* importCmd =
        app.add_subcommand("import", "Make a project from a Keras 3 .keras file and its weights");
    importCmd->add_option("model", importModel, "Keras 3 model file (.keras)")->required();
    importCmd->add_option("-o,--output", importOut, "Project file to write")->required();
    importCmd->add_option("--like", importLike,
                          "Take data, training and strategy from this project");

    std::string predModel, predInput, predOut, predLabel = "label";
    auto* predictCmd =
        app.add_subcommand("predict", "Predictions of a model file on IDX, CSV or NPY input");
    predictCmd->add_option("model", predModel, "Model file (.keras, or a checkpoint .tdckpt)")
        ->required();
    predictCmd->add_option("input", predInput, "Samples: .npy, .csv, or IDX (raw or .gz)")
        ->required();
    predictCmd->add_option("-o,--output", predOut, "Write predictions to a .csv or .npy file");
    predictCmd->add_option("--label-column", predLabel,
                           "CSV input: the label column to leave out (default: label)");

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        // A usage error exits 2, as every other refused input does (--help and --version 0).
        return app.exit(e) == 0 ? 0 : 2;
    }

    // A level the CPU lacks would end in SIGILL, a misspelt one would silently be ignored.
    if (const std::string& isaError = td::activeCpuIsa().error; !isaError.empty()) {
        std::fprintf(stderr, "traindeck: error: %s\n", isaError.c_str());
        return 2;
    }

    if (*train) return td::cli::train(ta);
    if (*summary) return td::cli::summary(sumProject);
    if (*runsDelete) return td::cli::deleteRun(runsDb, deleteRun, deleteCheckpoints);
    if (*runs) return td::cli::runs(runsDb, json);
    if (*show) return td::cli::show(showDb, showRun, showJson);
    if (*followCmd) return td::cli::follow(fa);
    for (int i = 0; i < 3; ++i)
        if (*steerCmds[i]) return td::cli::steer(steerDb, steerRun, steerNames[i]);
    if (*devices) return td::cli::devices(devJson);
    if (*compile) return td::cli::compile(compProject, dumpAfter, compReport, compDisable);
    if (*exportCmd) return td::cli::exportModel(ea);
    if (*importCmd) return td::cli::importModel(importModel, importOut, importLike);
    if (*predictCmd) return td::cli::predict(predModel, predInput, predOut, predLabel);

#ifdef TRAINDECK_HAVE_GUI
    return td::app::launchGui(argc, argv, db, project, start, quitWhenDone);
#else
    if (!project.empty()) {
        // Headless build: the app's default action trains the project.
        ta.project = project;
        ta.db = db;
        return td::cli::train(ta);
    }
    std::fputs(app.help().c_str(), stdout);
    return 0;
#endif
}
