// Session: a thin facade. create() applies the caller's overrides, checks what this machine
// supports (precision, strategy, pass names), has the run prepared (engine/train/run_setup.h:
// model, data, callbacks, workers) and hands it to a Trainer (engine/train/trainer.h: replicas,
// programs, the fit loop); fit() wires the run store and guarantees one RunFinished; the rest
// forwards to the trainer.
#include "engine/api/session.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/api/run_checkpoints.h"
#include "engine/backend/backend.h"
#include "engine/core/cpu_isa.h"
#include "engine/core/text_limits.h"
#include "engine/data/sources.h"
#include "engine/distribute/mpi_collectives.h"
#include "engine/graph/builder.h"
#include "engine/graph/passes.h"
#include "engine/store/run_store.h"
#include "engine/train/checkpoint.h"
#include "engine/train/run_setup.h"
#include "engine/train/trainer.h"

namespace td {

namespace {

// Whether a strategy's devices are GPUs alone ("cuda:N"; none named is the CPU).
bool gpusOnly(const std::vector<std::string>& devices) {
    return !devices.empty() &&
           std::all_of(devices.begin(), devices.end(),
                       [](const std::string& d) { return d.rfind("cuda:", 0) == 0; });
}

// A compute capability's major version: "9.0" -> 9; 0 when unreadable.
int ccMajor(const std::string& cc) {
    return cc.empty() || !std::isdigit(static_cast<unsigned char>(cc[0])) ? 0
                                                                          : std::atoi(cc.c_str());
}

using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

int64_t unixMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string hostName() {
    char buf[256] = {0};
    if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
    return buf;
}

// A checkpoint that reads back whole and fits its own project; the reason when not.
Result<std::pair<Project, std::shared_ptr<CheckpointState>>> loadUsableCheckpoint(
    const std::string& path) {
    TD_ASSIGN_OR_RETURN(CheckpointState st, readCheckpoint(path));
    TD_ASSIGN_OR_RETURN(Project p, checkpointProject(path, st));
    TD_ASSIGN_OR_RETURN(CheckpointModel m, readCheckpointModel(path));
    (void)m;
    return std::make_pair(std::move(p), std::make_shared<CheckpointState>(std::move(st)));
}

// BackupAndRestore's folder: its backups, newest (highest global step) first.
std::vector<std::string> backupFiles(const std::string& dir) {
    std::vector<std::pair<int64_t, std::string>> found;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("backup-", 0) != 0 || e.path().extension() != ".tdckpt") continue;
        const std::string digits = name.substr(7, name.size() - 7 - 7);
        if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
        found.emplace_back(std::stoll(digits), e.path().string());
    }
    std::sort(found.begin(), found.end(), std::greater<>());
    std::vector<std::string> out;
    for (auto& f : found) out.push_back(std::move(f.second));
    return out;
}

}  // namespace

Result<ResumePoint> findResumePoint(const std::string& storePath, const std::string& runIdOrName) {
    TD_ASSIGN_OR_RETURN(std::unique_ptr<RunStore> store, RunStore::open(storePath));
    if (store->readOnly())
        return err(storePath + ": the run store is read-only (" + store->readOnlyReason() +
                   "): a resumed run could not be stored");
    TD_ASSIGN_OR_RETURN(RunRecord found, store->findRun(runIdOrName));
    TD_ASSIGN_OR_RETURN(RunRecord run, store->getRun(found.id));
    if (run.status == "running")
        return err("run " + std::to_string(run.id) + " in " + storePath +
                   " is still running (process " + std::to_string(run.pid) + " on " + run.host +
                   "): stop it before resuming it");
    TD_ASSIGN_OR_RETURN(RunCheckpointChoice choice, chooseRunCheckpoint(*store, run));
    if (choice.candidates == 0)
        return err("run " + std::to_string(run.id) + " in " + storePath +
                   " has no checkpoint to resume from (it ended before its first checkpoint, "
                   "or its project switched them off)");
    if (!choice.chosen) {
        std::string why;
        for (const std::string& n : choice.refused) why += "\n  refused " + n;
        return err("run " + std::to_string(run.id) + " in " + storePath +
                   ": none of its checkpoints can be used:" + why);
    }
    ResumePoint rp;
    rp.runId = run.id;
    rp.checkpointPath = choice.chosen->path;
    rp.state = choice.chosen->state;
    rp.globalStep = rp.state->globalStep;
    rp.epoch = rp.state->epoch;
    TD_ASSIGN_OR_RETURN(rp.project, checkpointProject(rp.checkpointPath, *rp.state));
    for (const std::string& n : choice.refused) rp.notes.push_back("refused " + n);
    if (!choice.chosen->registered)
        rp.notes.push_back("using " + rp.checkpointPath + " (global step " +
                           std::to_string(rp.state->globalStep) +
                           "): written, but the process ended before the store registered it; "
                           "it is this run's (store, run and model checked)");
    else if (!rp.notes.empty())
        rp.notes.push_back("using the previous good checkpoint " + rp.checkpointPath +
                           " (global step " + std::to_string(rp.state->globalStep) + ")");
    return rp;
}

struct Session::Impl {
    Project project;
    SessionOptions options;
    EventBus bus;
    RunControl control;
    ModelInfo info;
    DataSplits splits;
    // A run that continues from a checkpoint (SessionOptions::resume, or a BackupAndRestore
    // backup found when the session was created).
    std::optional<ResumePoint> resume;
    std::string staleCheckpointNote;  // a kept folder of a deleted run with this run's id
    std::string storeId;              // the run store's identity, written into every checkpoint
    int64_t chiefRunId = 0;  // multi-worker runs: the run the chief stores (on every worker)
    // MultiWorkerMirrored under an MPI launch: the process group (outlives the trainer).
    std::unique_ptr<MpiCollectives> workers;
    std::unique_ptr<Trainer> trainer;
    int64_t trainSamples = 0, validationSamples = 0;
    int64_t runId = 0;
    std::string runName;  // the stored run's name (empty: the run is not stored)
    std::thread thread;
    std::atomic<bool> isRunning{false};
    // Set from the recorder's thread on the first failed write.

    Status openStore(std::unique_ptr<RunStore>& store, std::unique_ptr<RunRecorder>& recorder,
                     std::shared_ptr<EventQueue>& recorderQueue);
    // The checkpoint writers of the run about to start (its own, ModelCheckpoint,
    // BackupAndRestore), once its id is known.
    CheckpointPlan checkpointPlan(bool stored) const;
    // BackupAndRestore: the newest usable backup in its folder, if any (Keras restores it when
    // fit starts); the stored run it continues when this store registered it.
    Status findBackup();
    RunStarted runStarted() const;
    void log(LogLine::Level lvl, const std::string& text) { bus.publish(LogLine{lvl, text}); }
};

// ---- Session
// -------------------------------------------------------------------------------------

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Session::~Session() {
    if (impl_) {
        requestStop();
        join();
    }
}

Result<std::unique_ptr<Session>> Session::create(const Project& projectIn,
                                                 const SessionOptions& opt) {
    auto im = std::make_unique<Impl>();
    im->project = projectIn;
    im->options = opt;
    Project& p = im->project;
    if (opt.epochs) p.training.epochs = *opt.epochs;
    if (opt.batchSize) p.training.batchSize = *opt.batchSize;
    if (opt.seed) p.training.seed = *opt.seed;
    if (p.training.batchSize <= 0)
        return err("training.batch_size: expected a positive integer, got " +
                   std::to_string(p.training.batchSize));
    if (p.training.epochs <= 0 || p.training.initialEpoch < 0 ||
        p.training.initialEpoch >= p.training.epochs)
        return err("training.epochs: expected epochs > initial_epoch >= 0, got epochs " +
                   std::to_string(p.training.epochs) + ", initial_epoch " +
                   std::to_string(p.training.initialEpoch));
    if (p.precision != PrecisionPolicy::Float32) {
        Capability cap = precisionCapability(p.precision, p.strategy.devices);
        if (!cap.available)
            return err(std::string("precision: ") + precisionName(p.precision) + ": " + cap.reason);
    }
    if (Status st = checkPassNames(p.disabledPasses); !st.ok()) {
        size_t i = 0;
        while (i < p.disabledPasses.size() && checkPassNames({p.disabledPasses[i]}).ok()) ++i;
        return err("disabled_passes[" + std::to_string(i) + "]: " + st.error());
    }
    if (p.strategy.type != "one_device") {
        Capability cap = strategyCapability(p.strategy.type);
        if (!cap.available) return err("strategy.type: " + p.strategy.type + ": " + cap.reason);
    }
    if (std::string e = textProblem(opt.runName, TextKind::Name); !e.empty())
        return err("run name: " + e);
    RunSetupOptions ro;
    ro.stored = !opt.storePath.empty();
    ro.callbacks = opt.callbacks;
    ro.initialParams = opt.initialParams;
    ro.openDevice = opt.openDevice;
    TD_ASSIGN_OR_RETURN(RunSetup setup, prepareRun(p, ro));
    im->info = setup.trainer.info;
    im->splits = std::move(setup.splits);
    im->workers = std::move(setup.workers);
    im->trainSamples = setup.trainer.trainSet.size();
    im->validationSamples = setup.trainer.valSet ? setup.trainer.valSet->size() : 0;
    // Opens the devices, builds the parameters and compiles the training program, so model,
    // strategy and pipeline errors surface before a run starts.
    TD_ASSIGN_OR_RETURN(im->trainer,
                        Trainer::create(std::move(setup.trainer), im->bus, im->control));
    if (opt.resume) {
        if (!opt.resume->state) return err("resume: no checkpoint state (use findResumePoint)");
        im->resume = opt.resume;
    } else {
        TD_RETURN_IF_ERROR(im->findBackup());
    }
    if (im->resume)
        TD_RETURN_IF_ERROR(im->trainer->restore(im->resume->checkpointPath, *im->resume->state));
    return std::unique_ptr<Session>(new Session(std::move(im)));
}

const Project& Session::project() const {
    return impl_->project;
}
EventBus& Session::events() {
    return impl_->bus;
}
int64_t Session::runId() const {
    return impl_->runId;
}
int Session::workerRank() const {
    return impl_->trainer->workerRank();
}

Status Session::Impl::openStore(std::unique_ptr<RunStore>& store,
                                std::unique_ptr<RunRecorder>& recorder,
                                std::shared_ptr<EventQueue>& recorderQueue) {
    // Only the chief (rank 0 of MultiWorkerMirrored, or the only process) writes the store: every
    // worker's per-replica figures reach it through the metric all-gather.
    if (options.storePath.empty() || trainer->workerRank() != 0) return Status::success();
    TD_ASSIGN_OR_RETURN(store, RunStore::open(options.storePath));
    if (store->readOnly())
        return err(options.storePath + ": the run store is read-only (" + store->readOnlyReason() +
                   "): a run cannot be stored in it (--db names another store)");
    storeId = store->storeId();
    const Project& p = project;
    RunRecord r;
    r.name = options.runName.empty() ? p.name : options.runName;
    if (resume && resume->runId > 0) {
        // The stored run goes on: its rows stay, the steps after the checkpoint are added (a
        // step stored past it is written again with the same values).
        TD_RETURN_IF_ERROR(store->reopenRun(resume->runId));
        runId = resume->runId;
        if (auto stored = store->getRun(runId); stored.ok()) r.name = stored->name;
    }
    r.projectJson = projectToJson(p);
    nlohmann::json cfg = {{"epochs", p.training.epochs},
                          {"batch_size", p.training.batchSize},
                          {"seed", p.training.seed},
                          {"precision", precisionName(p.precision)},
                          {"fusion", p.fusion},
                          {"strategy", p.strategy.type},
                          {"optimizer", p.training.optimizer.name},
                          {"learning_rate", p.training.optimizer.learningRate},
                          // What a viewer of the stored run (a remote Monitor) needs to show its
                          // progress as the live run's RunStarted does.
                          {"steps_per_epoch", trainer->stepsPerEpoch(trainSamples)},
                          {"train_samples", trainSamples},
                          {"validation_samples", validationSamples}};
    r.configJson = cfg.dump();
    r.startedAtMs = unixMs();
    r.host = hostName();
    r.pid = getpid();
    std::string devs;
    for (const std::string& d : trainer->replicaDevices()) devs += (devs.empty() ? "" : ", ") + d;
    r.devices = devs;
    r.modelName = p.model.name;
    r.params = info.totalParams;
    if (runId == 0) {
        TD_ASSIGN_OR_RETURN(runId, store->createRun(r));
        // Without a name of its own, a run is its project's run number N: every run of a store
        // has a name of its own ("Fashion-MNIST MLP #12").
        if (options.runName.empty()) {
            r.name = defaultRunName(p.name, runId);
            TD_RETURN_IF_ERROR(store->renameRun(runId, r.name));
        }
        // Run ids are never given out twice, so the run's own folder is new. Should a folder be
        // there all the same (put there by hand, or restored from a backup), it is moved aside:
        // the new run neither overwrites nor inherits those files.
        const std::string dir = runCheckpointDir(options.storePath, runId);
        std::error_code ec;
        if (std::filesystem::exists(dir, ec)) {
            const std::string aside = dir + ".old-" + std::to_string(unixMs());
            std::filesystem::rename(dir, aside, ec);
            staleCheckpointNote = ec ? "cannot move " + dir + " aside: " + ec.message()
                                     : dir + " existed before run " + std::to_string(runId) +
                                           " started (files that are not this run's): moved to " +
                                           aside;
        }
    }
    runName = r.name;
    recorderQueue = bus.subscribe();
    auto rec =
        RunRecorder::start(options.storePath, runId, recorderQueue, [this](const std::string& e) {
            control.abortRun("run store: " + e +
                             "; training stopped (rows written before the failure "
                             "are kept)");
        });
    if (!rec.ok()) {
        bus.unsubscribe(recorderQueue);
        recorderQueue.reset();
        return std::move(rec).takeError();
    }
    recorder = std::move(rec).value();
    return Status::success();
}

CheckpointPlan Session::Impl::checkpointPlan(bool stored) const {
    const TrainConfig& t = project.training;
    CheckpointPlan plan;
    plan.runId = runId;
    plan.projectJson = projectToJson(project);
    plan.storeId = storeId;
    plan.modelFingerprint = modelFingerprint(plan.projectJson);
    plan.storeDeletes = stored;
    const std::string runDir = stored ? runCheckpointDir(options.storePath, runId) : "";
    if (stored && t.runCheckpoints) {
        CheckpointWriter w;
        w.id = "run checkpoints";
        w.kind = "run";
        w.directory = runDir;
        w.prefix = "run";
        w.atStop = true;
        w.keepLast = 2;  // the previous one stays until the newer one is registered and whole
        plan.writers.push_back(w);
    }
    for (size_t i = 0; i < t.callbacks.size(); ++i) {
        const CallbackConfig& c = t.callbacks[i];
        if (!isCheckpointCallback(c)) continue;
        CheckpointWriter w;
        w.id = "training.callbacks[" + std::to_string(i) + "] (" + c.type + ")";
        w.everySteps = c.saveFreqSteps;
        if (c.type == "model_checkpoint") {
            w.kind = "model_checkpoint";
            w.directory = c.directory.empty() ? runDir : c.directory;
            w.prefix = c.saveBestOnly ? "best" : "model";
            w.saveBestOnly = c.saveBestOnly;
            w.monitor = c.monitor;
            w.mode = c.mode;
            w.keepLast = c.keepLast;
        } else {
            w.kind = "backup";
            w.directory = c.directory;
            w.prefix = "backup";
            w.atStop = true;
            w.keepLast = 2;
            w.deleteWhenCompleted = c.deleteCheckpoint;
        }
        plan.writers.push_back(w);
    }
    return plan;
}

Status Session::Impl::findBackup() {
    for (const CallbackConfig& c : project.training.callbacks) {
        if (c.type != "backup_and_restore") continue;
        std::vector<std::string> notes;
        for (const std::string& f : backupFiles(c.directory)) {
            auto got = loadUsableCheckpoint(f);
            if (!got.ok()) {
                notes.push_back("refused " + got.error());
                continue;
            }
            ResumePoint rp;
            rp.checkpointPath = f;
            rp.project = std::move(got.value().first);
            rp.state = std::move(got.value().second);
            rp.globalStep = rp.state->globalStep;
            rp.epoch = rp.state->epoch;
            rp.notes = std::move(notes);
            rp.notes.push_back("BackupAndRestore: restoring " + f + " (global step " +
                               std::to_string(rp.state->globalStep) + ")");
            // The stored run it came from goes on when this store registered the backup for it.
            if (rp.state->runId > 0 && !options.storePath.empty()) {
                if (auto st = RunStore::open(options.storePath); st.ok()) {
                    auto run = st.value()->getRun(rp.state->runId);
                    auto rows = st.value()->checkpoints(rp.state->runId);
                    if (run.ok() && rows.ok() && run.value().status != "running")
                        for (const CheckpointRow& r : rows.value()) {
                            std::error_code ec;
                            if (std::filesystem::equivalent(r.path, f, ec))
                                rp.runId = rp.state->runId;
                        }
                }
            }
            if (rp.runId == 0)
                rp.notes.push_back(
                    "BackupAndRestore: the backup's run is not in this store; the "
                    "rows go to a new run");
            resume = std::move(rp);
            return Status::success();
        }
        if (!notes.empty()) {
            std::string why;
            for (const std::string& n : notes) why += "\n  " + n;
            return err("training.callbacks (backup_and_restore): no usable backup in " +
                       c.directory + " (delete them to start afresh):" + why);
        }
    }
    return Status::success();
}

RunStarted Session::Impl::runStarted() const {
    const Project& p = project;
    RunStarted rs;
    rs.runId = runId;
    rs.runName = runName.empty() ? (options.runName.empty() ? p.name : options.runName) : runName;
    rs.devices = trainer->replicaDevices();
    // A resumed run starts where its checkpoint is (the progress shown counts from there).
    rs.initialEpoch = resume ? resume->state->epoch : p.training.initialEpoch;
    rs.epochs = p.training.epochs;
    const int64_t n = trainSamples;
    rs.stepsPerEpoch = trainer->stepsPerEpoch(n);
    rs.trainSamples = n;
    rs.batchSize = p.training.batchSize;
    rs.validationSamples = validationSamples;
    rs.params = info.totalParams;
    rs.strategy = p.strategy.type;
    rs.workers = trainer->replicas() / trainer->localReplicas();
    rs.allReduceBytesPerStep = trainer->allReduceBytesPerStep();
    rs.gradientBuckets = trainer->gradientBuckets();
    return rs;
}

namespace {

// f(), with an exception that escapes it turned into an error: the engine thread must always get
// as far as publishing the end of the run and closing the queues.
template <typename F>
auto guarded(const char* what, F&& f) -> decltype(f()) {
    try {
        return f();
    } catch (const std::exception& e) {
        return err(std::string(what) + ": " + e.what());
    } catch (...) {
        return err(std::string(what) + ": unknown exception");
    }
}

}  // namespace

// Every way out of here publishes one RunFinished and closes the queues: a subscriber waiting in
// EventQueue::pop (the CLI, the GUI's controller) always learns how the run ended.
Status Session::fit() {
    Impl& im = *impl_;
    im.isRunning = true;
    im.runId = 0;
    {
        std::lock_guard<std::mutex> lk(im.control.mu);
        im.control.abortReason.clear();
    }
    im.control.aborted = false;
    const auto t0 = Clock::now();
    std::unique_ptr<RunStore> store;
    std::unique_ptr<RunRecorder> recorder;
    std::shared_ptr<EventQueue> recorderQueue;
    RunFinished fin;
    Status opened =
        guarded("internal error", [&] { return im.openStore(store, recorder, recorderQueue); });
    // Every worker learns the chief's run id (0: the chief stores none), so a worker that outlives
    // a killed chief can record in the store why the run ended.
    im.chiefRunId = im.runId;
    if (im.workers) {
        const double mine = static_cast<double>(im.runId);
        std::vector<double> all(static_cast<size_t>(im.workers->size()), 0.0);
        if (im.workers->allGatherHost(&mine, 1, all.data()).ok())
            im.chiefRunId = static_cast<int64_t>(all[0]);
    }
    if (!opened.ok()) {
        fin.status = RunStatus::Failed;
        fin.message = "run store: " + opened.error();
        fin.storeError = fin.message;
    } else {
        im.bus.publish(im.runStarted());
        // What loading the data had to say (a decoded-source cache it could not write, ...).
        for (const std::string& note : im.splits.notes) im.log(LogLine::Level::Warning, note);
        // The precision notes are the CPU's (its bf16 and fp16 products): none on GPUs alone.
        if (!gpusOnly(im.project.strategy.devices))
            for (const std::string& note : precisionNotes(im.project.precision))
                im.log(LogLine::Level::Warning, note);
        if (im.resume) {
            // Checkpoints refused on the way to the one this run continues from.
            for (const std::string& note : im.resume->notes)
                im.log(
                    note.rfind("refused", 0) == 0 ? LogLine::Level::Warning : LogLine::Level::Info,
                    note);
        }
        if (!im.staleCheckpointNote.empty())
            im.log(LogLine::Level::Warning, im.staleCheckpointNote);
        im.staleCheckpointNote.clear();
        // Planned alike on every worker (the chief alone writes): with a store, the chief has
        // its recorder here, the other workers the same store path.
        im.trainer->setCheckpointing(im.checkpointPlan(!im.options.storePath.empty()));
        Result<RunFinished> r = guarded("internal error", [&] { return im.trainer->fit(); });
        im.resume.reset();
        if (r.ok()) {
            fin = std::move(r).value();
            // The test split, after a run that ended normally (Keras' evaluate after fit).
            const TrainConfig& tc = im.project.training;
            if (tc.evaluateTest && im.splits.test && !im.control.stopRequested) {
                Result<EvalResult> tr = guarded(
                    "internal error", [&] { return im.trainer->evaluate(*im.splits.test); });
                if (tr.ok()) {
                    for (const auto& [k, val] : tr.value().metrics)
                        fin.finalMetrics["test_" + k] = val;
                } else {
                    fin.status = RunStatus::Failed;
                    fin.message = tr.error();
                }
            }
        } else {
            fin.status = RunStatus::Failed;
            fin.message = r.error();
        }
    }
    fin.seconds = secondsSince(t0);

    if (recorder) {
        // The recorder writes what is queued and the final status before anyone hears the end,
        // so a store that fails at the very end still turns the result into a failure.
        im.bus.unsubscribe(recorderQueue);
        Status written = recorder->finish(fin);
        if (!written.ok()) {
            fin.storeError = "run store: " + written.error();
            if (fin.status != RunStatus::Failed) {
                fin.message = fin.storeError + " (training " + runStatusName(fin.status) +
                              "; rows written before the failure are kept)";
                fin.status = RunStatus::Failed;
            }
        }
    } else if (store && im.runId > 0) {
        // The run's row exists but its recorder never started: record the outcome directly.
        (void)store->finishRun(im.runId, RunStatus::Failed, fin.finalMetrics, fin.message);
    }
    if (fin.status == RunStatus::Failed && im.trainer->workerRank() != 0 && im.chiefRunId > 0 &&
        !im.options.storePath.empty()) {
        // A worker's failure is the chief's to store; but when the chief itself was killed, this
        // report is all the store will learn of why the run ended.
        if (auto st = RunStore::open(im.options.storePath); st.ok())
            (void)(*st)->recordWorkerReport(im.chiefRunId, im.trainer->workerRank(), fin.message);
    }
    if (fin.status == RunStatus::Failed) im.log(LogLine::Level::Error, fin.message);
    im.bus.publish(fin);
    im.bus.closeAll();
    im.isRunning = false;
    if (fin.status == RunStatus::Failed) return err(fin.message);
    return Status::success();
}

void Session::start() {
    impl_->isRunning = true;
    impl_->thread = std::thread([this] { (void)fit(); });
}

void Session::join() {
    if (impl_->thread.joinable()) impl_->thread.join();
}

bool Session::running() const {
    return impl_->isRunning;
}

void Session::requestStop() {
    impl_->control.requestStop();
}

void Session::pause() {
    impl_->control.setPaused(true);
}

void Session::resume() {
    impl_->control.setPaused(false);
}

bool Session::paused() const {
    return impl_->control.isPaused();
}

Result<EvalResult> Session::evaluateTest() {
    if (running()) return err("evaluate: a run is in progress");
    if (!impl_->splits.test) return err("evaluate: the data source has no test split");
    return impl_->trainer->evaluate(*impl_->splits.test);
}

Result<Tensor> Session::predict(const Tensor& x) {
    if (running()) return err("predict: a run is in progress");
    return impl_->trainer->predict(x);
}

Result<std::map<std::string, Tensor>> Session::parameters() {
    if (running()) return err("parameters: a run is in progress");
    return impl_->trainer->parameters();
}

Result<std::string> Session::dumpIr(const std::string& afterPass) {
    Impl& im = *impl_;
    // The first replica's training program as the device runs it: the step around the graph
    // (gradient all-reduce, optimizer update, the loss and metric sums) included.
    if (afterPass == "lowered") return im.trainer->loweredTrainProgram();
    const CompileOptions co = compileOptions(im.project, true);
    BuildOptions bo = buildOptions(im.project, GraphMode::Train);
    bo.halfConv = im.trainer->halfConvolutions();
    TD_ASSIGN_OR_RETURN(Graph g, buildGraph(im.project.model, im.info, bo));
    if (afterPass == "forward") return printGraph(g);
    TD_RETURN_IF_ERROR(autodiff(g, im.project.precision == PrecisionPolicy::MixedFloat16));
    if (afterPass == "build" || afterPass == "autodiff") return printGraph(g);
    PassManager pm;
    addStandardPasses(pm, co);
    std::string dump;
    std::vector<std::string> names{"forward", "autodiff"};
    for (auto& n : pm.passNames()) names.push_back(n);
    names.push_back("final");
    names.push_back("lowered");
    bool known = false;
    for (auto& n : names) known = known || n == afterPass;
    if (!known) {
        std::string list;
        for (auto& n : names) list += (list.empty() ? "" : ", ") + n;
        return err("unknown pass '" + afterPass + "' (expected one of: " + list + ")");
    }
    pm.setDumpHook([&](const std::string& pass, const Graph& gg) {
        if (pass == afterPass) dump = printGraph(gg);
    });
    TD_RETURN_IF_ERROR(pm.run(g));
    if (afterPass == "final") dump = printGraph(g);
    if (dump.empty())
        dump = "# pass " + afterPass + " is disabled for this project\n" + printGraph(g);
    std::string notes = "# passes:";
    for (const auto& t : pm.timings())
        notes += " " + t.pass + (t.skipped ? "(off)" : t.changed ? "(changed)" : "(unchanged)");
    notes += "\n";
    for (const std::string& name : pm.passNames()) {
        auto* fp = dynamic_cast<FusingPass*>(pm.find(name));
        if (!fp || pm.isDisabled(name)) continue;
        for (const auto& d : fp->decisions())
            notes += "# " + name + ": " +
                     (d.fused ? "fused " + d.what : "kept apart: " + d.reason) + "\n";
    }
    if (auto* mp = static_cast<MemoryPlanPass*>(pm.find("memory")); mp && !pm.isDisabled("memory"))
        notes += "# memory: arena " + std::to_string(mp->arenaBytes()) + " bytes (" +
                 std::to_string(mp->naiveBytes()) + " without reuse)\n";
    return notes + dump;
}

// ---- devices and capabilities
// --------------------------------------------------------------------

namespace {

Capability multiWorkerCapability() {
    if (mpiSupported()) return {};
    return {false, kNoMpiSupport};
}

}  // namespace

std::vector<DeviceInfo> listDevices() {
    std::vector<DeviceInfo> out;
    for (const DeviceDesc& d : enumerateDevices())
        out.push_back(DeviceInfo{d.id, d.kind == DeviceKind::Cpu ? "cpu" : "cuda", d.name,
                                 d.memoryBytes, d.computeCapability, d.memoryFreeBytes,
                                 d.driverVersion, d.runtimeVersion});
    return out;
}

Capability precisionCapability(PrecisionPolicy p) {
    if (p == PrecisionPolicy::Float32) return {};
    if (p == PrecisionPolicy::MixedFloat16) return {};  // runs everywhere (see precisionNotes)
    const CpuHalfSupport h = cpuHalfSupport();
    if (h.amxBf16 || h.avx512Bf16) return {};
    const char* allow = std::getenv("TRAINDECK_BF16_EMULATION");
    if (allow && std::string(allow) == "1") return {};
    return {false, detectedCpuIsa() == CpuIsa::Avx512
                       ? "this CPU has neither AMX-BF16 nor AVX512-BF16, so oneDNN would emulate "
                         "bf16 matrix products more slowly than float32 runs them (set "
                         "TRAINDECK_BF16_EMULATION=1 to run it anyway)"
                       : "this CPU has neither AMX-BF16 nor AVX512-BF16 (nor AVX-512, where "
                         "oneDNN has no bf16 matrix product), so bf16 matrix products would run "
                         "converted to float32, more slowly than float32 runs them (set "
                         "TRAINDECK_BF16_EMULATION=1 to run it anyway)"};
}

bool bf16GpuPresent() {
    for (const DeviceDesc& d : enumerateDevices())
        if (d.kind == DeviceKind::Cuda && ccMajor(d.computeCapability) >= 8) return true;
    return false;
}

Capability precisionCapability(PrecisionPolicy p, const std::vector<std::string>& devices) {
    if (!gpusOnly(devices) || p != PrecisionPolicy::MixedBfloat16) return precisionCapability(p);
    const std::vector<DeviceDesc> all = enumerateDevices();
    for (const std::string& id : devices) {
        auto it =
            std::find_if(all.begin(), all.end(), [&](const DeviceDesc& d) { return d.id == id; });
        if (it == all.end()) continue;
        if (ccMajor(it->computeCapability) < 8)
            return {false, id + " (" + it->name + ", compute capability " + it->computeCapability +
                               ") has no bf16 matrix products in cuBLASLt: mixed_bfloat16 needs "
                               "compute capability 8.0 or later"};
    }
    return {};
}

std::vector<std::string> precisionNotes(PrecisionPolicy p) {
    std::vector<std::string> notes;
    const CpuHalfSupport h = cpuHalfSupport();
    if (p == PrecisionPolicy::MixedBfloat16 && !h.amxBf16 && !h.avx512Bf16)
        notes.push_back(
            detectedCpuIsa() == CpuIsa::Avx512
                ? "mixed_bfloat16: this CPU has neither AMX-BF16 nor AVX512-BF16; oneDNN "
                  "emulates the bf16 matrix products (TRAINDECK_BF16_EMULATION=1), slower than "
                  "float32"
                : "mixed_bfloat16: this CPU has no AVX-512, where oneDNN has no bf16 matrix "
                  "product; bf16 values are stored in 16 bits and converted to float32 for each "
                  "matrix product (TRAINDECK_BF16_EMULATION=1; expect it slower than float32)");
    if (p == PrecisionPolicy::MixedFloat16)
        notes.push_back(std::string("mixed_float16: ") +
                        (h.avx512Fp16 ? "this CPU has AVX512-FP16, but this build of oneDNN "
                                        "has no f16 matrix product for it"
                                      : "this CPU has no AVX512-FP16") +
                        "; f16 values are stored in 16 bits and converted to float32 for each "
                        "matrix product (expect it slower than float32)");
    return notes;
}

Capability strategyCapability(const std::string& type) {
    if (type == "one_device" || type == "mirrored") return {};
    if (type == "multi_worker_mirrored") return multiWorkerCapability();
    return {false, "unknown strategy '" + type +
                       "' (expected one_device, mirrored or multi_worker_mirrored)"};
}

}  // namespace td
