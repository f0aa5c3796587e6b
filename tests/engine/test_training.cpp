// End-to-end training through the public Session API: thresholds, events, the store, stop and
// pause, remainder batches, determinism, predict, and clear errors for bad projects.
#include <pthread.h>
#include <sys/resource.h>

#include <QtTest>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <stdexcept>
#include <thread>

#include "engine/api/data_preview.h"
#include "engine/api/projects.h"
#include "engine/api/session.h"
#include "engine/backend/backend.h"
#include "engine/backend/host_threads.h"
#include "engine/core/text_limits.h"
#include "engine/graph/passes.h"
#include "engine/store/run_store.h"
#include "engine/train/callbacks.h"
#include "tests/scoped_env.h"
#include "tests/source_dir.h"

using namespace td;

namespace {

Project loadExample(const char* name) {
    auto p = loadProject(std::string(td::dev::kSourceDir) + "/projects/" + name);
    if (!p.ok()) qFatal("%s", p.error().c_str());
    return std::move(p).value();
}

Project synthetic(int64_t samples = 2048, int epochs = 5) {
    Project p = loadExample("synthetic_blobs.json");
    p.data.source.samples = samples;
    p.training.epochs = epochs;
    return p;
}

// An MLP with dropout trained with Adam on the synthetic blobs (64 features): 64 -> units ReLU
// -> units/2 ReLU -> dropout 0.2 -> 4 softmax, `steps` steps of `batch`, every step logged.
Project dropoutMlp(int units, int batch, int steps) {
    Project p = synthetic(int64_t{batch} * steps, 1);
    p.data.source.sampleShape = {64};
    p.data.source.testSamples = 256;
    p.training.batchSize = batch;
    p.training.logEverySteps = 1;
    p.training.optimizer = OptimizerConfig{};  // Adam, learning rate 0.001
    p.training.callbacks.clear();
    const std::string u = std::to_string(units), half = std::to_string(units / 2);
    auto model = modelFromKerasJson(R"({"class_name": "Sequential", "config": {"layers": [
        {"class_name": "InputLayer", "config": {"batch_shape": [null, 64]}},
        {"class_name": "Dense", "config": {"units": )" +
                                    u + R"(, "activation": "relu"}},
        {"class_name": "Dense", "config": {"units": )" +
                                    half + R"(, "activation": "relu"}},
        {"class_name": "Dropout", "config": {"rate": 0.2}},
        {"class_name": "Dense", "config": {"units": 4, "activation": "softmax"}}]}})");
    if (!model.ok()) qFatal("%s", model.error().c_str());
    p.model = *model;
    return p;
}

struct Recorded {
    std::vector<Event> events;
    template <typename T>
    std::vector<T> all() const {
        std::vector<T> out;
        for (const auto& e : events)
            if (auto* x = std::get_if<T>(&e)) out.push_back(*x);
        return out;
    }
};

Recorded runToEnd(Session& s) {
    auto q = s.events().subscribe();
    Status st = s.fit();
    Recorded r;
    r.events = q->drain();
    if (!st.ok()) qWarning("fit: %s", st.error().c_str());
    return r;
}

// Each logged step's running mean of the loss, then the test loss, of a run trained to its end
// (a failed test and what is there so far where it does not complete).
std::vector<double> stepLosses(const Project& p, const SessionOptions& o) {
    std::vector<double> out;
    auto s = Session::create(p, o);
    if (!s.ok()) {
        QTest::qFail(s.error().c_str(), __FILE__, __LINE__);
        return out;
    }
    Recorded r = runToEnd(**s);
    for (const StepMetrics& m : r.all<StepMetrics>()) out.push_back(m.metrics.at("loss"));
    const auto fin = r.all<RunFinished>();
    if (fin.size() != 1 || fin[0].status != RunStatus::Completed) {
        QTest::qFail("the run did not complete", __FILE__, __LINE__);
        return out;
    }
    out.push_back(fin[0].finalMetrics.at("test_loss"));
    return out;
}

// What a subscriber saw of a run started with Session::start(): every event until the queue
// closed, or until the deadline (a hang) when it never did.
struct Watched {
    Recorded recorded;
    bool closed = false;
    std::optional<RunFinished> finished() const {
        auto f = recorded.all<RunFinished>();
        if (f.size() != 1) return std::nullopt;
        return f[0];
    }
};

Watched watchToEnd(Session& s, std::chrono::seconds limit = std::chrono::seconds(60)) {
    auto q = s.events().subscribe();
    s.start();
    Watched w;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
        if (auto e = q->pop(std::chrono::milliseconds(100))) {
            w.recorded.events.push_back(std::move(*e));
        } else if (q->closed()) {
            w.closed = true;
            break;
        }
    }
    if (w.closed) s.join();  // a hung run is left to ~Session
    return w;
}

using td::test::ScopedEnv;

// A callback that fails (throws) at one global step, as a user's Keras callback may raise.
class ThrowingCallback : public Callback {
  public:
    explicit ThrowingCallback(int64_t atStep) : atStep_(atStep) {}
    void onBatchEnd(int64_t globalStep, const MetricMap&, TrainControl&) override {
        if (globalStep == atStep_) throw std::runtime_error("metric server unreachable");
    }

  private:
    int64_t atStep_;
};

}  // namespace

class TestTraining : public QObject {
    Q_OBJECT
  private slots:
    void syntheticReachesThreshold();
    void eventsAndStore();
    void storedRunsGetDistinctDefaultNames();
    void sameSeedSameLosses();
    void remainderAndDropRemainder();
    void stopMidRun();
    void pauseAndResume();
    void validationSplitAndEarlyStopping();
    void validationOnTestSplit();
    void predictGivesProbabilities();
    void csvProjectTrains();
    void fashionMnistShortRun();
    void cnnTrainsOnImages_data();
    void cnnTrainsOnImages();
    void badProjects_data();
    void badProjects();
    void storeCannotBeOpened_data();
    void storeCannotBeOpened();
    void storeFullAtStart();
    void storeFullMidRun();
    void callbackThrows();
    void dataFailsMidEpoch();
    void pausedTimeIsNotEpochTime();
    void mixedPrecisionTrains();
    void bf16CapabilityFollowsTheDevices();
    void validationSplitLeavesNoRows_data();
    void validationSplitLeavesNoRows();
    void createLeavesNoOpenMPWorkers();
    void cpuPassesOffKeepTheLosses_data();
    void cpuPassesOffKeepTheLosses();
    void cnnPassesOffKeepTheBits_data();
    void cnnPassesOffKeepTheBits();
    void cpuPassNamesAreChecked();
};

void TestTraining::syntheticReachesThreshold() {
    auto s = Session::create(synthetic(), {});
    QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
    Recorded r = runToEnd(**s);
    auto fin = r.all<RunFinished>();
    QCOMPARE(fin.size(), size_t(1));
    QCOMPARE(fin[0].status, RunStatus::Completed);
    auto epochs = r.all<EpochMetrics>();
    QCOMPARE(epochs.size(), size_t(5));
    QVERIFY(epochs.back().metrics.at("loss") < epochs.front().metrics.at("loss"));
    QVERIFY2(fin[0].finalMetrics.at("test_accuracy") > 0.9,
             qPrintable(QString::number(fin[0].finalMetrics.at("test_accuracy"))));
    QVERIFY(fin[0].finalMetrics.at("test_loss") < 0.4);
}

// mixed_bfloat16 is judged on the devices that run it: on GPUs alone the CPU's bf16 support does
// not matter (a GPU that is not there is named by the strategy's check instead); on the CPU it
// does, as before. With TRAINDECK_BF16_EMULATION unset, a CPU without bf16 products refuses.
void TestTraining::bf16CapabilityFollowsTheDevices() {
    qunsetenv("TRAINDECK_BF16_EMULATION");
    const Capability cpu = precisionCapability(PrecisionPolicy::MixedBfloat16);
    QCOMPARE(precisionCapability(PrecisionPolicy::MixedBfloat16, {}).available, cpu.available);
    QCOMPARE(precisionCapability(PrecisionPolicy::MixedBfloat16, {"cpu:0"}).available,
             cpu.available);
    QCOMPARE(precisionCapability(PrecisionPolicy::MixedBfloat16, {"cpu:0", "cuda:0"}).available,
             cpu.available);
    QVERIFY(precisionCapability(PrecisionPolicy::Float32, {"cuda:0"}).available);
    bool gpu = false;
    for (const DeviceInfo& d : listDevices()) gpu = gpu || d.kind == "cuda";
    if (gpu) {
        QSKIP("a GPU is here: the no-GPU half of this check needs a machine without one");
    }
    // No GPU: cuda:7 is not there, so precision leaves it to the strategy check.
    QVERIFY(precisionCapability(PrecisionPolicy::MixedBfloat16, {"cuda:7"}).available);
    Project p = synthetic();
    p.precision = PrecisionPolicy::MixedBfloat16;
    p.strategy.devices = {"cuda:7"};
    p.training.epochs = 1;
    auto s = Session::create(p, SessionOptions{});
    QVERIFY(!s.ok());
    QVERIFY2(QString::fromStdString(s.error()).contains("cuda:7"), s.error().c_str());
    QVERIFY2(!QString::fromStdString(s.error()).contains("AMX"), s.error().c_str());
}

// Mixed precision trains the synthetic project as float32 does (within a point of test accuracy);
// mixed_float16 reports its loss scale with every logged step and logs what it converts.
void TestTraining::mixedPrecisionTrains() {
    qputenv("TRAINDECK_BF16_EMULATION", "1");  // this machine's CPU may lack bf16 instructions
    std::map<PrecisionPolicy, double> acc;
    for (PrecisionPolicy pp : {PrecisionPolicy::Float32, PrecisionPolicy::MixedBfloat16,
                               PrecisionPolicy::MixedFloat16}) {
        Project p = synthetic();
        p.precision = pp;
        QTemporaryDir dir;
        SessionOptions o;
        o.storePath = dir.filePath("runs.db").toStdString();
        o.runName = "mixed";
        auto s = Session::create(p, o);
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        Recorded r = runToEnd(**s);
        auto fin = r.all<RunFinished>();
        QCOMPARE(fin.size(), size_t(1));
        QCOMPARE(fin[0].status, RunStatus::Completed);
        acc[pp] = fin[0].finalMetrics.at("test_accuracy");
        const auto steps = r.all<StepMetrics>();
        QVERIFY(!steps.empty());
        if (pp == PrecisionPolicy::MixedFloat16) {
            for (const StepMetrics& sm : steps) QVERIFY(sm.lossScale >= 1.0);
            QCOMPARE(steps.front().lossScale, 32768.0);
            // The store keeps the scale and the skipped steps with every logged step.
            auto store = RunStore::open(o.storePath);
            QVERIFY(store.ok());
            auto run = (*store)->findRun("mixed");
            QVERIFY(run.ok());
            auto rows = (*store)->steps(run->id);
            QVERIFY(rows.ok() && rows->size() == steps.size());
            for (const auto& row : *rows) {
                QCOMPARE(row.metrics.at("loss_scale"), 32768.0);
                QCOMPARE(row.metrics.at("skipped_steps"), 0.0);
            }
            bool noted = false;
            for (const LogLine& l : r.all<LogLine>())
                noted = noted || l.text.find("mixed_float16: ") != std::string::npos;
            QVERIFY(noted);
        } else {
            for (const StepMetrics& sm : steps) QCOMPARE(sm.lossScale, 0.0);
        }
    }
    qunsetenv("TRAINDECK_BF16_EMULATION");
    QVERIFY2(std::fabs(acc[PrecisionPolicy::MixedBfloat16] - acc[PrecisionPolicy::Float32]) < 0.01,
             qPrintable(QString::number(acc[PrecisionPolicy::MixedBfloat16])));
    QVERIFY2(std::fabs(acc[PrecisionPolicy::MixedFloat16] - acc[PrecisionPolicy::Float32]) < 0.01,
             qPrintable(QString::number(acc[PrecisionPolicy::MixedFloat16])));
}

void TestTraining::eventsAndStore() {
    QTemporaryDir dir;
    const std::string db = dir.filePath("runs.db").toStdString();
    SessionOptions o;
    o.storePath = db;
    o.runName = "blobs-run";
    o.epochs = 2;
    auto s = Session::create(synthetic(), o);
    QVERIFY(s.ok());
    Recorded r = runToEnd(**s);
    QVERIFY(std::holds_alternative<RunStarted>(r.events.front()));
    QVERIFY(std::holds_alternative<RunFinished>(r.events.back()));
    const auto steps = r.all<StepMetrics>();
    QVERIFY(!steps.empty());
    for (const auto& sm : steps) {
        QVERIFY(sm.samplesPerSecond > 0);
        QVERIFY(sm.inputWaitSeconds >= 0 && sm.computeSeconds > 0);
        QCOMPARE(sm.replicas.size(), size_t(1));
        QVERIFY(sm.learningRate > 0);
    }
    const auto stats = r.all<DeviceStats>();
    QVERIFY(!stats.empty());
    // Parameters, gradients and SGD momentum slots: at least 3 x 676 floats.
    QVERIFY(stats.back().memoryBytes >= 3 * 676 * 4);
    QCOMPARE(stats.back().device, std::string("cpu:0"));
    auto store = RunStore::open(db);
    QVERIFY(store.ok());
    auto run = (*store)->findRun("blobs-run");
    QVERIFY2(run.ok(), run.ok() ? "" : run.error().c_str());
    QCOMPARE(run->status, std::string("completed"));
    QCOMPARE(run->params, int64_t(16 * 32 + 32 + 32 * 4 + 4));
    auto ep = (*store)->epochs(run->id);
    QVERIFY(ep.ok());
    QCOMPARE(ep->size(), size_t(2));
    auto st = (*store)->steps(run->id);
    QVERIFY(st.ok() && !st->empty());
    QVERIFY(run->finalMetricsJson.find("test_accuracy") != std::string::npos);
}

// Without --run-name, each stored run is its project's run number N, in the store and in the
// RunStarted event; a name longer than allowed is cut at a code point.
void TestTraining::storedRunsGetDistinctDefaultNames() {
    QTemporaryDir dir;
    const std::string db = dir.filePath("names.db").toStdString();
    std::vector<std::string> names;
    for (int i = 0; i < 2; ++i) {
        SessionOptions o;
        o.storePath = db;
        o.epochs = 1;
        auto s = Session::create(synthetic(), o);
        QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
        Recorded r = runToEnd(**s);
        const auto started = r.all<RunStarted>();
        QCOMPARE(started.size(), size_t(1));
        QCOMPARE(started[0].runName, synthetic().name + " #" + std::to_string((*s)->runId()));
        names.push_back(started[0].runName);
    }
    QVERIFY(names[0] != names[1]);
    auto store = RunStore::open(db);
    QVERIFY(store.ok());
    for (const std::string& n : names) {
        auto run = (*store)->findRun(n);
        QVERIFY2(run.ok(), run.ok() ? "" : run.error().c_str());
    }
    const std::string longName(kMaxNameChars - 2, 'x');
    const std::string cut = defaultRunName(longName + "\xc3\xa9", 12345);
    QVERIFY(textProblem(cut, TextKind::Name).empty());
    QVERIFY(cut.ends_with(" #12345"));
    QCOMPARE(defaultRunName("", 3), std::string("run #3"));
}

void TestTraining::sameSeedSameLosses() {
    std::vector<double> a, b;
    for (auto* out : {&a, &b}) {
        auto s = Session::create(synthetic(1024, 2), {});
        QVERIFY(s.ok());
        for (const auto& e : runToEnd(**s).all<EpochMetrics>())
            out->push_back(e.metrics.at("loss"));
    }
    QCOMPARE(a, b);
    SessionOptions o;
    o.seed = 99;
    auto s = Session::create(synthetic(1024, 2), o);
    QVERIFY(s.ok());
    auto c = runToEnd(**s).all<EpochMetrics>();
    QVERIFY(c[0].metrics.at("loss") != a[0]);
}

void TestTraining::remainderAndDropRemainder() {
    for (bool drop : {false, true}) {
        Project p = synthetic(100, 1);
        p.training.batchSize = 32;
        p.data.pipeline.dropRemainder = drop;
        p.training.logEverySteps = 1;
        auto s = Session::create(p, {});
        QVERIFY(s.ok());
        Recorded r = runToEnd(**s);
        auto steps = r.all<StepMetrics>();
        QCOMPARE(steps.size(), size_t(drop ? 3 : 4));
        QCOMPARE(r.all<RunFinished>().at(0).status, RunStatus::Completed);
        QVERIFY(std::isfinite(steps.back().metrics.at("loss")));
    }
}

void TestTraining::stopMidRun() {
    QTemporaryDir dir;
    SessionOptions o;
    o.storePath = dir.filePath("runs.db").toStdString();
    o.epochs = 50;
    Project p = synthetic(4096, 50);
    p.training.logEverySteps = 1;
    auto s = Session::create(p, o);
    QVERIFY(s.ok());
    auto q = (*s)->events().subscribe();
    (*s)->start();
    int steps = 0;
    std::optional<RunFinished> fin;
    while (auto e = q->pop(std::chrono::milliseconds(10000))) {
        if (std::holds_alternative<StepMetrics>(*e) && ++steps == 3) (*s)->requestStop();
        if (auto* f = std::get_if<RunFinished>(&*e)) fin = *f;
    }
    (*s)->join();
    QVERIFY(fin.has_value());
    QCOMPARE(fin->status, RunStatus::Stopped);
    auto store = RunStore::open(o.storePath);
    auto run = (*store)->getRun((*s)->runId());
    QVERIFY(run.ok());
    QCOMPARE(run->status, std::string("stopped"));
}

void TestTraining::pauseAndResume() {
    Project p = synthetic(4096, 3);
    p.training.logEverySteps = 1;
    auto s = Session::create(p, {});
    QVERIFY(s.ok());
    auto q = (*s)->events().subscribe();
    (*s)->pause();
    (*s)->start();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    // Paused before the first step: no step metrics yet.
    for (const auto& e : q->drain()) QVERIFY(!std::holds_alternative<StepMetrics>(e));
    QVERIFY((*s)->paused());
    (*s)->resume();
    (*s)->join();
    bool finished = false;
    for (const auto& e : q->drain())
        if (auto* f = std::get_if<RunFinished>(&e)) finished = f->status == RunStatus::Completed;
    QVERIFY(finished);
}

void TestTraining::validationSplitAndEarlyStopping() {
    Project p = synthetic(2048, 40);
    p.data.validationSplit = 0.25;
    CallbackConfig es;
    es.type = "early_stopping";
    es.monitor = "val_loss";
    es.patience = 1;
    es.minDelta = 0.5;  // nothing improves by 0.5: stops after patience epochs
    p.training.callbacks = {es};
    auto s = Session::create(p, {});
    QVERIFY(s.ok());
    Recorded r = runToEnd(**s);
    auto started = r.all<RunStarted>().at(0);
    QCOMPARE(started.validationSamples, int64_t(512));
    QCOMPARE(started.trainSamples, int64_t(1536));
    auto epochs = r.all<EpochMetrics>();
    QVERIFY(epochs.at(0).metrics.count("val_loss"));
    QVERIFY(epochs.at(0).metrics.count("val_accuracy"));
    QVERIFY2(epochs.size() < 5, qPrintable(QString::number(epochs.size())));
    auto fin = r.all<RunFinished>().at(0);
    QCOMPARE(fin.status, RunStatus::Stopped);
}

void TestTraining::validationOnTestSplit() {
    Project p = synthetic(1024, 2);
    p.data.validationData = "test";
    auto s = Session::create(p, {});
    QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
    Recorded r = runToEnd(**s);
    QCOMPARE(r.all<RunStarted>().at(0).validationSamples, int64_t(512));
    QCOMPARE(r.all<RunStarted>().at(0).trainSamples, int64_t(1024));
    auto epochs = r.all<EpochMetrics>();
    QCOMPARE(epochs.size(), size_t(2));
    // The validation metrics of the last epoch are the test metrics of the final weights.
    auto fin = r.all<RunFinished>().at(0);
    QVERIFY(std::fabs(epochs.back().metrics.at("val_loss") - fin.finalMetrics.at("test_loss")) <
            1e-9);
    // Through the project file: bad values and the combination with validation_split are refused.
    std::string text = projectToJson(p);
    auto bad = parseProject(std::regex_replace(text, std::regex("\"validation_data\": \"test\""),
                                               "\"validation_data\": \"train\""),
                            "p.json");
    QVERIFY(!bad.ok());
    QVERIFY2(QString::fromStdString(bad.error()).contains("data.validation_data"),
             bad.error().c_str());
    p.data.validationSplit = 0.2;
    auto both = parseProject(projectToJson(p), "p.json");
    QVERIFY(!both.ok());
    QVERIFY(QString::fromStdString(both.error()).contains("cannot be combined"));
}

void TestTraining::predictGivesProbabilities() {
    auto s = Session::create(synthetic(512, 1), {});
    QVERIFY(s.ok());
    QVERIFY((*s)->fit().ok());
    Tensor x(DType::F32, {70, 16});
    for (int64_t i = 0; i < x.size(); ++i) x.data<float>()[i] = float(i % 7) * 0.1f;
    auto p = (*s)->predict(x);
    QVERIFY2(p.ok(), p.ok() ? "" : p.error().c_str());
    QCOMPARE(p->shape(), (Shape{70, 4}));
    for (int r = 0; r < 70; ++r) {
        double sum = 0;
        for (int c = 0; c < 4; ++c) sum += p->data<float>()[r * 4 + c];
        QVERIFY(std::fabs(sum - 1) < 1e-5);
    }
    Tensor bad(DType::F32, {3, 5});
    QVERIFY(!(*s)->predict(bad).ok());
    auto ev = (*s)->evaluateTest();
    QVERIFY(ev.ok());
    QCOMPARE(ev->samples, int64_t(512));
}

void TestTraining::csvProjectTrains() {
    Project p = loadExample("csv_iris_like.json");
    auto s = Session::create(p, {});
    QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
    Recorded r = runToEnd(**s);
    auto fin = r.all<RunFinished>().at(0);
    QCOMPARE(fin.status, RunStatus::Completed);
    QVERIFY2(fin.finalMetrics.at("test_accuracy") > 0.8,
             qPrintable(QString::number(fin.finalMetrics.at("test_accuracy"))));
}

void TestTraining::fashionMnistShortRun() {
    if (!std::filesystem::exists(api::fashionMnistDirectory() + "/train-images-idx3-ubyte.gz"))
        QSKIP("dataset-fashion-mnist is not installed");
    Project p = loadExample("fashion_mnist_mlp.json");
    p.training.epochs = 1;
    p.training.batchSize = 64;
    auto s = Session::create(p, {});
    QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
    Recorded r = runToEnd(**s);
    auto fin = r.all<RunFinished>().at(0);
    QCOMPARE(fin.status, RunStatus::Completed);
    // One epoch of the guide's MLP reaches about 0.82 test accuracy in Keras.
    QVERIFY2(fin.finalMetrics.at("test_accuracy") > 0.80,
             qPrintable(QString::number(fin.finalMetrics.at("test_accuracy"))));
    QVERIFY(fin.finalMetrics.at("test_loss") < 0.55);
}

// A small CNN with every image and normalization layer on the synthetic blobs seen as 4x4
// images: the loss falls and the test accuracy is far above chance (0.25), in seconds; also
// under mixed precision, where these layers compute in f32 and the Dense layer in 16 bits.
void TestTraining::cnnTrainsOnImages_data() {
    QTest::addColumn<int>("precision");
    QTest::newRow("float32") << int(PrecisionPolicy::Float32);
    QTest::newRow("mixed_bfloat16") << int(PrecisionPolicy::MixedBfloat16);
    QTest::newRow("mixed_float16") << int(PrecisionPolicy::MixedFloat16);
}

void TestTraining::cnnTrainsOnImages() {
    QFETCH(int, precision);
    qputenv("TRAINDECK_BF16_EMULATION", "1");  // this machine's CPU may lack bf16 instructions
    Project p = synthetic(2048, 4);
    p.precision = static_cast<PrecisionPolicy>(precision);
    auto model = modelFromKerasJson(R"({"class_name": "Sequential", "config": {"layers": [
        {"class_name": "InputLayer", "config": {"batch_shape": [null, 16]}},
        {"class_name": "Reshape", "config": {"target_shape": [4, 4, 1]}},
        {"class_name": "Rescaling", "config": {"scale": 0.5, "offset": 0.1}},
        {"class_name": "ZeroPadding2D", "config": {"padding": 1}},
        {"class_name": "Conv2D", "config": {"filters": 16, "kernel_size": 3, "activation": "relu"}},
        {"class_name": "BatchNormalization", "config": {}},
        {"class_name": "Conv2D", "config": {"filters": 16, "kernel_size": 3, "padding": "same",
                                            "groups": 2}},
        {"class_name": "MaxPooling2D", "config": {"pool_size": 2}},
        {"class_name": "AveragePooling2D", "config": {"pool_size": 2, "strides": 1,
                                                      "padding": "same"}},
        {"class_name": "LayerNormalization", "config": {}},
        {"class_name": "GlobalAveragePooling2D", "config": {}},
        {"class_name": "Dense", "config": {"units": 4, "activation": "softmax"}}]}})");
    QVERIFY2(model.ok(), model.ok() ? "" : model.error().c_str());
    p.model = *model;
    auto s = Session::create(p, {});
    QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
    Recorded r = runToEnd(**s);
    auto fin = r.all<RunFinished>();
    QCOMPARE(fin.size(), size_t(1));
    QCOMPARE(fin[0].status, RunStatus::Completed);
    auto epochs = r.all<EpochMetrics>();
    QCOMPARE(epochs.size(), size_t(4));
    QVERIFY2(epochs.back().metrics.at("loss") < 0.8 * epochs.front().metrics.at("loss"),
             qPrintable(QString("%1 -> %2")
                            .arg(epochs.front().metrics.at("loss"))
                            .arg(epochs.back().metrics.at("loss"))));
    QVERIFY2(fin[0].finalMetrics.at("test_accuracy") > 0.7,
             qPrintable(QString::number(fin[0].finalMetrics.at("test_accuracy"))));
    qunsetenv("TRAINDECK_BF16_EMULATION");
}

void TestTraining::badProjects_data() {
    QTest::addColumn<QString>("what");
    QTest::addColumn<QString>("expected");
    QTest::newRow("input shape") << "input"
                                 << "does not match the data's samples";
    QTest::newRow("too few units") << "units"
                                   << "classes but the last layer has 3 units";
    QTest::newRow("missing file") << "file"
                                  << "no_such_images.gz";
    QTest::newRow("unknown pass") << "pass"
                                  << "disabled_passes[1]: unknown pass 'fuse_everything'";
    QTest::newRow("memory pass") << "memory"
                                 << "disabled_passes[0]: pass 'memory' cannot be turned off";
    QTest::newRow("one_hot with sparse loss") << "onehot"
                                              << "expects integer class labels";
    QTest::newRow("batch size") << "batch"
                                << "training.batch_size";
}

void TestTraining::badProjects() {
    QFETCH(QString, what);
    QFETCH(QString, expected);
    Project p = synthetic(256, 1);
    if (what == "input") p.data.source.sampleShape = {12};
    if (what == "units") p.model.layers.back().units = 3;
    if (what == "file") {
        p.data.source.type = "idx";
        p.data.source.trainImages = "/nonexistent/no_such_images.gz";
        p.data.source.trainLabels = "/nonexistent/no_such_labels.gz";
    }
    if (what == "pass") p.disabledPasses = {"dce", "fuse_everything"};
    if (what == "memory") p.disabledPasses = {"memory"};
    if (what == "onehot") p.data.pipeline.map.push_back(MapStep{.op = "one_hot", .depth = 4});
    if (what == "batch") p.training.batchSize = 0;
    auto s = Session::create(p, {});
    std::string error;
    if (s.ok()) {
        Status st = (*s)->fit();  // some data problems only show with the first batch
        QVERIFY(!st.ok());
        error = st.error();
    } else {
        error = s.error();
    }
    QVERIFY2(QString::fromStdString(error).contains(expected), error.c_str());
}

// A store that cannot be opened: the run ends as failed with the reason, the queue closes (no
// subscriber waits forever) and nothing trains.
void TestTraining::storeCannotBeOpened_data() {
    QTest::addColumn<QString>("kind");
    QTest::addColumn<QString>("expected");
    QTest::newRow("not a database") << "garbage"
                                    << "file is not a database";
    QTest::newRow("a directory") << "directory"
                                 << "is a directory";
    QTest::newRow("parent is a file") << "under-file"
                                      << "cannot create directory";
}

void TestTraining::storeCannotBeOpened() {
    QFETCH(QString, kind);
    QFETCH(QString, expected);
    QTemporaryDir dir;
    std::string path = dir.filePath("runs.db").toStdString();
    if (kind == "garbage") {
        std::mt19937 rng(7);
        std::ofstream f(path, std::ios::binary);
        for (int i = 0; i < 65536; ++i) f.put(static_cast<char>(rng()));
    } else if (kind == "directory") {
        std::filesystem::create_directory(path);
    } else {
        std::ofstream(dir.filePath("plain").toStdString()) << "x";
        path = dir.filePath("plain/runs.db").toStdString();
    }
    SessionOptions o;
    o.storePath = path;
    auto s = Session::create(synthetic(512, 2), o);
    QVERIFY2(s.ok(), s.ok() ? "" : s.error().c_str());
    Watched w = watchToEnd(**s);
    QVERIFY2(w.closed, "the event queue was never closed: a subscriber would wait forever");
    auto fin = w.finished();
    QVERIFY(fin.has_value());
    QCOMPARE(fin->status, RunStatus::Failed);
    QVERIFY2(QString::fromStdString(fin->message).contains(QString::fromStdString(path)),
             fin->message.c_str());
    QVERIFY2(QString::fromStdString(fin->message).contains(expected), fin->message.c_str());
    QCOMPARE(fin->storeError, fin->message);
    QVERIFY(w.recorded.all<StepMetrics>().empty());
    QVERIFY(!(*s)->running());
    QVERIFY(!(*s)->fit().ok());  // the blocking form reports the same failure
}

// A store with no room for the run's record: nothing trains, the failure names the store.
void TestTraining::storeFullAtStart() {
    QTemporaryDir dir;
    const std::string path = dir.filePath("runs.db").toStdString();
    QVERIFY(RunStore::open(path).ok());  // schema in place; the run's row has no room
    ScopedEnv full("TRAINDECK_FAULT_STORE_PAGES", "0");
    SessionOptions o;
    o.storePath = path;
    auto s = Session::create(synthetic(512, 2), o);
    QVERIFY(s.ok());
    Watched w = watchToEnd(**s);
    QVERIFY(w.closed);
    auto fin = w.finished();
    QVERIFY(fin.has_value());
    QCOMPARE(fin->status, RunStatus::Failed);
    QVERIFY2(QString::fromStdString(fin->message).contains("database or disk is full"),
             fin->message.c_str());
    QVERIFY(!fin->storeError.empty());
    QVERIFY(w.recorded.all<StepMetrics>().empty());
}

// The disk fills during the run: the trainer stops at once with a failure naming the store, the
// run is stored as failed, and every batch committed before the failure reads back intact.
void TestTraining::storeFullMidRun() {
    QTemporaryDir dir;
    const std::string path = dir.filePath("runs.db").toStdString();
    Project p = synthetic(4096, 30);
    p.training.batchSize = 32;
    p.training.logEverySteps = 1;
    SessionOptions o;
    o.storePath = path;
    o.runName = "filled-up";
    auto s = Session::create(p, o);
    QVERIFY(s.ok());
    Watched w;
    {
        ScopedEnv full("TRAINDECK_FAULT_STORE_PAGES", "12");
        w = watchToEnd(**s);
    }
    QVERIFY(w.closed);
    auto fin = w.finished();
    QVERIFY(fin.has_value());
    QCOMPARE(fin->status, RunStatus::Failed);
    const QString message = QString::fromStdString(fin->message);
    QVERIFY2(message.contains("database or disk is full"), qPrintable(message));
    QVERIFY2(message.contains(QString::fromStdString(path)), qPrintable(message));
    QVERIFY(!fin->storeError.empty());
    // It stopped instead of training 30 epochs with nothing stored.
    QVERIFY2(w.recorded.all<EpochMetrics>().size() < 30,
             qPrintable(QString::number(w.recorded.all<EpochMetrics>().size())));
    // The error is in the run's log too.
    bool logged = false;
    for (const auto& l : w.recorded.all<LogLine>())
        logged = logged || (l.level == LogLine::Level::Error &&
                            l.text.find("database or disk is full") != std::string::npos);
    QVERIFY(logged);

    auto store = RunStore::open(path);
    QVERIFY2(store.ok(), store.ok() ? "" : store.error().c_str());
    auto run = (*store)->findRun("filled-up");
    QVERIFY(run.ok());
    QCOMPARE(run->status, std::string("failed"));
    auto steps = (*store)->steps(run->id);
    QVERIFY2(steps.ok(), steps.ok() ? "" : steps.error().c_str());
    QVERIFY(!steps->empty());
    // Whole batches only: steps 1..n, each with every metric.
    for (size_t i = 0; i < steps->size(); ++i) {
        QCOMPARE((*steps)[i].globalStep, int64_t(i + 1));
        QVERIFY((*steps)[i].metrics.count("loss") && (*steps)[i].metrics.count("samples_per_s"));
    }
    // A later run on the same store (with room again) works.
    auto again = Session::create(synthetic(512, 1), o);
    QVERIFY(again.ok());
    QVERIFY((*again)->fit().ok());
}

void TestTraining::callbackThrows() {
    QTemporaryDir dir;
    SessionOptions o;
    o.storePath = dir.filePath("runs.db").toStdString();
    o.callbacks.push_back(std::make_shared<ThrowingCallback>(5));
    auto s = Session::create(synthetic(2048, 3), o);
    QVERIFY(s.ok());
    Watched w = watchToEnd(**s);
    QVERIFY(w.closed);
    auto fin = w.finished();
    QVERIFY(fin.has_value());
    QCOMPARE(fin->status, RunStatus::Failed);
    QVERIFY2(fin->message.find("metric server unreachable") != std::string::npos,
             fin->message.c_str());
    QVERIFY2(fin->message.find("on_batch_end") != std::string::npos, fin->message.c_str());
    QVERIFY(fin->storeError.empty());
    auto store = RunStore::open(o.storePath);
    QVERIFY(store.ok());
    auto run = (*store)->getRun((*s)->runId());
    QVERIFY(run.ok());
    QCOMPARE(run->status, std::string("failed"));
    QVERIFY(run->message.find("metric server unreachable") != std::string::npos);
}

// The input pipeline fails part-way through an epoch (its file cache hits the file size limit):
// the run fails with the pipeline's error instead of waiting for a batch that never comes.
void TestTraining::dataFailsMidEpoch() {
    QTemporaryDir dir;
    const std::string cache = dir.filePath("blobs.cache").toStdString();
    Project p = synthetic(4096, 2);  // 4096 x 16 floats: 256 KiB of features to cache
    p.data.pipeline.cache = "file:" + cache;
    auto s = Session::create(p, {});
    QVERIFY(s.ok());
    rlimit saved{};
    QVERIFY(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
    auto* oldHandler = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of a signal
    rlimit small = saved;
    small.rlim_cur = 96 * 1024;
    QVERIFY(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    Watched w = watchToEnd(**s);
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, oldHandler);
    QVERIFY(w.closed);
    auto fin = w.finished();
    QVERIFY(fin.has_value());
    QCOMPARE(fin->status, RunStatus::Failed);
    QVERIFY2(fin->message.find(cache) != std::string::npos, fin->message.c_str());
    QVERIFY(w.recorded.all<EpochMetrics>().empty());  // it failed inside the first epoch
}

// Paused time counts in neither the epoch's seconds nor its samples/s.
void TestTraining::pausedTimeIsNotEpochTime() {
    Project p = synthetic(2048, 1);
    auto s = Session::create(p, {});
    QVERIFY(s.ok());
    auto q = (*s)->events().subscribe();
    (*s)->pause();
    (*s)->start();
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    (*s)->resume();
    (*s)->join();
    std::vector<EpochMetrics> epochs;
    for (const auto& e : q->drain())
        if (auto* em = std::get_if<EpochMetrics>(&e)) epochs.push_back(*em);
    QCOMPARE(epochs.size(), size_t(1));
    // 32 steps of a 676-parameter MLP take milliseconds; the pause took 1.5 s.
    QVERIFY2(epochs[0].seconds < 0.75, qPrintable(QString::number(epochs[0].seconds)));
    QVERIFY2(epochs[0].samplesPerSecond > 2048 / 0.75,
             qPrintable(QString::number(epochs[0].samplesPerSecond)));
}

void TestTraining::validationSplitLeavesNoRows_data() {
    QTest::addColumn<qint64>("samples");
    QTest::addColumn<double>("split");
    QTest::addColumn<QString>("expected");
    QTest::newRow("no validation rows") << qint64(2048) << 1e-18 << "0 for validation";
    QTest::newRow("no training rows") << qint64(10) << 0.95 << "0 for training";
}

void TestTraining::validationSplitLeavesNoRows() {
    QFETCH(qint64, samples);
    QFETCH(double, split);
    QFETCH(QString, expected);
    Project p = synthetic(samples, 1);
    p.data.validationSplit = split;
    auto s = Session::create(p, {});
    QVERIFY(!s.ok());
    const QString e = QString::fromStdString(s.error());
    QVERIFY2(e.contains("data.validation_split"), qPrintable(e));
    QVERIFY2(e.contains(QString::number(samples) + " training samples"), qPrintable(e));
    QVERIFY2(e.contains(expected), qPrintable(e));
    QVERIFY2(e.contains("expected at least one sample on each side"), qPrintable(e));
}

QTEST_GUILESS_MAIN(TestTraining)
// Session::create compiles the training program, which opens an OpenMP team (the CPU device
// sets each team member's floating-point modes). It must not leave that team's worker behind on
// the calling thread, which lives on while another thread trains: libgomp, counting more of its
// threads than cores, would stop spinning between parallel regions and every region of every
// step would wait for a woken worker. A thread takes the name of the thread that creates it, so
// the threads still named as the caller once Session::create has returned are the caller and
// whatever it left behind (the device's own helpers name themselves td-share-N).
void TestTraining::createLeavesNoOpenMPWorkers() {
    const std::string name = "td-test-caller";
    auto named = [&] {
        int n = 0;
        for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
            std::ifstream comm(e.path() / "comm");
            std::string line;
            std::getline(comm, line);
            n += line == name;
        }
        return n;
    };
    std::string error;
    int during = 0, after = 0;
    std::thread caller([&] {
        pthread_setname_np(pthread_self(), name.c_str());
        auto s = Session::create(synthetic(), {});
        if (!s.ok()) {
            error = s.error();
            return;
        }
        // A thread that has ended takes a moment to leave /proc.
        for (int i = 0; i < 200 && (after = named()) > 1; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        // The check can fail: a team opened here, on the caller (as Session::create did before
        // it compiled on a passing thread), stays with it.
        td::prepareThreadFor(*td::makeCpuDevice(2), 2);
        during = named();
    });
    caller.join();
    QVERIFY2(error.empty(), error.c_str());
    QCOMPARE(after, 1);
    QCOMPARE(during, 2);
}

// Every CPU device pass turned off in turn (the project's disabled_passes) trains to the losses of
// the default, to float rounding: an MLP with dropout and Adam at batch 32 with the step on one
// thread of two (a forward product along K, products that skip the zeros after ReLU, narrow
// kernels), the same on a device of one thread (the pieces in turn), and a wider one
// at batch 256 on the OpenMP team (weight gradients in pieces). Where the machine has two
// threads and the zero-skipping kernels, the compile report shows that each pass applies in one
// of the two-thread rows (cpu_solo_pieces in the one-thread row, which it cannot see).
void TestTraining::cpuPassesOffKeepTheLosses_data() {
    QTest::addColumn<int>("units");
    QTest::addColumn<int>("batch");
    QTest::addColumn<int>("steps");
    QTest::addColumn<int>("deviceThreads");  // 0: the machine's
    QTest::newRow("batch 32, one thread of two") << 512 << 32 << 12 << 0;
    QTest::newRow("batch 32, a device of one thread") << 512 << 32 << 12 << 1;
    QTest::newRow("batch 256, the OpenMP team") << 1024 << 256 << 4 << 0;
}

void TestTraining::cpuPassesOffKeepTheLosses() {
    QFETCH(int, units);
    QFETCH(int, batch);
    QFETCH(int, steps);
    QFETCH(int, deviceThreads);
    auto losses = [&](const std::vector<std::string>& off) {
        Project p = dropoutMlp(units, batch, steps);
        p.disabledPasses = off;
        SessionOptions o;
        if (deviceThreads > 0)
            o.openDevice = [deviceThreads](const std::string&,
                                           int) -> Result<std::unique_ptr<Device>> {
                return makeCpuDevice(deviceThreads);
            };
        return stepLosses(p, o);
    };
    const std::vector<double> reference = losses({});
    QCOMPARE(reference.size(), size_t(steps + 1));
    double worstOverall = 0;
    for (const std::string& pass : cpuPassNames()) {
        const std::vector<double> off = losses({pass});
        if (QTest::currentTestFailed()) return;
        QCOMPARE(off.size(), reference.size());
        double worst = 0;
        for (size_t i = 0; i < off.size(); ++i)
            worst = std::max(worst, std::fabs(off[i] - reference[i]) / std::fabs(reference[i]));
        QVERIFY2(worst < 1e-4, qPrintable(QString("%1 off: relative difference %2")
                                              .arg(QString::fromStdString(pass))
                                              .arg(worst)));
        worstOverall = std::max(worstOverall, worst);
    }
    qInfo("worst relative difference of a loss: %g", worstOverall);
    if (deviceThreads == 1 || makeCpuDevice(0)->desc().threads < 2) return;
    // Where each pass applies (the report compiles the step on cpu:0 as these runs did). The
    // names reach the device: cpu_split_k off adds the partial sums in another order (other
    // bits, within the tolerance above).
    auto appliedIn = [](int u, int b, std::map<std::string, int64_t>& applied) {
        auto report = api::compileReport(dropoutMlp(u, b, 4));
        QVERIFY2(report.ok(), report.ok() ? "" : report.error().c_str());
        QCOMPARE(report->cpuPasses.size(), cpuPassNames().size());
        for (const auto& d : report->cpuPasses) {
            QVERIFY(!d.disabled);
            applied[d.name] += d.applied;
        }
    };
    std::map<std::string, int64_t> here, both;
    appliedIn(units, batch, here);
    if (QTest::currentTestFailed()) return;
    if (here["cpu_split_k"] > 0) QVERIFY(worstOverall > 0);
    if (batch != 256) return;
    appliedIn(512, 32, both);
    appliedIn(units, batch, both);
    if (QTest::currentTestFailed()) return;
    if (both["cpu_skip_zeros"] == 0) {
        qInfo(
            "no zero-skipping kernels on this CPU (AVX2 with FMA or AVX-512): not every pass "
            "applies");
        return;
    }
    // cpu_share_norm_sums needs a BatchNormalization: cnnPassesOffKeepTheBits shows it applies.
    for (const std::string& pass : cpuPassNames())
        if (pass != "cpu_solo_pieces" && pass != "cpu_share_norm_sums")
            QVERIFY2(both[pass] > 0, (pass + " applies in neither row").c_str());
}

// A CNN of the shipped projects' kind on synthetic 14x14x8 images, batch 64: Conv2D 16 ReLU ->
// BatchNormalization -> MaxPooling2D -> Conv2D 32 ReLU -> MaxPooling2D -> Flatten -> Dense 4
// softmax, Adam, `steps` steps, every step logged.
Project bnCnn(const std::string& precision, int steps) {
    Project p = synthetic(int64_t{64} * steps, 1);
    p.data.source.sampleShape = {14, 14, 8};
    p.data.source.testSamples = 128;
    p.training.batchSize = 64;
    p.training.logEverySteps = 1;
    p.training.optimizer = OptimizerConfig{};
    p.training.callbacks.clear();
    p.precision =
        precision == "mixed_bfloat16" ? PrecisionPolicy::MixedBfloat16 : PrecisionPolicy::Float32;
    auto model = modelFromKerasJson(R"({"class_name": "Sequential", "config": {"layers": [
        {"class_name": "InputLayer", "config": {"batch_shape": [null, 14, 14, 8]}},
        {"class_name": "Conv2D", "config": {"filters": 16, "kernel_size": [3, 3], "activation": "relu"}},
        {"class_name": "BatchNormalization", "config": {}},
        {"class_name": "MaxPooling2D", "config": {"pool_size": [2, 2]}},
        {"class_name": "Conv2D", "config": {"filters": 32, "kernel_size": [3, 3], "activation": "relu"}},
        {"class_name": "MaxPooling2D", "config": {"pool_size": [2, 2]}},
        {"class_name": "Flatten", "config": {}},
        {"class_name": "Dense", "config": {"units": 4, "activation": "softmax"}}]}})");
    if (!model.ok()) qFatal("%s", model.error().c_str());
    p.model = *model;
    return p;
}

// The passes that join a CNN's backward passes over its images change no bit: with
// fuse_act_bias_grad off (each ReLU gradient, its bias gradient and, under mixed_bfloat16, the
// cast for a bf16 convolution as separate passes) or cpu_share_norm_sums off (BatchNormalization's
// gamma and beta gradients read dy again), every step's loss and the test loss equal the default
// exactly. The first ReLU gradient (64x12x12x16 values) runs in pieces on the team, the second
// (64x4x4x32) in block mode on one thread; the report shows where each pass applied.
void TestTraining::cnnPassesOffKeepTheBits_data() {
    QTest::addColumn<QString>("precision");
    QTest::newRow("float32") << "float32";
    QTest::newRow("mixed_bfloat16") << "mixed_bfloat16";
}

void TestTraining::cnnPassesOffKeepTheBits() {
    QFETCH(QString, precision);
    const int steps = 6;
    auto losses = [&](const std::vector<std::string>& off) {
        Project p = bnCnn(precision.toStdString(), steps);
        p.disabledPasses = off;
        return stepLosses(p, {});
    };
    const std::vector<double> reference = losses({});
    QCOMPARE(reference.size(), size_t(steps + 1));
    for (const std::string pass : {"fuse_act_bias_grad", "cpu_share_norm_sums"}) {
        const std::vector<double> off = losses({pass});
        if (QTest::currentTestFailed()) return;
        QCOMPARE(off.size(), reference.size());
        for (size_t i = 0; i < off.size(); ++i)
            QVERIFY2(std::memcmp(&off[i], &reference[i], sizeof(double)) == 0,
                     qPrintable(QString("%1 off, loss %2: %3 against %4")
                                    .arg(QString::fromStdString(pass))
                                    .arg(i)
                                    .arg(off[i], 0, 'g', 17)
                                    .arg(reference[i], 0, 'g', 17)));
    }
    auto report = api::compileReport(bnCnn(precision.toStdString(), steps));
    QVERIFY2(report.ok(), report.ok() ? "" : report.error().c_str());
    int overImages = 0, castsWritten = 0;
    for (const std::string& g : report->groups) {
        overImages += g.find("one pass over the image's positions") != std::string::npos;
        castsWritten += g.find("written by act_grad with its bias gradient") != std::string::npos;
    }
    QCOMPARE(overImages, 2);
    // Under mixed_bfloat16, both convolutions (8 x 3 x 3 and 16 x 3 x 3 terms a sum) run in bf16
    // where the CPU has bf16 convolutions: the casts of their gradients are written by the ReLU
    // gradients.
    const bool halfConv = precision == "mixed_bfloat16" && cpuHalfConvolutions(DType::BF16);
    QCOMPARE(castsWritten, halfConv ? 2 : 0);
    int64_t shared = -1;
    for (const auto& d : report->cpuPasses)
        if (d.name == "cpu_share_norm_sums") shared = d.applied;
    QCOMPARE(shared, int64_t{2});  // gamma and beta
}

// The CPU passes' names are pass names like the compiler's: an unknown one is refused by its
// field path, naming it and listing the known ones, the CPU's among them.
void TestTraining::cpuPassNamesAreChecked() {
    Project p = synthetic(256, 1);
    p.disabledPasses = {"cpu_narrow_kernel", "cpu_no_such_pass"};
    auto s = Session::create(p, {});
    QVERIFY(!s.ok());
    QVERIFY2(
        s.error().find("disabled_passes[1]: unknown pass 'cpu_no_such_pass'") != std::string::npos,
        s.error().c_str());
    QVERIFY2(s.error().find("cpu_split_k") != std::string::npos, s.error().c_str());
    auto report = api::compileReport(p);
    QVERIFY(!report.ok());
    QVERIFY2(report.error().find("unknown pass 'cpu_no_such_pass'") != std::string::npos,
             report.error().c_str());
    p.disabledPasses = {"cpu_narrow_kernel"};
    auto ok = Session::create(p, {});
    QVERIFY2(ok.ok(), ok.ok() ? "" : ok.error().c_str());
}

#include "test_training.moc"
