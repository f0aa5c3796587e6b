// Checkpoints: the file format and its refusals, atomic writes, keep-best and keep-last-K, and the
// main promise: a run stopped after K steps and resumed gives the same losses, metrics and final
// weights as one that never stopped, bit for bit (one device and two mirrored replicas).
#include <sys/resource.h>

#include <QtTest>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/api/runs.h"
#include "engine/api/session.h"
#include "engine/data/cache_file.h"
#include "engine/store/run_store.h"
#include "engine/train/callbacks.h"
#include "engine/train/checkpoint.h"
#include "tests/source_dir.h"

using namespace td;
namespace fs = std::filesystem;

namespace {

Project blobs(int64_t samples, int epochs) {
    auto loaded = loadProject(std::string(td::dev::kSourceDir) + "/projects/synthetic_blobs.json");
    if (!loaded.ok()) qFatal("%s", loaded.error().c_str());
    Project p = std::move(loaded).value();
    p.data.source.samples = samples;
    p.training.epochs = epochs;
    p.training.evaluateTest = false;
    return p;
}

// Adam (two slots), dropout (keyed randomness), ReduceLROnPlateau that lowers the rate every
// epoch (its wait and the optimizer's override), EarlyStopping that never stops (its best and
// wait): every piece of state a resume must carry.
Project statefulBlobs(int64_t samples, int epochs) {
    Project p = blobs(samples, epochs);
    LayerSpec drop;
    drop.type = LayerType::Dropout;
    drop.rate = 0.25;
    p.model.layers.insert(p.model.layers.begin() + 2, drop);
    for (LayerSpec& l : p.model.layers) l.name.clear();  // names generated again
    p.training.optimizer = OptimizerConfig{};
    p.training.optimizer.name = "adam";
    p.training.optimizer.learningRate = 0.01;
    CallbackConfig lr;
    lr.type = "reduce_lr_on_plateau";
    lr.monitor = "loss";
    lr.patience = 1;
    lr.minDelta = 10;  // nothing improves by 10: the rate halves after every epoch
    lr.factor = 0.5;
    CallbackConfig es;
    es.type = "early_stopping";
    es.monitor = "loss";
    es.patience = 1000;
    p.training.callbacks = {lr, es};
    return p;
}

// Stops the run after global step `at` (-1: never): by request, as the Stop button does, or as a
// callback does through TrainControl.
class StopAt : public Callback {
  public:
    StopAt(int64_t at, bool viaCallback) : at_(at), viaCallback_(viaCallback) {}
    Session* session = nullptr;
    void onBatchEnd(int64_t globalStep, const MetricMap&, TrainControl& c) override {
        if (globalStep != at_) return;
        if (viaCallback_) {
            c.stopTraining = true;
            c.stopReason = "test stop";
        } else if (session) {
            session->requestStop();
        }
    }

  private:
    int64_t at_;
    bool viaCallback_;
};

struct Finished {
    RunFinished fin;
    int64_t runId = 0;
    std::vector<std::string> logs;
};

Finished runSession(const Project& p, SessionOptions o, int64_t stopAt, bool viaCallback) {
    auto stop = std::make_shared<StopAt>(stopAt, viaCallback);
    o.callbacks = {stop};
    auto s = Session::create(p, o);
    if (!s.ok()) qFatal("Session::create: %s", s.error().c_str());
    stop->session = s->get();
    auto q = (*s)->events().subscribe();
    (void)(*s)->fit();
    Finished f;
    f.runId = (*s)->runId();
    for (const Event& e : q->drain()) {
        if (auto* r = std::get_if<RunFinished>(&e)) f.fin = *r;
        if (auto* l = std::get_if<LogLine>(&e)) f.logs.push_back(l->text);
    }
    return f;
}

// Step rows by global step: loss, accuracy and learning rate, as stored.
std::map<int64_t, MetricMap> storedSteps(const std::string& db, int64_t runId) {
    auto store = RunStore::open(db);
    if (!store.ok()) qFatal("%s", store.error().c_str());
    auto rows = (*store)->steps(runId);
    if (!rows.ok()) qFatal("%s", rows.error().c_str());
    std::map<int64_t, MetricMap> out;
    for (const StepRow& r : *rows)
        for (const char* k : {"loss", "accuracy", "lr"})
            if (r.metrics.count(k)) out[r.globalStep][k] = r.metrics.at(k);
    return out;
}

std::map<int, MetricMap> storedEpochs(const std::string& db, int64_t runId) {
    auto store = RunStore::open(db);
    auto rows = (*store)->epochs(runId);
    std::map<int, MetricMap> out;
    for (const EpochRow& r : *rows)
        for (const auto& [k, v] : r.metrics)
            if (k != "samples_per_s" && k != "input_wait_share") out[r.epoch][k] = v;  // timings
    return out;
}

bool sameBits(const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.shape() == b.shape() &&
           std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

CheckpointState sampleState() {
    CheckpointState s;
    s.projectJson = "{\"name\": \"x\"}";
    s.runId = 7;
    s.kind = "run";
    s.globalStep = 45;
    s.epoch = 1;
    s.stepInEpoch = 13;
    s.seed = 99;
    s.epochSamples = 832;
    s.accumulators = {{1.5, 2.5}, {3.0, 4.0}};
    s.lastEpochMetrics = {{"loss", 0.25}, {"accuracy", 0.75}};
    s.monitorValue = 0.125;
    Tensor k(DType::F32, {3, 2});
    for (int i = 0; i < 6; ++i) k.data<float>()[i] = 0.5f * static_cast<float>(i) - 1.0f;
    Tensor b(DType::F32, {2});
    b.data<float>()[0] = 1.0f;
    b.data<float>()[1] = -2.0f;
    s.params = {{"dense/kernel", k}, {"dense/bias", b}};
    s.optimizerIterations = 45;
    s.learningRateOverride = 0.005;
    s.optimizerSlots = {k, b};
    s.callbacks = {CallbackState{{1.0, 2.0}, {b}}, CallbackState{}};
    s.writers = {CheckpointWriterState{"run", std::nullopt, {"a.tdckpt", "b.tdckpt"}}};
    LossScaleState ls;
    ls.scale = 1024.0f;
    ls.goodSteps = 17;
    ls.skippedSteps = 5;
    ls.growthSteps = 100;
    ls.lastSkipped = 1;
    s.lossScale = ls;
    s.lossScaleSkipsReported = 3;
    return s;
}

std::string readFile(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

void writeFile(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

class TestCheckpoint : public QObject {
    Q_OBJECT
  private slots:
    void roundTrip();
    void identityChecked();
    void hashStreamEqualsHashBytes();
    void streamedFileEqualsEncodedBytes();
    void damagedFilesRefused_data();
    void damagedFilesRefused();
    void atomicWriteNeverLeavesHalfFile();
    void resumeEqualsUninterrupted_data();
    void resumeEqualsUninterrupted();
    void damagedLatestFallsBackToPrevious();
    void keepBestAndKeepLast();
    void readerForExporters();
    void backupAndRestore();
    void deleteRunOffersCheckpointFiles();
    void projectFieldErrors_data();
    void projectFieldErrors();
};

void TestCheckpoint::roundTrip() {
    QTemporaryDir dir;
    const std::string path = dir.filePath("sub/c.tdckpt").toStdString();
    const CheckpointState s = sampleState();
    Status w = writeCheckpoint(path, s);
    QVERIFY2(w.ok(), w.ok() ? "" : w.error().c_str());
    auto r = readCheckpoint(path);
    QVERIFY2(r.ok(), r.ok() ? "" : r.error().c_str());
    QCOMPARE(r->projectJson, s.projectJson);
    QCOMPARE(r->runId, s.runId);
    QCOMPARE(r->kind, s.kind);
    QCOMPARE(r->globalStep, s.globalStep);
    QCOMPARE(r->epoch, s.epoch);
    QCOMPARE(r->stepInEpoch, s.stepInEpoch);
    QCOMPARE(r->seed, s.seed);
    QCOMPARE(r->epochSamples, s.epochSamples);
    QVERIFY(r->accumulators == s.accumulators);
    QVERIFY(r->lastEpochMetrics == s.lastEpochMetrics);
    QVERIFY(r->monitorValue == s.monitorValue);
    QCOMPARE(r->params.size(), size_t(2));
    QCOMPARE(r->params[1].name, std::string("dense/bias"));
    QVERIFY(sameBits(r->params[0].value, s.params[0].value));
    QCOMPARE(r->optimizerIterations, s.optimizerIterations);
    QVERIFY(r->learningRateOverride == s.learningRateOverride);
    QVERIFY(sameBits(r->optimizerSlots[1], s.optimizerSlots[1]));
    QCOMPARE(r->callbacks.size(), size_t(2));
    QVERIFY(r->callbacks[0].values == s.callbacks[0].values);
    QVERIFY(sameBits(r->callbacks[0].tensors.at(0), s.callbacks[0].tensors[0]));
    QCOMPARE(r->writers.at(0).kept, s.writers[0].kept);
    QVERIFY(r->lossScale.has_value());
    QCOMPARE(r->lossScale->scale, 1024.0f);
    QCOMPARE(r->lossScale->goodSteps, 17);
    QCOMPARE(r->lossScale->skippedSteps, int64_t(5));
    QCOMPARE(r->lossScale->growthSteps, 100);
    QCOMPARE(r->lossScale->lastSkipped, 1);
    QCOMPARE(r->lossScaleSkipsReported, int64_t(3));
    // Without loss scaling: none read back.
    CheckpointState plain = s;
    plain.lossScale.reset();
    QVERIFY(writeCheckpoint(path, plain).ok());
    QVERIFY(!readCheckpoint(path)->lossScale.has_value());
    QVERIFY(writeCheckpoint(path, s).ok());
    // Only the final file is left in the folder: no temporary.
    int files = 0;
    for (const auto& e : fs::directory_iterator(dir.filePath("sub").toStdString())) {
        ++files;
        QCOMPARE(e.path().filename().string(), std::string("c.tdckpt"));
    }
    QCOMPARE(files, 1);
}

// A checkpoint says whose it is (store, run, model), and every reader can check it: each
// mismatch refused with the file and whose it is instead; a file whose recorded fingerprint is
// not its own project's is refused as altered; fields left empty are not checked.
void TestCheckpoint::identityChecked() {
    QTemporaryDir dir;
    const std::string path = dir.filePath("c.tdckpt").toStdString();
    CheckpointState s = sampleState();
    s.projectJson =
        R"({"name": "x", "model": {"class_name": "Sequential", "config": {"name": "m", "layers": []}},
            "training": {"epochs": 3}})";
    s.storeId = "0123456789abcdef0123456789abcdef";
    s.modelFingerprint = modelFingerprint(s.projectJson);
    QVERIFY(s.modelFingerprint != 0);
    QVERIFY(writeCheckpoint(path, s).ok());
    auto r = readCheckpoint(path);
    QVERIFY(r.ok());
    QCOMPARE(r->storeId, s.storeId);
    QCOMPARE(r->modelFingerprint, s.modelFingerprint);

    CheckpointIdentity mine{s.storeId, "a.db", s.runId, s.modelFingerprint};
    QVERIFY(checkCheckpointIdentity(path, *r, mine).ok());
    QVERIFY(checkCheckpointIdentity(path, *r, {}).ok());
    auto refused = [&](const CheckpointIdentity& want, const std::string& fragment) {
        Status st = checkCheckpointIdentity(path, *r, want);
        QVERIFY(!st.ok());
        QVERIFY2(
            st.error().rfind(path + ": ", 0) == 0 && st.error().find(fragment) != std::string::npos,
            st.error().c_str());
    };
    CheckpointIdentity otherRun = mine;
    otherRun.runId = s.runId + 1;
    refused(otherRun, "belongs to run " + std::to_string(s.runId) + ", expected run " +
                          std::to_string(s.runId + 1) + " of a.db");
    CheckpointIdentity otherStore = mine;
    otherStore.storeId = "ffffffffffffffffffffffffffffffff";
    refused(otherStore, "of another run store (store id " + s.storeId + ")");
    CheckpointIdentity otherModel = mine;
    otherModel.modelFingerprint = s.modelFingerprint ^ 1;
    refused(otherModel, "holds another model than run " + std::to_string(s.runId) + " of a.db");
    // A file of a store from before identities (none recorded): the model is still checked.
    CheckpointState legacy = *r;
    legacy.storeId.clear();
    legacy.modelFingerprint = 0;
    QVERIFY(checkCheckpointIdentity(path, legacy, otherStore).ok());
    QVERIFY(!checkCheckpointIdentity(path, legacy, otherModel).ok());
    // The fingerprint covers the model only: the same model trained longer keeps it.
    nlohmann::json j = nlohmann::json::parse(s.projectJson);
    j["training"]["epochs"] = 99;
    QCOMPARE(modelFingerprint(j.dump()), s.modelFingerprint);
    j["model"]["config"]["name"] = "another";
    QVERIFY(modelFingerprint(j.dump()) != s.modelFingerprint);
    QCOMPARE(modelFingerprint("not json"), uint64_t(0));
    // Altered: a recorded fingerprint that is not its project's.
    CheckpointState altered = *r;
    altered.modelFingerprint ^= 1;
    QVERIFY(writeCheckpoint(path, altered).ok());
    auto m = readCheckpointModel(path);
    QVERIFY(!m.ok());
    QVERIFY2(m.error().find("the file was altered") != std::string::npos, m.error().c_str());
}

// The hash of a file written in parts equals the hash of its bytes at once, whatever the parts.
void TestCheckpoint::hashStreamEqualsHashBytes() {
    std::vector<unsigned char> bytes(5000);
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (auto& b : bytes) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        b = static_cast<unsigned char>(x >> 56);
    }
    for (size_t total : {size_t(0), size_t(1), size_t(31), size_t(32), size_t(33), size_t(4999)}) {
        for (size_t part :
             {size_t(1), size_t(3), size_t(31), size_t(32), size_t(45), size_t(4096)}) {
            HashStream h(0x1234);
            for (size_t at = 0; at < total; at += part)
                h.update(bytes.data() + at, std::min(part, total - at));
            QCOMPARE(h.bytes(), uint64_t(total));
            QCOMPARE(h.digest(), hashBytes(bytes.data(), total, 0x1234));
        }
        // Irregular parts, with empty ones.
        HashStream h(7);
        size_t at = 0, step = 0;
        while (at < total) {
            const size_t n = std::min(total - at, (step++ * 7) % 53);
            h.update(bytes.data() + at, n);
            at += n;
        }
        QCOMPARE(h.digest(), hashBytes(bytes.data(), total, 7));
    }
    // It tells different bytes apart, as hashBytes does.
    HashStream a(0), b(0);
    a.update(bytes.data(), 100);
    bytes[50] ^= 1;
    b.update(bytes.data(), 100);
    QVERIFY(a.digest() != b.digest());
}

// writeCheckpoint streams the payload into the file (tensors straight from their memory, small
// fields through a buffer): the file is byte for byte the header and payload built in memory, for
// fields that straddle the buffer's edge and tensors larger than it.
void TestCheckpoint::streamedFileEqualsEncodedBytes() {
    QTemporaryDir dir;
    const std::string path = dir.filePath("c.tdckpt").toStdString();
    CheckpointState s = sampleState();
    auto fill = [](Tensor& t, float seed) {
        for (int64_t i = 0; i < t.size(); ++i)
            t.data<float>()[i] = seed + 0.001f * static_cast<float>(i % 977);
    };
    Tensor big(DType::F32, {300, 301});  // 361,200 bytes: written from the tensor itself
    Tensor mid(DType::F32, {5001});      // 20,004 bytes: through the buffer, across its edge
    Tensor odd(DType::F32, {3});
    fill(big, 1.0f);
    fill(mid, -2.0f);
    fill(odd, 3.0f);
    s.params = {{"a/kernel", big}, {"a/bias", mid},   {"b/kernel", odd},
                {"c/kernel", mid}, {"d/kernel", mid}, {"e/kernel", mid}};
    s.optimizerSlots = {big, mid, odd, mid, mid, mid, big, odd};
    QVERIFY(writeCheckpoint(path, s).ok());
    const std::string expected = checkpointFileBytes(encodeCheckpointPayload(s));
    const std::string file = readFile(path);
    QCOMPARE(file.size(), expected.size());
    QVERIFY(file == expected);
    auto r = readCheckpoint(path);
    QVERIFY2(r.ok(), r.ok() ? "" : r.error().c_str());
    QVERIFY(sameBits(r->params[0].value, big));
    QVERIFY(sameBits(r->optimizerSlots[6], big));
}

void TestCheckpoint::damagedFilesRefused_data() {
    QTest::addColumn<QString>("damage");
    QTest::addColumn<QString>("expected");
    QTest::newRow("empty") << "empty"
                           << "truncated: expected a header of 40 bytes";
    QTest::newRow("short header") << "header"
                                  << "truncated: expected a header of 40 bytes";
    QTest::newRow("truncated payload") << "payload"
                                       << "truncated: expected";
    QTest::newRow("bit flip in weights") << "flip"
                                         << "checksum mismatch (the file is damaged)";
    QTest::newRow("bit flip in header") << "flipheader"
                                        << "header checksum mismatch";
    QTest::newRow("bad magic") << "magic"
                               << "bad magic";
    QTest::newRow("bytes appended") << "append"
                                    << "size mismatch";
}

void TestCheckpoint::damagedFilesRefused() {
    QFETCH(QString, damage);
    QFETCH(QString, expected);
    QTemporaryDir dir;
    const std::string path = dir.filePath("c.tdckpt").toStdString();
    QVERIFY(writeCheckpoint(path, sampleState()).ok());
    std::string bytes = readFile(path);
    if (damage == "empty") bytes.clear();
    if (damage == "header") bytes.resize(20);
    if (damage == "payload") bytes.resize(bytes.size() - 17);
    if (damage == "flip") bytes[bytes.size() - 30] ^= 0x10;  // inside the last tensors
    if (damage == "flipheader") bytes[17] ^= 0x01;           // the payload's size
    if (damage == "magic") bytes[0] = 'X';
    if (damage == "append") bytes += "extra";
    writeFile(path, bytes);
    auto r = readCheckpoint(path);
    QVERIFY(!r.ok());
    QVERIFY2(QString::fromStdString(r.error()).startsWith(QString::fromStdString(path)),
             r.error().c_str());
    QVERIFY2(QString::fromStdString(r.error()).contains(expected), r.error().c_str());
    QVERIFY(!readCheckpointModel(path).ok());
}

// A write that fails part-way (here: the file-size limit, as a full disk would) leaves the
// previous checkpoint under the final name untouched and no temporary behind.
void TestCheckpoint::atomicWriteNeverLeavesHalfFile() {
    QTemporaryDir dir;
    const std::string path = dir.filePath("c.tdckpt").toStdString();
    CheckpointState old = sampleState();
    QVERIFY(writeCheckpoint(path, old).ok());
    const std::string before = readFile(path);
    CheckpointState big = sampleState();
    big.globalStep = 1000;
    big.params[0].value = Tensor(DType::F32, {1024, 1024});  // 4 MiB
    std::memset(big.params[0].value.raw(), 0, big.params[0].value.bytes());
    struct rlimit saved {};
    QCOMPARE(getrlimit(RLIMIT_FSIZE, &saved), 0);
    auto oldHandler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = saved;
    small.rlim_cur = 64 * 1024;
    QCOMPARE(setrlimit(RLIMIT_FSIZE, &small), 0);
    Status st = writeCheckpoint(path, big);
    setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, oldHandler);
    QVERIFY(!st.ok());
    QVERIFY2(QString::fromStdString(st.error()).contains("write"), st.error().c_str());
    QCOMPARE(readFile(path), before);
    auto r = readCheckpoint(path);
    QVERIFY(r.ok());
    QCOMPARE(r->globalStep, old.globalStep);
    int files = 0;
    for (const auto& e : fs::directory_iterator(dir.path().toStdString())) {
        (void)e;
        ++files;
    }
    QCOMPARE(files, 1);
}

void TestCheckpoint::resumeEqualsUninterrupted_data() {
    QTest::addColumn<QString>("strategy");
    QTest::addColumn<int>("stopAt");
    QTest::addColumn<bool>("viaCallback");
    QTest::addColumn<bool>("batchNorm");  // BatchNormalization: moving statistics in the state
    QTest::addColumn<bool>("float16");    // mixed_float16: the loss scale in the state
    // 32 steps an epoch, a log point every 8: 45 is mid-epoch and between log points.
    QTest::newRow("one_device, stop mid-epoch") << "one_device" << 45 << false << false << false;
    QTest::newRow("one_device, stop at an epoch's end")
        << "one_device" << 64 << false << false << false;
    QTest::newRow("one_device, callback stops at an epoch's last step")
        << "one_device" << 64 << true << false << false;
    QTest::newRow("mirrored x2, stop mid-epoch") << "mirrored" << 45 << false << false << false;
    QTest::newRow("one_device, BatchNormalization, stop mid-epoch")
        << "one_device" << 45 << false << true << false;
    QTest::newRow("mirrored x2, BatchNormalization, stop mid-epoch")
        << "mirrored" << 45 << false << true << false;
    // The loss scale starts at 2^24 (the first steps overflow and halve it) and doubles after
    // every 4 finite steps, so steps are skipped all through the run, some of them between the
    // last log point and the stop: the scale, its counters and the skips not yet reported must
    // all resume.
    QTest::newRow("one_device, mixed_float16, stop mid-epoch")
        << "one_device" << 45 << false << false << true;
}

void TestCheckpoint::resumeEqualsUninterrupted() {
    QFETCH(QString, strategy);
    QFETCH(int, stopAt);
    QFETCH(bool, viaCallback);
    QFETCH(bool, batchNorm);
    QFETCH(bool, float16);
    Project p = statefulBlobs(2048, 4);
    if (float16) {
        p.precision = PrecisionPolicy::MixedFloat16;
        p.lossScaleInitial = 16777216.0;
        p.lossScaleGrowthSteps = 4;
    }
    if (batchNorm) {
        LayerSpec bn;
        bn.type = LayerType::BatchNormalization;
        bn.momentum = 0.9;
        p.model.layers.insert(p.model.layers.begin() + 2, bn);
    }
    p.strategy.type = strategy.toStdString();
    if (strategy == "mirrored") p.strategy.replicas = 2;
    QTemporaryDir dir;
    SessionOptions a, b;
    a.storePath = dir.filePath("straight/runs.db").toStdString();
    b.storePath = dir.filePath("resumed/runs.db").toStdString();
    fs::create_directories(dir.filePath("straight").toStdString());
    fs::create_directories(dir.filePath("resumed").toStdString());

    Finished straight = runSession(p, a, -1, false);
    QCOMPARE(straight.fin.status, RunStatus::Completed);

    Finished first = runSession(p, b, stopAt, viaCallback);
    QCOMPARE(first.fin.status, RunStatus::Stopped);
    auto point = findResumePoint(b.storePath, std::to_string(first.runId));
    QVERIFY2(point.ok(), point.ok() ? "" : point.error().c_str());
    QCOMPARE(point->runId, first.runId);
    QCOMPARE(point->state->globalStep, int64_t(stopAt));
    QVERIFY(point->notes.empty());
    b.resume = *point;
    Finished second = runSession(point->project, b, -1, false);
    QCOMPARE(second.fin.status, RunStatus::Completed);
    QCOMPARE(second.runId, first.runId);  // the same stored run goes on
    bool said = false;
    for (const std::string& l : second.logs) said = said || l.find("resuming from") == 0;
    QVERIFY(said);

    // Every logged step of the uninterrupted run, in the resumed run's store, bit for bit.
    const auto want = storedSteps(a.storePath, straight.runId);
    const auto got = storedSteps(b.storePath, first.runId);
    QCOMPARE(want.size(), size_t(4 * 4));  // 4 log points an epoch
    int after = 0;
    for (const auto& [g, m] : want) {
        QVERIFY2(got.count(g), qPrintable(QString("step %1 missing").arg(g)));
        for (const auto& [k, v] : m)
            QVERIFY2(got.at(g).at(k) == v, qPrintable(QString("step %1 %2: %3 != %4")
                                                          .arg(g)
                                                          .arg(k.c_str())
                                                          .arg(got.at(g).at(k), 0, 'g', 17)
                                                          .arg(v, 0, 'g', 17)));
        after += g > stopAt;
    }
    QVERIFY(after >= 8);
    QVERIFY(storedEpochs(a.storePath, straight.runId) == storedEpochs(b.storePath, first.runId));
    auto store = RunStore::open(b.storePath);
    QCOMPARE((*store)->getRun(first.runId)->status, std::string("completed"));

    // Final weights, optimizer slots and state: the runs' last checkpoints.
    auto pa = api::latestCheckpointForRun(a.storePath, straight.runId);
    auto pb = api::latestCheckpointForRun(b.storePath, first.runId);
    QVERIFY2(pa.ok() && pb.ok(),
             pa.ok() ? (pb.ok() ? "" : pb.error().c_str()) : pa.error().c_str());
    auto sa = readCheckpoint(*pa);
    auto sb = readCheckpoint(*pb);
    QVERIFY(sa.ok() && sb.ok());
    QCOMPARE(sa->globalStep, int64_t(4 * 32));
    QCOMPARE(sb->globalStep, sa->globalStep);
    QCOMPARE(sb->params.size(), sa->params.size());
    for (size_t i = 0; i < sa->params.size(); ++i)
        QVERIFY2(sameBits(sa->params[i].value, sb->params[i].value), sa->params[i].name.c_str());
    // Adam's two slots for each trainable parameter (gamma and beta too, not the moving ones).
    QCOMPARE(sb->optimizerSlots.size(), size_t(2 * (batchNorm ? 6 : 4)));
    if (batchNorm) {
        QCOMPARE(sb->params.size(), size_t(8));
        bool moved = false;
        for (const auto& t : sb->params)
            if (t.name.find("moving_mean") != std::string::npos)
                for (int64_t k = 0; k < t.value.size(); ++k)
                    moved = moved || t.value.data<float>()[k] != 0.f;
        QVERIFY(moved);
    }
    for (size_t i = 0; i < sa->optimizerSlots.size(); ++i)
        QVERIFY(sameBits(sa->optimizerSlots[i], sb->optimizerSlots[i]));
    QCOMPARE(sb->optimizerIterations, sa->optimizerIterations);
    QVERIFY(sa->learningRateOverride.has_value());  // ReduceLROnPlateau acted
    QVERIFY(sb->learningRateOverride == sa->learningRateOverride);
    QVERIFY(sb->callbacks.size() == sa->callbacks.size());
    for (size_t i = 0; i < sa->callbacks.size(); ++i)
        QVERIFY(sb->callbacks[i].values == sa->callbacks[i].values);
    QCOMPARE(sb->lossScale.has_value(), float16);
    if (float16) {
        QVERIFY(sa->lossScale.has_value());
        QVERIFY2(sa->lossScale->skippedSteps >= 10,
                 qPrintable(QString("%1 skipped steps").arg(sa->lossScale->skippedSteps)));
        QCOMPARE(sb->lossScale->scale, sa->lossScale->scale);
        QCOMPARE(sb->lossScale->goodSteps, sa->lossScale->goodSteps);
        QCOMPARE(sb->lossScale->skippedSteps, sa->lossScale->skippedSteps);
        QCOMPARE(sb->lossScale->growthSteps, 4);
        QCOMPARE(sb->lossScaleSkipsReported, sa->lossScaleSkipsReported);
    }
}

// The newest checkpoint damaged (a bit flip, then also a truncation of the next): refused with
// the reason, the previous good one used, and the run still completes.
void TestCheckpoint::damagedLatestFallsBackToPrevious() {
    Project p = statefulBlobs(2048, 5);
    QTemporaryDir dir;
    SessionOptions o;
    o.storePath = dir.filePath("runs.db").toStdString();
    Finished first = runSession(p, o, 3 * 32 + 5, false);  // run checkpoints after epochs 2, 3
    QCOMPARE(first.fin.status, RunStatus::Stopped);
    auto store = RunStore::open(o.storePath);
    auto rows = (*store)->checkpoints(first.runId);
    QVERIFY(rows.ok());
    QCOMPARE(rows->size(), size_t(2));  // keeps the last two
    QCOMPARE(rows->at(0).globalStep, int64_t(3 * 32 + 5));
    QCOMPARE(rows->at(1).globalStep, int64_t(3 * 32));
    QVERIFY(fs::exists(rows->at(0).path) && fs::exists(rows->at(1).path));
    QVERIFY(QString::fromStdString(rows->at(0).path)
                .startsWith(dir.filePath("checkpoints/runs.db/run-%1/").arg(first.runId)));

    std::string bytes = readFile(rows->at(0).path);
    bytes[bytes.size() / 2] ^= 0x04;
    writeFile(rows->at(0).path, bytes);
    auto point = findResumePoint(o.storePath, std::to_string(first.runId));
    QVERIFY2(point.ok(), point.ok() ? "" : point.error().c_str());
    QCOMPARE(point->checkpointPath, rows->at(1).path);
    QCOMPARE(point->notes.size(), size_t(2));
    QVERIFY2(QString::fromStdString(point->notes[0]).contains("checksum mismatch"),
             point->notes[0].c_str());
    QVERIFY(
        QString::fromStdString(point->notes[0]).contains(QString::fromStdString(rows->at(0).path)));
    QVERIFY(QString::fromStdString(point->notes[1]).startsWith("using the previous good"));
    // latestCheckpointForRun skips it too.
    auto latest = api::latestCheckpointForRun(o.storePath, first.runId);
    QVERIFY(latest.ok());
    QCOMPARE(*latest, rows->at(1).path);

    // Both damaged: a clear error naming each file and its fault.
    std::string older = readFile(rows->at(1).path);
    writeFile(rows->at(1).path, older.substr(0, older.size() / 3));
    auto none = findResumePoint(o.storePath, std::to_string(first.runId));
    QVERIFY(!none.ok());
    QVERIFY2(QString::fromStdString(none.error()).contains("none of its checkpoints can be used"),
             none.error().c_str());
    QVERIFY(QString::fromStdString(none.error()).contains("truncated"));
    QVERIFY(QString::fromStdString(none.error()).contains("checksum mismatch"));

    // With the older one intact again, the resumed run goes on from it and completes, and says
    // which one it refused.
    writeFile(rows->at(1).path, older);
    point = findResumePoint(o.storePath, std::to_string(first.runId));
    QVERIFY(point.ok());
    o.resume = *point;
    Finished second = runSession(point->project, o, -1, false);
    QCOMPARE(second.fin.status, RunStatus::Completed);
    bool warned = false;
    for (const std::string& l : second.logs) warned = warned || l.find("refused") == 0;
    QVERIFY(warned);
    auto run = (*store)->getRun(first.runId);
    QCOMPARE(run->status, std::string("completed"));
}

void TestCheckpoint::keepBestAndKeepLast() {
    Project p = blobs(2048, 6);
    QTemporaryDir dir;
    const std::string bestDir = dir.filePath("best").toStdString();
    const std::string lastDir = dir.filePath("last").toStdString();
    CallbackConfig best;
    best.type = "model_checkpoint";
    best.directory = bestDir;
    best.saveBestOnly = true;
    best.monitor = "loss";
    best.mode = "min";
    CallbackConfig last;
    last.type = "model_checkpoint";
    last.directory = lastDir;
    last.saveFreqSteps = 20;
    last.keepLast = 3;
    // A learning rate so high the loss goes up and down: not every epoch is a new best.
    p.training.optimizer.learningRate = 0.4;
    p.training.callbacks = {best, last};
    SessionOptions o;
    o.storePath = dir.filePath("runs.db").toStdString();
    Finished f = runSession(p, o, -1, false);
    QCOMPARE(f.fin.status, RunStatus::Completed);

    auto epochs = storedEpochs(o.storePath, f.runId);
    QCOMPARE(epochs.size(), size_t(6));
    int bestEpoch = 0;
    for (const auto& [e, m] : epochs)
        if (m.at("loss") < epochs.at(bestEpoch).at("loss")) bestEpoch = e;
    std::vector<std::string> bestFiles, lastFiles;
    for (const auto& e : fs::directory_iterator(bestDir)) bestFiles.push_back(e.path().string());
    for (const auto& e : fs::directory_iterator(lastDir)) lastFiles.push_back(e.path().string());
    QCOMPARE(bestFiles.size(), size_t(1));
    auto b = readCheckpoint(bestFiles[0]);
    QVERIFY(b.ok());
    QCOMPARE(b->globalStep, int64_t((bestEpoch + 1) * 32));
    QVERIFY(b->monitorValue.has_value());
    QCOMPARE(*b->monitorValue, epochs.at(bestEpoch).at("loss"));
    std::sort(lastFiles.begin(), lastFiles.end());
    QCOMPARE(lastFiles.size(), size_t(3));  // 6 x 32 = 192 steps: 140, 160, 180 kept
    QCOMPARE(lastFiles,
             (std::vector<std::string>{lastDir + "/model-140.tdckpt", lastDir + "/model-160.tdckpt",
                                       lastDir + "/model-180.tdckpt"}));
    // The store knows exactly the files that exist (plus the run's own two).
    auto store = RunStore::open(o.storePath);
    auto rows = (*store)->checkpoints(f.runId);
    QVERIFY(rows.ok());
    std::set<std::string> registered, kinds;
    for (const CheckpointRow& r : *rows) {
        QVERIFY2(fs::exists(r.path), r.path.c_str());
        registered.insert(r.path);
        kinds.insert(r.kind);
    }
    QCOMPARE(rows->size(), size_t(1 + 3 + 2));
    QVERIFY(registered.count(bestFiles[0]));
    for (const std::string& l : lastFiles) QVERIFY(registered.count(l));
    QCOMPARE(kinds, (std::set<std::string>{"model_checkpoint", "run"}));
}

void TestCheckpoint::readerForExporters() {
    Project p = statefulBlobs(512, 1);
    QTemporaryDir dir;
    SessionOptions o;
    o.storePath = dir.filePath("runs.db").toStdString();
    Finished f = runSession(p, o, -1, false);
    QCOMPARE(f.fin.status, RunStatus::Completed);
    auto path = api::latestCheckpointForRun(o.storePath, f.runId);
    QVERIFY2(path.ok(), path.ok() ? "" : path.error().c_str());
    auto m = readCheckpointModel(*path);
    QVERIFY2(m.ok(), m.ok() ? "" : m.error().c_str());
    QCOMPARE(m->runId, f.runId);
    QCOMPARE(m->model.layers.size(), size_t(4));  // input, dense, dropout, dense
    std::vector<std::string> names;
    for (const NamedTensor& w : m->weights) names.push_back(w.name);
    const std::string d0 = m->model.layers[1].name, d1 = m->model.layers[3].name;
    QCOMPARE(names, (std::vector<std::string>{d0 + "/kernel", d0 + "/bias", d1 + "/kernel",
                                              d1 + "/bias"}));
    QCOMPARE(m->weights[0].value.shape(), (Shape{16, 32}));
    QCOMPARE(m->weights[3].value.shape(), (Shape{4}));
    // A checkpoint whose weights do not fit its project is refused by name.
    auto st = readCheckpoint(*path);
    st->params[2].value = Tensor(DType::F32, {31, 4});
    const std::string bad = dir.filePath("bad.tdckpt").toStdString();
    QVERIFY(writeCheckpoint(bad, *st).ok());
    auto refused = readCheckpointModel(bad);
    QVERIFY(!refused.ok());
    QVERIFY2(QString::fromStdString(refused.error()).contains("expects f32 [32,4]"),
             refused.error().c_str());
    auto missing = api::latestCheckpointForRun(o.storePath, f.runId + 100);
    QVERIFY(!missing.ok());
}

// Keras' BackupAndRestore: the same project started again after a stop restores its backup by
// itself, continues the same stored run, and the backup is deleted once the run completes.
void TestCheckpoint::backupAndRestore() {
    Project p = statefulBlobs(2048, 3);
    QTemporaryDir dir;
    CallbackConfig backup;
    backup.type = "backup_and_restore";
    backup.directory = dir.filePath("backup").toStdString();
    backup.saveFreqSteps = 10;
    p.training.callbacks.push_back(backup);
    SessionOptions o;
    o.storePath = dir.filePath("runs.db").toStdString();
    Finished first = runSession(p, o, 37, false);
    QCOMPARE(first.fin.status, RunStatus::Stopped);
    QVERIFY(fs::exists(backup.directory + "/backup-37.tdckpt"));  // saved at the stop
    QVERIFY(fs::exists(backup.directory + "/backup-30.tdckpt"));
    QVERIFY(!fs::exists(backup.directory + "/backup-20.tdckpt"));  // keeps two
    Finished second = runSession(p, o, -1, false);
    QCOMPARE(second.fin.status, RunStatus::Completed);
    QCOMPARE(second.runId, first.runId);
    bool restored = false;
    for (const std::string& l : second.logs)
        restored = restored || l.find("BackupAndRestore: restoring " + backup.directory +
                                      "/backup-37.tdckpt") == 0;
    QVERIFY(restored);
    QVERIFY(fs::is_empty(backup.directory));
    auto store = RunStore::open(o.storePath);
    auto rows = (*store)->checkpoints(first.runId);
    QVERIFY(rows.ok() && !rows->empty());
    for (const CheckpointRow& r : *rows) QCOMPARE(r.kind, std::string("run"));

    // Against a run that never stopped.
    Project plain = p;
    plain.training.callbacks.pop_back();
    SessionOptions s;
    s.storePath = dir.filePath("straight.db").toStdString();
    Finished straight = runSession(plain, s, -1, false);
    auto got = storedSteps(o.storePath, first.runId);
    got.erase(37);  // a stop's own row (when it has one) is no log point of the straight run
    QVERIFY(storedSteps(s.storePath, straight.runId) == got);
}

void TestCheckpoint::deleteRunOffersCheckpointFiles() {
    QTemporaryDir dir;
    SessionOptions o;
    o.storePath = dir.filePath("runs.db").toStdString();
    Finished keep = runSession(blobs(512, 2), o, -1, false);
    Finished drop = runSession(blobs(512, 2), o, -1, false);
    auto catalog = api::RunCatalog::open(o.storePath);
    QVERIFY(catalog.ok());
    auto keepFiles = (*catalog)->checkpoints(keep.runId);
    auto dropFiles = (*catalog)->checkpoints(drop.runId);
    QCOMPARE(keepFiles->size(), size_t(2));
    QCOMPARE(dropFiles->size(), size_t(2));
    QVERIFY((*catalog)->remove(keep.runId, false).ok());
    for (const CheckpointRow& r : *keepFiles) QVERIFY(fs::exists(r.path));
    QVERIFY((*catalog)->remove(drop.runId, true).ok());
    for (const CheckpointRow& r : *dropFiles) QVERIFY(!fs::exists(r.path));
    QVERIFY(!fs::exists(runCheckpointDir(o.storePath, drop.runId)));
    QVERIFY(fs::exists(runCheckpointDir(o.storePath, keep.runId)));
    QVERIFY(!(*catalog)->run(drop.runId).ok());
}

void TestCheckpoint::projectFieldErrors_data() {
    QTest::addColumn<QString>("callback");
    QTest::addColumn<QString>("expected");
    QTest::newRow("save_freq word")
        << R"({"class_name": "ModelCheckpoint", "config": {"save_freq": "weekly"}})"
        << "training.callbacks[0].config.save_freq";
    QTest::newRow("keep_last 0")
        << R"({"class_name": "ModelCheckpoint", "config": {"keep_last": 0}})"
        << "training.callbacks[0].config.keep_last";
    QTest::newRow("unknown key")
        << R"({"class_name": "ModelCheckpoint", "config": {"filepath": "x"}})"
        << "training.callbacks[0].config";
    QTest::newRow("best of an unlogged metric")
        << R"({"class_name": "ModelCheckpoint", "config": {"save_best_only": true, "monitor": "val_auc"}})"
        << "training.callbacks[0].config.monitor";
    QTest::newRow("backup without folder")
        << R"({"class_name": "BackupAndRestore", "config": {"save_freq": 5}})"
        << "training.callbacks[0].config.backup_dir: required";
    QTest::newRow("backup without config") << R"({"class_name": "BackupAndRestore"})"
                                           << "training.callbacks[0].config.backup_dir";
    QTest::newRow("run_checkpoints not a bool") << ""
                                                << "training.run_checkpoints";
}

void TestCheckpoint::projectFieldErrors() {
    QFETCH(QString, callback);
    QFETCH(QString, expected);
    std::string text =
        readFile(std::string(td::dev::kSourceDir) + "/projects/synthetic_blobs.json");
    const std::string from = R"("callbacks": [{"class_name": "TerminateOnNaN"}],)";
    const size_t at = text.find(from);
    QVERIFY(at != std::string::npos);
    text.replace(at, from.size(),
                 callback.isEmpty() ? std::string(R"("run_checkpoints": "yes",)")
                                    : R"("callbacks": [)" + callback.toStdString() + "],");
    auto p = parseProject(text, "p.json");
    QVERIFY(!p.ok());
    QVERIFY2(QString::fromStdString(p.error()).contains(expected), p.error().c_str());
    // The fields round-trip when valid.
    Project ok = blobs(256, 1);
    CallbackConfig mc;
    mc.type = "model_checkpoint";
    mc.saveFreqSteps = 7;
    mc.keepLast = 4;
    mc.saveBestOnly = true;
    mc.monitor = "accuracy";
    CallbackConfig br;
    br.type = "backup_and_restore";
    br.directory = "/tmp/x";
    br.deleteCheckpoint = false;
    ok.training.callbacks = {mc, br};
    ok.training.runCheckpoints = false;
    auto back = parseProject(projectToJson(ok), "p.json");
    QVERIFY2(back.ok(), back.ok() ? "" : back.error().c_str());
    QCOMPARE(projectDifference(ok, *back), std::string());
}

QTEST_GUILESS_MAIN(TestCheckpoint)
#include "test_checkpoint.moc"
