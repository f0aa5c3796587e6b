// Run store: schema and migrations, every RunStore method, crash recovery, bad files, and the
// RunRecorder writing a run (with its per-replica figures) from events while a second connection
// reads it live.
#include <sqlite3.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <QtTest/QtTest>
#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "engine/store/run_queries.h"
#include "engine/store/run_store.h"

using namespace td;

namespace {

// Raw access for checks the API does not offer (and to build databases the API would not).
struct RawDb {
    explicit RawDb(const std::string& path) {
        if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) qFatal("sqlite3_open failed");
    }
    ~RawDb() { sqlite3_close(db); }
    void exec(const std::string& sql) {
        char* msg = nullptr;
        if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &msg) != SQLITE_OK) {
            std::string m = msg ? msg : "?";
            sqlite3_free(msg);
            QFAIL(("sqlite3_exec: " + m + " in " + sql).c_str());
        }
    }
    int64_t queryInt(const std::string& sql) {
        sqlite3_stmt* s = nullptr;
        int64_t v = -1;
        if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) == SQLITE_OK &&
            sqlite3_step(s) == SQLITE_ROW)
            v = sqlite3_column_int64(s, 0);
        sqlite3_finalize(s);
        return v;
    }
    std::string queryText(const std::string& sql) {
        sqlite3_stmt* s = nullptr;
        std::string v;
        if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) == SQLITE_OK &&
            sqlite3_step(s) == SQLITE_ROW && sqlite3_column_text(s, 0))
            v = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
        sqlite3_finalize(s);
        return v;
    }
    sqlite3* db = nullptr;
};

std::string hostName() {
    char buf[256] = {};
    gethostname(buf, sizeof buf - 1);
    return buf;
}

// A pid that certainly belongs to no process: a child that has exited and been reaped.
int64_t deadPid() {
    pid_t child = fork();
    if (child == 0) _exit(0);
    int status = 0;
    waitpid(child, &status, 0);
    return child;
}

std::string readFile(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

RunRecord makeRun(const std::string& name, int64_t startedAtMs) {
    RunRecord r;
    r.name = name;
    r.projectJson = R"({"model":{"layers":[]}})";
    r.configJson = R"({"epochs":3})";
    r.startedAtMs = startedAtMs;
    r.devices = "cpu:0,cpu:1";
    r.modelName = "mlp";
    r.params = 101770;
    return r;
}

// The schema as version 1 shipped it, frozen here to test the upgrade from a real v1 file.
const char* kSchemaV1 = R"sql(
CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT NOT NULL, project_json TEXT NOT NULL DEFAULT '',
  config_json TEXT NOT NULL DEFAULT '{}', status TEXT NOT NULL DEFAULT 'running',
  started_at_ms INTEGER NOT NULL, ended_at_ms INTEGER NOT NULL DEFAULT 0,
  host TEXT NOT NULL DEFAULT '', pid INTEGER NOT NULL DEFAULT 0, devices TEXT NOT NULL DEFAULT '',
  model_name TEXT NOT NULL DEFAULT '', params INTEGER NOT NULL DEFAULT 0,
  final_metrics_json TEXT NOT NULL DEFAULT '{}', message TEXT NOT NULL DEFAULT '',
  notes TEXT NOT NULL DEFAULT '');
CREATE INDEX runs_started ON runs(started_at_ms);
CREATE TABLE steps (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  global_step INTEGER NOT NULL, epoch INTEGER NOT NULL, step INTEGER NOT NULL,
  time_ms INTEGER NOT NULL, name TEXT NOT NULL, value REAL,
  PRIMARY KEY (run_id, global_step, name)) WITHOUT ROWID;
CREATE TABLE epochs (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  epoch INTEGER NOT NULL, time_ms INTEGER NOT NULL, seconds REAL NOT NULL DEFAULT 0,
  metrics_json TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (run_id, epoch)) WITHOUT ROWID;
CREATE TABLE device_stats (id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE, time_ms INTEGER NOT NULL,
  device TEXT NOT NULL, utilization REAL, memory_bytes INTEGER NOT NULL DEFAULT 0,
  samples_per_s REAL);
CREATE INDEX device_stats_run ON device_stats(run_id, id);
CREATE TABLE logs (id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE, time_ms INTEGER NOT NULL,
  level TEXT NOT NULL, text TEXT NOT NULL);
CREATE INDEX logs_run ON logs(run_id, id);
PRAGMA user_version = 1;
)sql";

// What migration 1 -> 2 added, frozen here: kSchemaV1 + kSchemaV2Delta is a real v2 file.
const char* kSchemaV2Delta = R"sql(
ALTER TABLE runs ADD COLUMN updated_at_ms INTEGER NOT NULL DEFAULT 0;
CREATE INDEX runs_name ON runs(name, started_at_ms);
PRAGMA user_version = 2;
)sql";

// What migration 2 -> 3 did, frozen here: kSchemaV1 + kSchemaV2Delta + kSchemaV3Delta is a real
// v3 file.
const char* kSchemaV3Delta = R"sql(
CREATE TABLE replica_stats (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    global_step INTEGER NOT NULL,
    replica INTEGER NOT NULL,
    worker INTEGER NOT NULL DEFAULT 0,
    device TEXT NOT NULL DEFAULT '',
    time_ms INTEGER NOT NULL,
    samples_per_s REAL,
    compute_s REAL,
    all_reduce_s REAL,
    input_wait_s REAL,
    PRIMARY KEY (run_id, global_step, replica)
) WITHOUT ROWID;
CREATE TABLE run_documents (
    run_id INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    project_json TEXT NOT NULL DEFAULT '',
    config_json TEXT NOT NULL DEFAULT '{}'
);
INSERT INTO run_documents (run_id, project_json, config_json)
    SELECT id, project_json, config_json FROM runs;
ALTER TABLE runs DROP COLUMN project_json;
ALTER TABLE runs DROP COLUMN config_json;
PRAGMA user_version = 3;
)sql";

// What migration 3 -> 4 did, frozen here: with the deltas before it, a real v4 file.
const char* kSchemaV4Delta = R"sql(
CREATE TABLE checkpoints (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    kind TEXT NOT NULL,
    global_step INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    step INTEGER NOT NULL,
    monitor_value REAL,
    bytes INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (run_id, path)
) WITHOUT ROWID;
PRAGMA user_version = 4;
)sql";

const char* kSchemaV5Delta = R"sql(
ALTER TABLE device_stats ADD COLUMN gpu_memory_used_bytes INTEGER;
ALTER TABLE device_stats ADD COLUMN gpu_memory_total_bytes INTEGER;
ALTER TABLE device_stats ADD COLUMN gpu_utilization REAL;
PRAGMA user_version = 5;
)sql";

ReplicaRow replicaRow(int64_t globalStep, int replica, double samplesPerSecond) {
    ReplicaRow r;
    r.globalStep = globalStep;
    r.timeMs = 100 + globalStep;
    r.stats.replica = replica;
    r.stats.worker = replica / 2;
    r.stats.device = "cpu:" + std::to_string(replica);
    r.stats.samplesPerSecond = samplesPerSecond;
    r.stats.computeSeconds = 0.01 * (replica + 1);
    r.stats.allReduceSeconds = 0.002 * (replica + 1);
    r.stats.inputWaitSeconds = 0.0005 * (replica + 1);
    return r;
}

}  // namespace

class TestStore : public QObject {
    Q_OBJECT

  private:
    QTemporaryDir dir_;
    int counter_ = 0;
    // A fresh database path per test.
    std::string newPath() {
        return dir_.filePath(QString("db%1/runs.db").arg(++counter_)).toStdString();
    }
    std::unique_ptr<RunStore> openOk(const std::string& path) {
        auto s = RunStore::open(path);
        if (!s.ok()) qWarning("%s", s.error().c_str());
        return s.ok() ? std::move(s).value() : nullptr;
    }

  private slots:
    void initTestCase() { QVERIFY(dir_.isValid()); }

    void openCreatesSchema() {
        const std::string path = newPath();  // its directory does not exist yet
        auto store = openOk(path);
        QVERIFY(store);
        QCOMPARE(store->path(), path);
        QVERIFY(RunStore::schemaVersion() >= 1);
        RawDb raw(path);
        QCOMPARE(raw.queryInt("PRAGMA user_version"), int64_t(RunStore::schemaVersion()));
        QCOMPARE(raw.queryText("PRAGMA journal_mode"), std::string("wal"));
        for (const char* table :
             {"runs", "run_documents", "steps", "epochs", "device_stats", "replica_stats", "logs"})
            QCOMPARE(raw.queryInt(std::string("SELECT count(*) FROM sqlite_master WHERE type = "
                                              "'table' AND name = '") +
                                  table + "'"),
                     int64_t(1));
        auto runs = store->listRuns();
        QVERIFY(runs.ok());
        QVERIFY(runs->empty());
    }

    void createListGetFind() {
        const std::string path = newPath();
        auto store = openOk(path);
        QVERIFY(store);
        RunRecord a = makeRun("baseline", 1000);
        a.notes = "first";
        auto idA = store->createRun(a);
        QVERIFY2(idA.ok(), idA.ok() ? "" : idA.error().c_str());
        auto idB = store->createRun(makeRun("wide", 2000));
        auto idC = store->createRun(makeRun("baseline", 3000));
        QVERIFY(idB.ok() && idC.ok());
        QVERIFY(*idA != *idB && *idB != *idC);

        auto runs = store->listRuns();
        QVERIFY(runs.ok());
        QCOMPARE(runs->size(), size_t(3));
        QCOMPARE((*runs)[0].id, *idC);  // newest first
        QCOMPARE((*runs)[1].id, *idB);
        QCOMPARE((*runs)[2].id, *idA);

        auto got = store->getRun(*idA);
        QVERIFY(got.ok());
        QCOMPARE(got->name, a.name);
        QCOMPARE(got->projectJson, a.projectJson);
        QCOMPARE(got->configJson, a.configJson);
        QCOMPARE(got->status, std::string("running"));
        QCOMPARE(got->startedAtMs, int64_t(1000));
        QCOMPARE(got->endedAtMs, int64_t(0));
        QCOMPARE(got->host, hostName());  // filled in when empty
        QCOMPARE(got->pid, int64_t(getpid()));
        QCOMPARE(got->devices, a.devices);
        QCOMPARE(got->modelName, a.modelName);
        QCOMPARE(got->params, a.params);
        QCOMPARE(got->finalMetricsJson, std::string("{}"));
        QCOMPARE(got->notes, std::string("first"));
        QVERIFY(!got->bestValAccuracy.has_value());

        auto byId = store->findRun(std::to_string(*idB));
        QVERIFY(byId.ok());
        QCOMPARE(byId->name, std::string("wide"));
        auto byName = store->findRun("baseline");
        QVERIFY(byName.ok());
        QCOMPARE(byName->id, *idC);  // the newest of that name

        auto missing = store->findRun("nope");
        QVERIFY(!missing.ok());
        QCOMPARE(missing.error(), "no run 'nope' in " + path);
        QVERIFY(!store->findRun("999").ok());
        auto noId = store->getRun(999);
        QVERIFY(!noId.ok());
        QVERIFY(noId.error().find(path) != std::string::npos);

        RunRecord bad = makeRun("bad", 1);
        bad.status = "exploded";
        auto badId = store->createRun(bad);
        QVERIFY(!badId.ok());
        QVERIFY(badId.error().find("exploded") != std::string::npos);
    }

    void stepsRoundTrip() {
        auto store = openOk(newPath());
        QVERIFY(store);
        auto id = store->createRun(makeRun("r", 1));
        QVERIFY(id.ok());
        const double nan = std::numeric_limits<double>::quiet_NaN();
        const double inf = std::numeric_limits<double>::infinity();
        std::vector<StepRow> rows;
        for (int64_t g = 1; g <= 5; ++g) {
            StepRow r;
            r.globalStep = g;
            r.epoch = int(g - 1) / 2;
            r.step = (g - 1) % 2 + 1;
            r.timeMs = 1700000000000 + g;
            r.metrics = {{"loss", 1.0 / 3.0 + double(g)},
                         {"accuracy", 0.1 * double(g)},
                         {"lr", 1e-300},
                         {"samples_per_s", 12345.678901234567}};
            rows.push_back(r);
        }
        rows[3].metrics["loss"] = nan;
        rows[4].metrics["loss"] = inf;
        QVERIFY(store->appendSteps(*id, rows).ok());

        auto back = store->steps(*id);
        QVERIFY(back.ok());
        QCOMPARE(back->size(), rows.size());
        for (size_t i = 0; i < rows.size(); ++i) {
            const StepRow& a = rows[i];
            const StepRow& b = (*back)[i];
            QCOMPARE(b.globalStep, a.globalStep);
            QCOMPARE(b.epoch, a.epoch);
            QCOMPARE(b.step, a.step);
            QCOMPARE(b.timeMs, a.timeMs);
            QCOMPARE(b.metrics.size(), a.metrics.size());
            for (const auto& [k, v] : a.metrics) {
                QVERIFY(b.metrics.count(k));
                if (std::isnan(v))
                    QVERIFY(std::isnan(b.metrics.at(k)));
                else
                    QVERIFY2(b.metrics.at(k) == v, k.c_str());  // bit-exact
            }
        }
        auto after = store->steps(*id, 3);
        QVERIFY(after.ok());
        QCOMPARE(after->size(), size_t(2));
        QCOMPARE(after->front().globalStep, int64_t(4));

        // Re-writing a step (a resumed run) replaces it instead of failing.
        StepRow again = rows[0];
        again.metrics = {{"loss", 0.5}};
        QVERIFY(store->appendSteps(*id, {again}).ok());
        QCOMPARE(store->steps(*id)->front().metrics.at("loss"), 0.5);

        auto noRun = store->appendSteps(9999, rows);
        QVERIFY(!noRun.ok());
        QVERIFY(noRun.error().find("no run with id 9999") != std::string::npos);
        QVERIFY(store->appendSteps(*id, {}).ok());
    }

    void epochsDevicesLogsRoundTrip() {
        auto store = openOk(newPath());
        QVERIFY(store);
        auto id = store->createRun(makeRun("r", 1));
        QVERIFY(id.ok());
        std::vector<EpochRow> epochs = {
            {0, 1700000001000, 12.25, {{"loss", 0.7}, {"val_loss", 0.8}, {"val_accuracy", 0.61}}},
            {1, 1700000002000, 11.5, {{"loss", 0.5}, {"val_loss", 0.6}, {"val_accuracy", 0.7}}},
        };
        // The second row has the GPU's own figures (NVML), the first none (stored as NULL).
        std::vector<DeviceRow> devs = {
            {1700000001500, "cpu:0", 0.875, int64_t(3) << 33, 1500.5, -1, -1, -1},
            {1700000001500, "cuda:1", 0.5, 1024, 700.25, int64_t(5) << 30, int64_t(141) << 30,
             0.625}};
        std::vector<LogRow> logs = {{1700000000100, "info", "epoch 1/2"},
                                    {1700000000200, "warning", "lr, \"quoted\"\nmultiline ✓"}};
        QVERIFY(store->appendEpochs(*id, epochs).ok());
        QVERIFY(store->appendDeviceStats(*id, devs).ok());
        QVERIFY(store->appendLogs(*id, logs).ok());

        auto e = store->epochs(*id);
        QVERIFY(e.ok());
        QCOMPARE(e->size(), size_t(2));
        for (size_t i = 0; i < 2; ++i) {
            QCOMPARE((*e)[i].epoch, epochs[i].epoch);
            QCOMPARE((*e)[i].timeMs, epochs[i].timeMs);
            QCOMPARE((*e)[i].seconds, epochs[i].seconds);
            QVERIFY((*e)[i].metrics == epochs[i].metrics);
        }
        auto d = store->deviceStats(*id);
        QVERIFY(d.ok());
        QCOMPARE(d->size(), size_t(2));
        for (size_t i = 0; i < 2; ++i) {
            QCOMPARE((*d)[i].timeMs, devs[i].timeMs);
            QCOMPARE((*d)[i].device, devs[i].device);
            QCOMPARE((*d)[i].utilization, devs[i].utilization);
            QCOMPARE((*d)[i].memoryBytes, devs[i].memoryBytes);
            QCOMPARE((*d)[i].samplesPerSecond, devs[i].samplesPerSecond);
            QCOMPARE((*d)[i].memoryUsedBytes, devs[i].memoryUsedBytes);
            QCOMPARE((*d)[i].memoryTotalBytes, devs[i].memoryTotalBytes);
            QCOMPARE((*d)[i].gpuUtilization, devs[i].gpuUtilization);
        }
        auto l = store->logs(*id);
        QVERIFY(l.ok());
        QCOMPARE(l->size(), size_t(2));
        for (size_t i = 0; i < 2; ++i) {
            QCOMPARE((*l)[i].timeMs, logs[i].timeMs);
            QCOMPARE((*l)[i].level, logs[i].level);
            QCOMPARE((*l)[i].text, logs[i].text);
        }
        QCOMPARE(store->getRun(*id)->updatedAtMs, int64_t(1700000002000));
    }

    void finishRun() {
        auto store = openOk(newPath());
        QVERIFY(store);
        auto id = store->createRun(makeRun("r", 1));
        QVERIFY(id.ok());
        const MetricMap final = {{"loss", 0.25},
                                 {"test_accuracy", 0.9125},
                                 {"bad", std::numeric_limits<double>::quiet_NaN()}};
        QVERIFY(store->finishRun(*id, RunStatus::Stopped, final, "early stopping").ok());
        auto r = store->getRun(*id);
        QVERIFY(r.ok());
        QCOMPARE(r->status, std::string("stopped"));
        QCOMPARE(r->message, std::string("early stopping"));
        QVERIFY(r->endedAtMs > 0);
        auto j = nlohmann::json::parse(r->finalMetricsJson);
        QCOMPARE(j["loss"].get<double>(), 0.25);
        QCOMPARE(j["test_accuracy"].get<double>(), 0.9125);
        QVERIFY(j["bad"].is_null());
        QVERIFY(!store->finishRun(777, RunStatus::Completed, {}, "").ok());
    }

    void renameNotesDelete() {
        const std::string path = newPath();
        auto store = openOk(path);
        QVERIFY(store);
        auto id = store->createRun(makeRun("old", 1));
        auto other = store->createRun(makeRun("other", 2));
        QVERIFY(id.ok() && other.ok());
        QVERIFY(store->renameRun(*id, "new name").ok());
        QVERIFY(store->setNotes(*id, "lr too high?").ok());
        QCOMPARE(store->getRun(*id)->name, std::string("new name"));
        QCOMPARE(store->getRun(*id)->notes, std::string("lr too high?"));
        QVERIFY(store->findRun("new name").ok());
        QVERIFY(!store->renameRun(555, "x").ok());
        QVERIFY(!store->setNotes(555, "x").ok());

        for (int64_t run : {*id, *other}) {
            QVERIFY(store->appendSteps(run, {{1, 0, 1, 5, {{"loss", 1.0}}}}).ok());
            QVERIFY(store->appendEpochs(run, {{0, 5, 1.0, {{"loss", 1.0}}}}).ok());
            QVERIFY(store->appendDeviceStats(run, {{5, "cpu:0", 1.0, 1, 1.0}}).ok());
            QVERIFY(store->appendReplicaStats(run, {replicaRow(1, 0, 10.0)}).ok());
            QVERIFY(store->appendLogs(run, {{5, "info", "x"}}).ok());
        }
        QVERIFY(store->deleteRun(*id).ok());
        QVERIFY(!store->getRun(*id).ok());
        QVERIFY(!store->deleteRun(*id).ok());
        RawDb raw(path);
        for (const char* table :
             {"steps", "epochs", "device_stats", "replica_stats", "run_documents", "logs"}) {
            QCOMPARE(raw.queryInt(std::string("SELECT count(*) FROM ") + table +
                                  " WHERE run_id = " + std::to_string(*id)),
                     int64_t(0));
            QCOMPARE(raw.queryInt(std::string("SELECT count(*) FROM ") + table +
                                  " WHERE run_id = " + std::to_string(*other)),
                     int64_t(1));
        }
        QCOMPARE(store->listRuns()->size(), size_t(1));
    }

    void exportCsv() {
        auto store = openOk(newPath());
        QVERIFY(store);
        auto id = store->createRun(makeRun("r", 1));
        QVERIFY(id.ok());
        QVERIFY(store
                    ->appendEpochs(*id, {{0, 10, 2.5, {{"loss", 0.5}, {"val_accuracy", 0.8}}},
                                         {1, 20, 2.25, {{"loss", 1.0 / 3.0}}}})
                    .ok());
        QVERIFY(store
                    ->appendSteps(*id, {{1, 0, 1, 1, {{"loss", 0.1}, {"accuracy", 0.5}}},
                                        {2, 0, 2, 2, {{"loss", 2.0 / 3.0}, {"lr", 0.001}}}})
                    .ok());
        auto csv = store->exportCsv(*id);
        QVERIFY(csv.ok());
        const std::string expected =
            "epoch,seconds,loss,val_accuracy\n"
            "0,2.5,0.5,0.8\n"
            "1,2.25,0.333333333,\n"
            "\n"
            "global_step,epoch,step,accuracy,loss,lr\n"
            "1,0,1,0.5,0.1,\n"
            "2,0,2,,0.666666667,0.001\n";
        QCOMPARE(*csv, expected);
        QVERIFY(!store->exportCsv(4242).ok());
    }

    void bestValAccuracy() {
        auto store = openOk(newPath());
        QVERIFY(store);
        auto plain = store->createRun(makeRun("plain", 1));
        auto sparse = store->createRun(makeRun("sparse", 2));
        auto none = store->createRun(makeRun("none", 3));
        QVERIFY(plain.ok() && sparse.ok() && none.ok());
        QVERIFY(store
                    ->appendEpochs(*plain, {{0, 1, 1, {{"val_accuracy", 0.7}, {"accuracy", 0.99}}},
                                            {1, 2, 1, {{"val_accuracy", 0.85}}},
                                            {2, 3, 1, {{"val_accuracy", 0.8}}}})
                    .ok());
        QVERIFY(
            store
                ->appendEpochs(*sparse, {{0, 1, 1, {{"val_sparse_categorical_accuracy", 0.6}}},
                                         {1, 2, 1, {{"val_sparse_categorical_accuracy", 0.65}}}})
                .ok());
        QVERIFY(store->appendEpochs(*none, {{0, 1, 1, {{"val_loss", 0.3}}}}).ok());
        QCOMPARE(store->getRun(*plain)->bestValAccuracy, std::optional<double>(0.85));
        QCOMPARE(store->getRun(*sparse)->bestValAccuracy, std::optional<double>(0.65));
        QVERIFY(!store->getRun(*none)->bestValAccuracy.has_value());
        auto runs = store->listRuns();
        QVERIFY(runs.ok());
        QCOMPARE(runs->size(), size_t(3));
        QCOMPARE((*runs)[2].bestValAccuracy, std::optional<double>(0.85));
        QCOMPARE((*runs)[1].bestValAccuracy, std::optional<double>(0.65));
    }

    void interruptedRunRecovery() {
        const std::string path = newPath();
        int64_t deadId = 0, maxPidId = 0, liveId = 0, otherHostId = 0, doneId = 0;
        {
            auto store = openOk(path);
            QVERIFY(store);
            RunRecord dead = makeRun("dead", 1000);
            dead.pid = deadPid();
            deadId = *store->createRun(dead);
            QVERIFY(store->appendSteps(deadId, {{1, 0, 1, 5000, {{"loss", 1.0}}}}).ok());
            RunRecord maxPid = makeRun("maxpid", 1000);
            maxPid.pid = INT32_MAX;
            maxPidId = *store->createRun(maxPid);
            liveId = *store->createRun(makeRun("live", 1000));  // our own pid
            RunRecord other = makeRun("elsewhere", 1000);
            other.host = "some-other-host.invalid";
            other.pid = deadPid();
            otherHostId = *store->createRun(other);
            RunRecord done = makeRun("done", 1000);
            done.pid = deadPid();
            doneId = *store->createRun(done);
            QVERIFY(store->finishRun(doneId, RunStatus::Completed, {}, "").ok());
        }
        auto store = openOk(path);
        QVERIFY(store);
        auto dead = store->getRun(deadId);
        QCOMPARE(dead->status, std::string("interrupted"));
        QCOMPARE(dead->endedAtMs, int64_t(5000));  // its last write
        QVERIFY(dead->message.find("ended without a final status") != std::string::npos);
        QCOMPARE(store->getRun(maxPidId)->status, std::string("interrupted"));
        QCOMPARE(store->getRun(liveId)->status, std::string("running"));
        QCOMPARE(store->getRun(otherHostId)->status, std::string("running"));
        QCOMPARE(store->getRun(doneId)->status, std::string("completed"));
    }

    void reopenKeepsData() {
        const std::string path = newPath();
        int64_t id = 0;
        {
            auto store = openOk(path);
            QVERIFY(store);
            id = *store->createRun(makeRun("kept", 1));
            QVERIFY(store->appendSteps(id, {{1, 0, 1, 5, {{"loss", 0.125}}}}).ok());
            QVERIFY(store->appendEpochs(id, {{0, 6, 1.5, {{"val_accuracy", 0.5}}}}).ok());
        }
        for (int i = 0; i < 2; ++i) {
            auto store = openOk(path);
            QVERIFY(store);
            QCOMPARE(store->getRun(id)->name, std::string("kept"));
            QCOMPARE(store->steps(id)->front().metrics.at("loss"), 0.125);
            QCOMPARE(store->epochs(id)->size(), size_t(1));
            QCOMPARE(store->getRun(id)->bestValAccuracy, std::optional<double>(0.5));
        }
    }

    void garbageFileRefused() {
        const std::string path = dir_.filePath("garbage.db").toStdString();
        std::string bytes(4096, '\0');
        std::mt19937 rng(42);
        for (char& c : bytes) c = static_cast<char>(rng() & 0xff);
        {
            std::ofstream f(path, std::ios::binary);
            f.write(bytes.data(), std::streamsize(bytes.size()));
        }
        auto store = RunStore::open(path);
        QVERIFY(!store.ok());
        QVERIFY2(store.error().find(path) != std::string::npos, store.error().c_str());
        QVERIFY2(store.error().find("file is not a database") != std::string::npos,
                 store.error().c_str());
        QVERIFY(readFile(path) == bytes);

        const std::string text = dir_.filePath("notes.txt").toStdString();
        {
            std::ofstream f(text);
            f << "this is a text file, not a run store\n";
        }
        auto store2 = RunStore::open(text);
        QVERIFY(!store2.ok());
        QVERIFY2(store2.error().find(text) != std::string::npos, store2.error().c_str());
        QCOMPARE(readFile(text), std::string("this is a text file, not a run store\n"));

        // A directory where the file should be.
        auto store3 = RunStore::open(dir_.path().toStdString());
        QVERIFY(!store3.ok());
        QVERIFY(store3.error().find(dir_.path().toStdString()) != std::string::npos);
        QVERIFY(!RunStore::open("").ok());
    }

    void newerSchemaRefused() {
        const std::string path = dir_.filePath("future.db").toStdString();
        const int future = RunStore::schemaVersion() + 1;
        {
            RawDb raw(path);
            raw.exec("CREATE TABLE runs (id INTEGER PRIMARY KEY, shiny TEXT)");
            raw.exec("PRAGMA user_version = " + std::to_string(future));
        }
        auto store = RunStore::open(path);
        QVERIFY(!store.ok());
        QVERIFY2(store.error().find(path) != std::string::npos, store.error().c_str());
        QVERIFY2(store.error().find("schema version " + std::to_string(future) + " is newer") !=
                     std::string::npos,
                 store.error().c_str());
        RawDb raw(path);
        QCOMPARE(raw.queryInt("PRAGMA user_version"), int64_t(future));
        QCOMPARE(raw.queryText("PRAGMA journal_mode"), std::string("delete"));  // untouched
    }

    void migratesVersion1() {
        QCOMPARE(RunStore::schemaVersion(), 7);  // update this test when adding a migration
        const std::string path = dir_.filePath("v1.db").toStdString();
        {
            RawDb raw(path);
            raw.exec(kSchemaV1);
            raw.exec(
                "INSERT INTO runs (id, name, status, started_at_ms, ended_at_ms, host, pid) "
                "VALUES (1, 'old', 'completed', 1000, 9000, 'h', 1)");
            raw.exec(
                "INSERT INTO runs (id, name, status, started_at_ms, host, pid) "
                "VALUES (2, 'older', 'failed', 500, 'h', 1)");
            raw.exec("INSERT INTO steps VALUES (2, 1, 0, 1, 700, 'loss', 0.5)");
            raw.exec("INSERT INTO epochs VALUES (2, 0, 800, 1.5, '{\"val_accuracy\":0.75}')");
        }
        auto store = openOk(path);
        QVERIFY(store);
        RawDb raw(path);
        QCOMPARE(raw.queryInt("PRAGMA user_version"), int64_t(RunStore::schemaVersion()));
        QCOMPARE(raw.queryInt("SELECT count(*) FROM sqlite_master WHERE name = 'runs_name'"),
                 int64_t(1));
        auto r1 = store->getRun(1);
        QVERIFY(r1.ok());
        QCOMPARE(r1->updatedAtMs, int64_t(9000));  // backfilled from the rows already there
        QCOMPARE(r1->idleMs, int64_t(0));
        QCOMPARE(r1->activeMs(0), int64_t(8000));
        auto r2 = store->getRun(2);
        QVERIFY(r2.ok());
        QCOMPARE(r2->updatedAtMs, int64_t(800));
        QCOMPARE(r2->bestValAccuracy, std::optional<double>(0.75));
        QCOMPARE(store->steps(2)->front().metrics.at("loss"), 0.5);
        // The upgraded database takes new rows.
        QVERIFY(store->appendSteps(2, {{2, 0, 2, 900, {{"loss", 0.25}}}}).ok());
        QCOMPARE(store->getRun(2)->updatedAtMs, int64_t(900));
    }

    // A store written by the previous version keeps every run and every row, and takes
    // per-replica rows afterwards.
    void migratesVersion2() {
        const std::string path = dir_.filePath("v2.db").toStdString();
        constexpr int kRuns = 5;
        {
            RawDb raw(path);
            raw.exec(kSchemaV1);
            raw.exec(kSchemaV2Delta);
            for (int i = 1; i <= kRuns; ++i) {
                const std::string id = std::to_string(i);
                raw.exec(
                    "INSERT INTO runs (id, name, project_json, config_json, status, "
                    "started_at_ms, ended_at_ms, host, pid, devices, params, notes, "
                    "updated_at_ms) VALUES (" +
                    id + ", 'run " + id + "', '{\"name\":\"p" + id + "\"}', '{\"epochs\":" + id +
                    "}', 'completed', " + id + "000, " + id + "900, 'h', 1, 'cpu:0', 42, 'note " +
                    id + "', " + id + "900)");
                raw.exec("INSERT INTO steps VALUES (" + id + ", 1, 0, 1, " + id +
                         "100, 'loss', 0." + id + ")");
                raw.exec("INSERT INTO epochs VALUES (" + id + ", 0, " + id +
                         "200, 1.5, '{\"val_accuracy\":0.5}')");
                raw.exec(
                    "INSERT INTO device_stats (run_id, time_ms, device, utilization, "
                    "memory_bytes, samples_per_s) VALUES (" +
                    id + ", " + id + "300, 'cpu:0', 0.5, 7, 99)");
                raw.exec("INSERT INTO logs (run_id, time_ms, level, text) VALUES (" + id + ", " +
                         id + "400, 'info', 'hello')");
            }
        }
        auto store = openOk(path);
        QVERIFY(store);
        {
            RawDb raw(path);
            QCOMPARE(raw.queryInt("PRAGMA user_version"), int64_t(RunStore::schemaVersion()));
            QCOMPARE(raw.queryInt("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
                                  "name = 'replica_stats'"),
                     int64_t(1));
            // The documents moved out of the runs rows.
            QCOMPARE(raw.queryInt("SELECT count(*) FROM run_documents"), int64_t(kRuns));
            QCOMPARE(raw.queryInt("SELECT count(*) FROM pragma_table_info('runs') WHERE name IN "
                                  "('project_json', 'config_json')"),
                     int64_t(0));
        }
        auto runs = store->listRuns();
        QVERIFY(runs.ok());
        QCOMPARE(runs->size(), size_t(kRuns));
        for (int i = 1; i <= kRuns; ++i) {
            auto r = store->getRun(i);
            QVERIFY(r.ok());
            QCOMPARE(r->name, "run " + std::to_string(i));
            QCOMPARE(r->projectJson, "{\"name\":\"p" + std::to_string(i) + "\"}");
            QCOMPARE(r->configJson, "{\"epochs\":" + std::to_string(i) + "}");
            QCOMPARE(r->status, std::string("completed"));
            QCOMPARE(r->notes, "note " + std::to_string(i));
            QCOMPARE(r->params, int64_t(42));
            QCOMPARE(r->updatedAtMs, int64_t(i * 1000 + 900));
            QCOMPARE(r->bestValAccuracy, std::optional<double>(0.5));
            QCOMPARE(store->steps(i)->size(), size_t(1));
            QCOMPARE(store->steps(i)->front().metrics.at("loss"), 0.1 * i);
            QCOMPARE(store->epochs(i)->size(), size_t(1));
            QCOMPARE(store->deviceStats(i)->size(), size_t(1));
            // Rows from before the GPU columns (schema 5) read back with the figures unknown.
            QCOMPARE(store->deviceStats(i)->front().memoryBytes, int64_t(7));
            QCOMPARE(store->deviceStats(i)->front().memoryUsedBytes, int64_t(-1));
            QCOMPARE(store->deviceStats(i)->front().memoryTotalBytes, int64_t(-1));
            QCOMPARE(store->deviceStats(i)->front().gpuUtilization, -1.0);
            QCOMPARE(store->logs(i)->size(), size_t(1));
            QVERIFY(store->replicaStats(i)->empty());
        }
        QVERIFY(store->appendReplicaStats(3, {replicaRow(2, 0, 5.0), replicaRow(2, 1, 6.0)}).ok());
        QCOMPARE(store->replicaStats(3)->size(), size_t(2));
        QCOMPARE(store->getRun(3)->updatedAtMs, int64_t(3900));  // row time 102 is older
    }

    // A store of the previous version (3) keeps every run and row, and takes checkpoint rows.
    void migratesVersion3() {
        const std::string path = dir_.filePath("v3.db").toStdString();
        constexpr int kRuns = 4;
        {
            RawDb raw(path);
            raw.exec(kSchemaV1);
            raw.exec(kSchemaV2Delta);
            raw.exec(kSchemaV3Delta);
            for (int i = 1; i <= kRuns; ++i) {
                const std::string id = std::to_string(i);
                raw.exec(
                    "INSERT INTO runs (id, name, status, started_at_ms, ended_at_ms, host, pid, "
                    "devices, params, notes, updated_at_ms) VALUES (" +
                    id + ", 'run " + id + "', 'stopped', " + id + "000, " + id +
                    "900, 'h', 1, 'cpu:0', 42, 'note " + id + "', " + id + "900)");
                raw.exec("INSERT INTO run_documents VALUES (" + id + ", '{\"name\":\"p" + id +
                         "\"}', '{}')");
                raw.exec("INSERT INTO steps VALUES (" + id + ", 1, 0, 1, " + id +
                         "100, 'loss', 0." + id + ")");
                raw.exec("INSERT INTO epochs VALUES (" + id + ", 0, " + id +
                         "200, 1.5, '{\"val_accuracy\":0.5}')");
                raw.exec("INSERT INTO replica_stats VALUES (" + id +
                         ", 1, 0, 0, 'cpu:0', 5, 1.0, 0.1, 0.0, 0.0)");
                raw.exec("INSERT INTO logs (run_id, time_ms, level, text) VALUES (" + id + ", " +
                         id + "400, 'info', 'hello')");
            }
        }
        auto store = openOk(path);
        QVERIFY(store);
        {
            RawDb raw(path);
            QCOMPARE(raw.queryInt("PRAGMA user_version"), int64_t(RunStore::schemaVersion()));
            QCOMPARE(raw.queryInt("SELECT count(*) FROM checkpoints"), int64_t(0));
        }
        QCOMPARE(store->listRuns()->size(), size_t(kRuns));
        for (int i = 1; i <= kRuns; ++i) {
            auto r = store->getRun(i);
            QVERIFY(r.ok());
            QCOMPARE(r->name, "run " + std::to_string(i));
            QCOMPARE(r->status, std::string("stopped"));
            QCOMPARE(r->projectJson, "{\"name\":\"p" + std::to_string(i) + "\"}");
            QCOMPARE(r->notes, "note " + std::to_string(i));
            QCOMPARE(store->steps(i)->front().metrics.at("loss"), 0.1 * i);
            QCOMPARE(store->epochs(i)->size(), size_t(1));
            QCOMPARE(store->replicaStats(i)->size(), size_t(1));
            QCOMPARE(store->logs(i)->size(), size_t(1));
            QVERIFY(store->checkpoints(i)->empty());
        }
        // Checkpoint rows: newest first, a path again replaces its row, forgotten ones go.
        CheckpointRow a{"/c/run-32.tdckpt", "run", 32, 1, 0, std::nullopt, 100, 5};
        CheckpointRow b{"/c/run-64.tdckpt", "run", 64, 2, 0, 0.25, 200, 6};
        QVERIFY(store->addCheckpoints(2, {a, b}).ok());
        auto rows = store->checkpoints(2);
        QVERIFY(rows.ok());
        QCOMPARE(rows->size(), size_t(2));
        QCOMPARE(rows->at(0).path, b.path);
        QCOMPARE(rows->at(0).monitorValue, std::optional<double>(0.25));
        QCOMPARE(rows->at(1).monitorValue, std::optional<double>());
        QCOMPARE(rows->at(1).epoch, 1);
        CheckpointRow c{"/c/run-96.tdckpt", "run", 96, 3, 0, std::nullopt, 300, 7};
        QVERIFY(store->addCheckpoints(2, {c}, {a.path}).ok());
        rows = store->checkpoints(2);
        QCOMPARE(rows->size(), size_t(2));
        QCOMPARE(rows->at(0).globalStep, int64_t(96));
        QCOMPARE(rows->at(1).globalStep, int64_t(64));
        QVERIFY(store->checkpoints(3)->empty());
        QVERIFY(!store->addCheckpoints(4242, {a}).ok());  // no such run
        // A resumed run is running again under this process; deleting a run drops its rows.
        QVERIFY(store->reopenRun(2).ok());
        QCOMPARE(store->getRun(2)->status, std::string("running"));
        QCOMPARE(store->getRun(2)->endedAtMs, int64_t(0));
        QVERIFY(!store->reopenRun(4242).ok());
        QVERIFY(store->deleteRun(2).ok());
        RawDb raw(path);
        QCOMPARE(raw.queryInt("SELECT count(*) FROM checkpoints"), int64_t(0));
        QCOMPARE(store->listRuns()->size(), size_t(kRuns - 1));
    }

    // A resumed run's duration is the time it trained: the gap between its interruption and the
    // resume is credited to idle_ms, as the store and its polling readers both report.
    void resumedRunCountsActiveTime() {
        const std::string path = newPath();
        auto store = openOk(path);
        QVERIFY(store);
        RunRecord r = makeRun("resumed", 1000);
        r.status = "interrupted";
        r.endedAtMs = 4000;  // trained 3 s, then stood stopped until now (years)
        auto id = store->createRun(r);
        QVERIFY(id.ok());
        QCOMPARE(store->getRun(*id)->activeMs(0), int64_t(3000));
        QVERIFY(store->reopenRun(*id).ok());
        QVERIFY(store->finishRun(*id, RunStatus::Completed, {}, "").ok());
        auto back = store->getRun(*id);
        QVERIFY(back.ok());
        QVERIFY(back->idleMs > 1000000);
        // 3 s before, and the moments between the resume and the finish after.
        QVERIFY2(back->activeMs(0) >= 3000 && back->activeMs(0) < 3000 + 60000,
                 qPrintable(QString::number(back->activeMs(0))));
        QVERIFY(back->endedAtMs - back->startedAtMs > 1000000);
        auto reader = RunStoreReader::open(path);
        QVERIFY(reader.ok());
        auto snap = (*reader)->allRuns();
        QVERIFY(snap.ok() && snap->runs.size() == 1);
        QCOMPARE(snap->runs.front().idleMs, back->idleMs);
        // A second resume adds its own gap only.
        const int64_t idleBefore = back->idleMs;
        QVERIFY(store->reopenRun(*id).ok());
        QVERIFY(store->getRun(*id)->idleMs - idleBefore < 60000);
        // A store from before the column (schema 6) reads it as no idle time.
        store.reset();
        {
            RawDb raw(path);
            raw.exec("ALTER TABLE runs DROP COLUMN idle_ms; PRAGMA user_version = 6;");
        }
        auto old = RunStoreReader::open(path);
        QVERIFY(old.ok());
        auto oldSnap = (*old)->allRuns();
        QVERIFY2(oldSnap.ok(), oldSnap.ok() ? "" : oldSnap.error().c_str());
        QCOMPARE(oldSnap->runs.front().idleMs, int64_t(0));
        auto migrated = openOk(path);  // writable: migrated to the current schema
        QVERIFY(migrated);
        QCOMPARE(migrated->getRun(*id)->idleMs, int64_t(0));
    }

    // A store of the previous version (4) keeps its device rows (the GPU figures unknown) and
    // takes rows with them.
    void migratesVersion4() {
        const std::string path = dir_.filePath("v4.db").toStdString();
        {
            RawDb raw(path);
            raw.exec(kSchemaV1);
            raw.exec(kSchemaV2Delta);
            raw.exec(kSchemaV3Delta);
            raw.exec(kSchemaV4Delta);
            raw.exec(
                "INSERT INTO runs (id, name, status, started_at_ms, ended_at_ms, host, pid, "
                "devices, params, notes, updated_at_ms) VALUES (1, 'run', 'completed', 1000, "
                "1900, 'h', 1, 'cuda:0', 42, '', 1900)");
            raw.exec("INSERT INTO run_documents VALUES (1, '{}', '{}')");
            raw.exec(
                "INSERT INTO device_stats (run_id, time_ms, device, utilization, memory_bytes, "
                "samples_per_s) VALUES (1, 1300, 'cuda:0', 0.5, 7, 99)");
        }
        auto store = openOk(path);
        QVERIFY(store);
        {
            RawDb raw(path);
            QCOMPARE(raw.queryInt("PRAGMA user_version"), int64_t(RunStore::schemaVersion()));
            QCOMPARE(raw.queryInt("SELECT count(*) FROM pragma_table_info('device_stats') WHERE "
                                  "name IN ('gpu_memory_used_bytes', 'gpu_memory_total_bytes', "
                                  "'gpu_utilization')"),
                     int64_t(3));
        }
        auto rows = store->deviceStats(1);
        QVERIFY(rows.ok());
        QCOMPARE(rows->size(), size_t(1));
        QCOMPARE(rows->front().memoryBytes, int64_t(7));
        QCOMPARE(rows->front().samplesPerSecond, 99.0);
        QCOMPARE(rows->front().memoryUsedBytes, int64_t(-1));
        QCOMPARE(rows->front().memoryTotalBytes, int64_t(-1));
        QCOMPARE(rows->front().gpuUtilization, -1.0);
        QVERIFY(store->appendDeviceStats(1, {{2000, "cuda:0", 0.5, 7, 99, 1 << 30, 4LL << 30, 0.5}})
                    .ok());
        rows = store->deviceStats(1);
        QCOMPARE(rows->size(), size_t(2));
        QCOMPARE(rows->back().memoryUsedBytes, int64_t(1) << 30);
        QCOMPARE(rows->back().gpuUtilization, 0.5);
    }

    // A store of schema 5 kept its checkpoints in the folder it shared with every store beside
    // it (checkpoints/run-<id>/), named by paths relative to where the command ran. Opened, it
    // gets an identity, each found file is linked into its own folder and named relative to the
    // store; no file is moved or deleted, and a row whose file is gone keeps its path.
    void migratesVersion5Checkpoints() {
        namespace fs = std::filesystem;
        const fs::path folder = fs::path(dir_.filePath("v5").toStdString());
        fs::create_directories(folder / "checkpoints" / "run-1");
        const std::string path = (folder / "a.db").string();
        const fs::path legacy = folder / "checkpoints" / "run-1" / "run-32.tdckpt";
        {
            std::ofstream f(legacy, std::ios::binary);
            f << "checkpoint bytes";
        }
        {
            RawDb raw(path);
            raw.exec(kSchemaV1);
            raw.exec(kSchemaV2Delta);
            raw.exec(kSchemaV3Delta);
            raw.exec(kSchemaV4Delta);
            raw.exec(kSchemaV5Delta);
            for (int id : {1, 2, 3})
                raw.exec(
                    "INSERT INTO runs (id, name, status, started_at_ms, ended_at_ms, host, "
                    "pid, updated_at_ms) VALUES (" +
                    std::to_string(id) + ", 'r', 'completed', 1, 2, 'h', 1, 2)");
            raw.exec("DELETE FROM runs WHERE id = 3");  // deleted before the migration
            // As the old code wrote it with `--db a.db` run in another folder than this test's.
            raw.exec(
                "INSERT INTO checkpoints VALUES (1, './checkpoints/run-1/run-32.tdckpt', 'run', "
                "32, 1, 0, NULL, 16, 5)");
            raw.exec(
                "INSERT INTO checkpoints VALUES (2, '/gone/checkpoints/run-2/run-8.tdckpt', "
                "'run', 8, 1, 0, NULL, 16, 5)");
        }
        auto store = openOk(path);
        QVERIFY(store);
        QCOMPARE(store->storeId().size(), size_t(32));
        QVERIFY(store->storeId().find_first_not_of("0123456789abcdef") == std::string::npos);
        const fs::path own = fs::path(runCheckpointDir(path, 1)) / "run-32.tdckpt";
        QCOMPARE(own, folder / "checkpoints" / "a.db" / "run-1" / "run-32.tdckpt");
        QVERIFY(fs::exists(own));
        QVERIFY(fs::exists(legacy));  // another store may still name it
        QCOMPARE(readFile(own.string()), std::string("checkpoint bytes"));
        {
            RawDb raw(path);
            QCOMPARE(raw.queryText("SELECT path FROM checkpoints WHERE run_id = 1"),
                     std::string("checkpoints/a.db/run-1/run-32.tdckpt"));
            QCOMPARE(raw.queryText("SELECT path FROM checkpoints WHERE run_id = 2"),
                     std::string("/gone/checkpoints/run-2/run-8.tdckpt"));
        }
        QCOMPARE(store->checkpoints(1)->front().path, own.string());
        // Ids deleted before the migration cannot be known (SQLite reuses the highest); from
        // the migration on, none is given out twice.
        auto id = store->createRun(makeRun("new", 3));
        QVERIFY(id.ok());
        QCOMPARE(*id, int64_t(3));
        QVERIFY(store->deleteRun(*id).ok());
        id = store->createRun(makeRun("newer", 4));
        QVERIFY(id.ok());
        QCOMPARE(*id, int64_t(4));
        // A second store gets another identity.
        auto other = openOk((folder / "b.db").string());
        QVERIFY(other && other->storeId() != store->storeId());
    }

    // Run ids are never given out twice, not even the highest after it was deleted; checkpoint
    // paths are kept relative to the store's folder, so another working folder finds them.
    void idsNeverReusedAndPathsRelative() {
        namespace fs = std::filesystem;
        const std::string path = newPath();
        auto store = openOk(path);
        QVERIFY(store);
        auto a = store->createRun(makeRun("a", 1));
        auto b = store->createRun(makeRun("b", 2));
        QVERIFY(a.ok() && b.ok());
        QVERIFY(store->deleteRun(*b).ok());
        auto c = store->createRun(makeRun("c", 3));
        QVERIFY(c.ok());
        QCOMPARE(*c, *b + 1);
        CheckpointRow inside;
        inside.path = runCheckpointDir(path, *a) + "/run-5.tdckpt";
        inside.kind = "run";
        inside.globalStep = 5;
        CheckpointRow outside = inside;
        outside.path = dir_.filePath("elsewhere/model-7.tdckpt").toStdString();
        outside.globalStep = 7;
        QVERIFY(store->addCheckpoints(*a, {inside, outside}).ok());
        {
            RawDb raw(path);
            QCOMPARE(raw.queryText("SELECT path FROM checkpoints WHERE global_step = 5"),
                     "checkpoints/" + fs::path(path).filename().string() + "/run-" +
                         std::to_string(*a) + "/run-5.tdckpt");
            QCOMPARE(raw.queryText("SELECT path FROM checkpoints WHERE global_step = 7"),
                     fs::absolute(outside.path).lexically_normal().string());
        }
        auto rows = store->checkpoints(*a);
        QVERIFY(rows.ok() && rows->size() == 2);
        QCOMPARE(fs::absolute(rows->at(1).path).lexically_normal(),
                 fs::absolute(inside.path).lexically_normal());
        // Forgetting takes the path as it was registered.
        QVERIFY(store->addCheckpoints(*a, {}, {inside.path}).ok());
        QCOMPARE(store->checkpoints(*a)->size(), size_t(1));
    }

    void replicaStatsRoundTrip() {
        auto store = openOk(newPath());
        QVERIFY(store);
        auto id = store->createRun(makeRun("replicas", 1));
        auto other = store->createRun(makeRun("other", 2));
        QVERIFY(id.ok() && other.ok());
        std::vector<ReplicaRow> rows;
        for (int64_t g : {10, 20, 30})
            for (int r = 0; r < 3; ++r) rows.push_back(replicaRow(g, r, 100.0 * g + r));
        rows[4].stats.allReduceSeconds = std::numeric_limits<double>::quiet_NaN();
        // Out of order on purpose: reads come back by step, then replica.
        std::reverse(rows.begin(), rows.end());
        QVERIFY(store->appendReplicaStats(*id, rows).ok());
        QVERIFY(store->appendReplicaStats(*other, {replicaRow(10, 0, 1.0)}).ok());
        QVERIFY(store->appendReplicaStats(*id, {}).ok());
        QVERIFY(!store->appendReplicaStats(4242, {replicaRow(1, 0, 1.0)}).ok());

        auto back = store->replicaStats(*id);
        QVERIFY(back.ok());
        QCOMPARE(back->size(), size_t(9));
        std::reverse(rows.begin(), rows.end());
        for (size_t i = 0; i < rows.size(); ++i) {
            const ReplicaRow& a = rows[i];
            const ReplicaRow& b = (*back)[i];
            QCOMPARE(b.globalStep, a.globalStep);
            QCOMPARE(b.timeMs, a.timeMs);
            QCOMPARE(b.stats.replica, a.stats.replica);
            QCOMPARE(b.stats.worker, a.stats.worker);
            QCOMPARE(b.stats.device, a.stats.device);
            QCOMPARE(b.stats.samplesPerSecond, a.stats.samplesPerSecond);
            QCOMPARE(b.stats.computeSeconds, a.stats.computeSeconds);
            QCOMPARE(b.stats.inputWaitSeconds, a.stats.inputWaitSeconds);
            if (i == 4) {
                QVERIFY(std::isnan(b.stats.allReduceSeconds));  // NULL in the table
            } else {
                QCOMPARE(b.stats.allReduceSeconds, a.stats.allReduceSeconds);
            }
        }
        auto after = store->replicaStats(*id, 20);
        QVERIFY(after.ok());
        QCOMPARE(after->size(), size_t(3));
        QCOMPARE(after->front().globalStep, int64_t(30));
        QVERIFY(store->replicaStats(4242)->empty());

        // The same (step, replica) again replaces the row.
        QVERIFY(store->appendReplicaStats(*id, {replicaRow(30, 2, 7.0)}).ok());
        QCOMPARE(store->replicaStats(*id)->size(), size_t(9));
        QCOMPARE(store->replicaStats(*id)->back().stats.samplesPerSecond, 7.0);

        // Export: a third section, one row per step and replica.
        QVERIFY(store->appendSteps(*other, {{10, 0, 10, 5, {{"loss", 0.5}}}}).ok());
        auto csv = store->exportCsv(*other);
        QVERIFY(csv.ok());
        const std::string expected =
            "epoch,seconds\n"
            "\n"
            "global_step,epoch,step,loss\n"
            "10,0,10,0.5\n"
            "\n"
            "global_step,replica,worker,device,samples_per_s,compute_s,all_reduce_s,input_wait_s\n"
            "10,0,0,cpu:0,1,0.01,0.002,0.0005\n";
        QCOMPARE(*csv, expected);
    }

    // EventQueue::waitBatch, how the recorder and the CLI take events: routine events (a step's
    // figures) wait for the timeout, a run's start or end and a close wake it at once; pop() is
    // still woken by every event.
    void waitBatchWakesOnlyForRunEdges() {
        using namespace std::chrono;
        EventBus bus;
        auto q = bus.subscribe();
        auto publishLater = [&](std::vector<Event> events) {
            return std::thread([&bus, events = std::move(events)] {
                std::this_thread::sleep_for(milliseconds(20));
                for (const Event& e : events) bus.publish(e);
            });
        };
        // Two step figures: not delivered before the timeout (the wait's predicate cannot hold).
        std::thread t = publishLater({StepMetrics{.globalStep = 1}, StepMetrics{.globalStep = 2}});
        auto t0 = steady_clock::now();
        std::vector<Event> got = q->waitBatch(milliseconds(400));
        const auto waited = steady_clock::now() - t0;
        t.join();
        QVERIFY2(waited >= milliseconds(395),
                 std::to_string(duration_cast<milliseconds>(waited).count()).c_str());
        for (Event& e : q->drain()) got.push_back(std::move(e));  // a producer late past 400 ms
        QCOMPARE(got.size(), size_t(2));
        QCOMPARE(std::get<StepMetrics>(got[1]).globalStep, int64_t(2));
        // A step, then the run's end: both at once, in order, long before the timeout.
        t = publishLater(
            {StepMetrics{.globalStep = 3}, RunFinished{RunStatus::Completed, "", {}, 1.0}});
        t0 = steady_clock::now();
        got = q->waitBatch(seconds(20));
        t.join();
        QVERIFY(steady_clock::now() - t0 < seconds(10));
        QCOMPARE(got.size(), size_t(2));
        QCOMPARE(std::get<StepMetrics>(got[0]).globalStep, int64_t(3));
        QVERIFY(std::holds_alternative<RunFinished>(got[1]));
        // pop() is woken by a step's figures.
        t = publishLater({StepMetrics{.globalStep = 4}});
        t0 = steady_clock::now();
        std::optional<Event> one = q->pop(seconds(20));
        t.join();
        QVERIFY(steady_clock::now() - t0 < seconds(10));
        QVERIFY(one && std::get<StepMetrics>(*one).globalStep == 4);
        // A close wakes a waiting batch.
        std::thread closer([&bus] {
            std::this_thread::sleep_for(milliseconds(20));
            bus.closeAll();
        });
        t0 = steady_clock::now();
        got = q->waitBatch(seconds(20));
        closer.join();
        QVERIFY(steady_clock::now() - t0 < seconds(10));
        QVERIFY(got.empty() && q->closed());
    }

    void recorderWritesReplicas() {
        const std::string path = newPath();
        auto store = openOk(path);
        QVERIFY(store);
        auto id = store->createRun(makeRun("mirrored", 0));
        QVERIFY(id.ok());
        EventBus bus;
        auto rec = RunRecorder::start(path, *id, bus.subscribe());
        QVERIFY2(rec.ok(), rec.ok() ? "" : rec.error().c_str());
        constexpr int64_t kSteps = 200;  // 400 replica rows: more than one batch
        for (int64_t g = 1; g <= kSteps; ++g) {
            StepMetrics s;
            s.step = g;
            s.globalStep = g;
            s.metrics = {{"loss", 1.0}};
            for (int r = 0; r < 2; ++r) {
                ReplicaStats rs;
                rs.replica = r;
                rs.worker = 0;
                rs.device = "cpu:" + std::to_string(r);
                rs.samplesPerSecond = 1000.0 * double(g) + r;
                rs.computeSeconds = 0.02 + 0.01 * r;
                rs.allReduceSeconds = 0.003;
                rs.inputWaitSeconds = 0.001 * r;
                s.replicas.push_back(rs);
            }
            bus.publish(s);
        }
        bus.publish(StepMetrics{.globalStep = kSteps + 1});  // no replicas: no rows
        bus.publish(RunFinished{RunStatus::Completed, "", {}, 1.0});
        bus.closeAll();
        (*rec)->join();
        QVERIFY(!(*rec)->lastError().has_value());

        auto rows = store->replicaStats(*id);
        QVERIFY(rows.ok());
        QCOMPARE(rows->size(), size_t(2 * kSteps));
        const ReplicaRow& r = (*rows)[2 * 6 + 1];  // step 7, replica 1
        QCOMPARE(r.globalStep, int64_t(7));
        QCOMPARE(r.stats.replica, 1);
        QCOMPARE(r.stats.device, std::string("cpu:1"));
        QCOMPARE(r.stats.samplesPerSecond, 7001.0);
        QCOMPARE(r.stats.computeSeconds, 0.03);
        QCOMPARE(r.stats.allReduceSeconds, 0.003);
        QCOMPARE(r.stats.inputWaitSeconds, 0.001);
        QVERIFY(r.timeMs > 0);
        QCOMPARE(store->steps(*id)->size(), size_t(kSteps + 1));
        QCOMPARE(store->getRun(*id)->status, std::string("completed"));
    }

    void errorsNameTheCall() {
        const std::string path = newPath();
        auto store = openOk(path);
        QVERIFY(store);
        auto id = store->createRun(makeRun("r", 1));
        QVERIFY(id.ok());
        {
            RawDb raw(path);
            raw.exec("DROP TABLE steps");
        }
        auto st = store->appendSteps(*id, {{1, 0, 1, 5, {{"loss", 1.0}}}});
        QVERIFY(!st.ok());
        QVERIFY2(
            st.error().rfind(path + ": sqlite3_prepare_v2(INSERT OR REPLACE INTO steps", 0) == 0,
            st.error().c_str());
        QVERIFY2(st.error().find("no such table: steps") != std::string::npos, st.error().c_str());
        // The failed append rolled back: the store still works.
        QVERIFY(store->appendLogs(*id, {{1, "info", "still fine"}}).ok());
    }

    void recorderWritesEvents() {
        const std::string path = newPath();
        auto store = openOk(path);
        QVERIFY(store);
        RunRecord run = makeRun("recorded", 0);
        run.devices.clear();
        run.params = 0;
        auto id = store->createRun(run);
        QVERIFY(id.ok());

        EventBus bus;
        auto rec = RunRecorder::start(path, *id, bus.subscribe());
        QVERIFY2(rec.ok(), rec.ok() ? "" : rec.error().c_str());
        RunStarted started;
        started.runId = *id;
        started.devices = {"cpu:0", "cpu:1"};
        started.params = 4242;
        bus.publish(started);
        for (int64_t g = 1; g <= 600; ++g) {  // more than one batch
            StepMetrics s;
            s.epoch = int((g - 1) / 300);
            s.step = (g - 1) % 300 + 1;
            s.globalStep = g;
            s.metrics = {{"loss", 1.0 / double(g)}, {"accuracy", 0.001 * double(g)}};
            s.learningRate = 0.01;
            s.lossScale = g <= 300 ? 32768.0 : 0.0;
            s.inputWaitSeconds = 0.0015;
            s.computeSeconds = 0.02;
            s.samplesPerSecond = 6400.5;
            bus.publish(s);
        }
        EpochMetrics e;
        e.epoch = 0;
        e.metrics = {{"loss", 0.4}, {"val_accuracy", 0.875}};
        e.seconds = 3.5;
        bus.publish(e);
        bus.publish(DeviceStats{"cpu:0", 0.75, 1 << 20, 3200.25});
        DeviceStats gpu;  // with what NVML reports
        gpu.device = "cuda:0/replica 1";
        gpu.memoryUsedBytes = int64_t(3) << 30;
        gpu.memoryTotalBytes = int64_t(80) << 30;
        gpu.gpuUtilization = 0.875;
        bus.publish(gpu);
        bus.publish(LogLine{LogLine::Level::Warning, "slow input pipeline"});
        bus.publish(
            RunFinished{RunStatus::Completed, "", {{"loss", 0.3}, {"test_accuracy", 0.86}}, 7.0});
        bus.closeAll();
        (*rec)->join();
        QVERIFY(!(*rec)->lastError().has_value());

        auto r = store->getRun(*id);
        QVERIFY(r.ok());
        QCOMPARE(r->status, std::string("completed"));
        QCOMPARE(r->devices, std::string("cpu:0,cpu:1"));
        QCOMPARE(r->params, int64_t(4242));
        QCOMPARE(r->bestValAccuracy, std::optional<double>(0.875));
        QCOMPARE(nlohmann::json::parse(r->finalMetricsJson)["test_accuracy"].get<double>(), 0.86);
        QVERIFY(r->endedAtMs >= r->startedAtMs);

        auto steps = store->steps(*id);
        QVERIFY(steps.ok());
        QCOMPARE(steps->size(), size_t(600));
        const StepRow& s7 = (*steps)[6];
        QCOMPARE(s7.globalStep, int64_t(7));
        QCOMPARE(s7.step, int64_t(7));
        QCOMPARE(s7.metrics.at("loss"), 1.0 / 7.0);
        QCOMPARE(s7.metrics.at("lr"), 0.01);
        QCOMPARE(s7.metrics.at("loss_scale"), 32768.0);
        QCOMPARE(s7.metrics.at("input_wait_s"), 0.0015);
        QCOMPARE(s7.metrics.at("compute_s"), 0.02);
        QCOMPARE(s7.metrics.at("samples_per_s"), 6400.5);
        QVERIFY(s7.timeMs > 0);
        QCOMPARE((*steps)[599].epoch, 1);
        QVERIFY(!(*steps)[599].metrics.count("loss_scale"));  // 0 = loss scaling off

        auto epochs = store->epochs(*id);
        QCOMPARE(epochs->size(), size_t(1));
        QCOMPARE(epochs->front().seconds, 3.5);
        QCOMPARE(epochs->front().metrics.at("val_accuracy"), 0.875);
        auto devs = store->deviceStats(*id);
        QCOMPARE(devs->size(), size_t(2));
        QCOMPARE(devs->front().device, std::string("cpu:0"));
        QCOMPARE(devs->front().memoryBytes, int64_t(1 << 20));
        QCOMPARE(devs->front().samplesPerSecond, 3200.25);
        QCOMPARE(devs->front().memoryUsedBytes, int64_t(-1));  // unknown stays unknown
        QCOMPARE(devs->front().gpuUtilization, -1.0);
        QCOMPARE(devs->back().device, std::string("cuda:0/replica 1"));
        QCOMPARE(devs->back().memoryUsedBytes, int64_t(3) << 30);
        QCOMPARE(devs->back().memoryTotalBytes, int64_t(80) << 30);
        QCOMPARE(devs->back().gpuUtilization, 0.875);
        auto logs = store->logs(*id);
        QCOMPARE(logs->size(), size_t(1));
        QCOMPARE(logs->front().level, std::string("warning"));
        QCOMPARE(logs->front().text, std::string("slow input pipeline"));
    }

    void recorderLiveView() {
        const std::string path = newPath();
        auto writer = openOk(path);
        QVERIFY(writer);
        auto id = writer->createRun(makeRun("live", 0));
        QVERIFY(id.ok());
        auto viewer = openOk(path);  // a second connection, like the GUI beside a CLI trainer
        QVERIFY(viewer);

        EventBus bus;
        auto rec = RunRecorder::start(path, *id, bus.subscribe());
        QVERIFY(rec.ok());
        StepMetrics s;
        s.globalStep = 1;
        s.step = 1;
        s.metrics = {{"loss", 2.5}};
        bus.publish(s);
        // Seen well before the run finishes (the recorder flushes at least every 250 ms).
        QTRY_VERIFY_WITH_TIMEOUT(viewer->steps(*id).ok() && viewer->steps(*id)->size() == 1, 5000);
        QCOMPARE(viewer->getRun(*id)->status, std::string("running"));
        s.globalStep = 2;
        s.step = 2;
        bus.publish(s);
        QTRY_VERIFY_WITH_TIMEOUT(viewer->steps(*id, 1)->size() == 1, 5000);

        bus.publish(RunFinished{RunStatus::Failed, "out of memory", {}, 1.0});
        (*rec)->join();
        QVERIFY(!(*rec)->lastError().has_value());
        auto r = viewer->getRun(*id);
        QCOMPARE(r->status, std::string("failed"));
        QCOMPARE(r->message, std::string("out of memory"));
    }

    void recorderQueueClosedWithoutFinish() {
        const std::string path = newPath();
        auto store = openOk(path);
        QVERIFY(store);
        auto id = store->createRun(makeRun("crashy", 0));
        QVERIFY(id.ok());
        EventBus bus;
        auto rec = RunRecorder::start(path, *id, bus.subscribe());
        QVERIFY(rec.ok());
        bus.publish(LogLine{LogLine::Level::Info, "epoch 1/10"});
        bus.closeAll();
        (*rec)->join();
        auto r = store->getRun(*id);
        QCOMPARE(r->status, std::string("failed"));
        QCOMPARE(r->message, std::string("run ended without a final status"));
        QCOMPARE(store->logs(*id)->size(), size_t(1));  // what came before is kept

        // Destroying a recorder whose run never finished does not hang either.
        auto id2 = store->createRun(makeRun("abandoned", 0));
        EventBus bus2;
        {
            auto rec2 = RunRecorder::start(path, *id2, bus2.subscribe());
            QVERIFY(rec2.ok());
            bus2.publish(LogLine{LogLine::Level::Info, "hello"});
        }
        QCOMPARE(store->getRun(*id2)->status, std::string("failed"));
        QCOMPARE(store->logs(*id2)->size(), size_t(1));
    }

    void recorderErrors() {
        const std::string path = newPath();
        auto store = openOk(path);
        QVERIFY(store);
        EventBus bus;
        auto none = RunRecorder::start(path, 12345, bus.subscribe());
        QVERIFY(!none.ok());
        QVERIFY(none.error().find("12345") != std::string::npos);
        const std::string notDb = dir_.filePath("recorder-not-a-db").toStdString();
        {
            std::ofstream f(notDb);
            f << std::string(2048, 'x');
        }
        auto bad = RunRecorder::start(notDb, 1, bus.subscribe());
        QVERIFY(!bad.ok());
        QVERIFY2(bad.error().find(notDb) != std::string::npos, bad.error().c_str());

        // The run disappears under the recorder: errors are kept, the trainer is not disturbed.
        auto id = store->createRun(makeRun("doomed", 0));
        QVERIFY(id.ok());
        EventBus bus2;
        auto rec = RunRecorder::start(path, *id, bus2.subscribe());
        QVERIFY(rec.ok());
        QVERIFY(store->deleteRun(*id).ok());
        StepMetrics s;
        s.globalStep = 1;
        bus2.publish(s);
        bus2.publish(RunFinished{});
        (*rec)->join();
        auto e = (*rec)->lastError();
        QVERIFY(e.has_value());
        QVERIFY2(e->find("no run with id " + std::to_string(*id)) != std::string::npos, e->c_str());
    }

    // The store fills up part-way (a real SQLITE_FULL through max_page_count): the recorder
    // reports it once, right away, rolls the failed batch back, never blocks its producer, and
    // stores the run as failed; every batch committed before the failure reads back whole.
    void recorderDiskFull() {
        const std::string path = newPath();
        auto store = openOk(path);
        QVERIFY(store);
        auto id = store->createRun(makeRun("filling", 0));
        QVERIFY(id.ok());
        ::setenv("TRAINDECK_FAULT_STORE_PAGES", "12", 1);
        std::mutex mu;
        std::vector<std::string> reported;
        EventBus bus;
        auto queue = bus.subscribe();
        auto rec = RunRecorder::start(path, *id, queue, [&](const std::string& e) {
            std::lock_guard<std::mutex> lock(mu);
            reported.push_back(e);
        });
        ::unsetenv("TRAINDECK_FAULT_STORE_PAGES");
        QVERIFY2(rec.ok(), rec.ok() ? "" : rec.error().c_str());
        auto publishSteps = [&](int64_t from, int64_t to) {
            for (int64_t g = from; g <= to; ++g) {
                StepMetrics m;
                m.globalStep = g;
                m.step = g;
                m.metrics = {{"loss", 1.0 / double(g)}, {"accuracy", 0.5}};
                bus.publish(m);
            }
        };
        auto failed = [&] {
            std::lock_guard<std::mutex> lock(mu);
            return !reported.empty();
        };
        // Batch by batch, each committed before the next, until the pages run out.
        auto reader = openOk(path);
        QVERIFY(reader);
        int64_t last = 0;
        while (!failed() && last < 4000) {
            publishSteps(last + 1, last + 20);
            last += 20;
            QTRY_VERIFY_WITH_TIMEOUT(failed() || reader->steps(*id)->size() == size_t(last), 5000);
        }
        QVERIFY2(failed(), "12 pages took 4000 steps");
        QVERIFY(last > 20);                   // some batches were committed first
        publishSteps(last + 1, last + 2000);  // dropped: the stored run keeps no gaps
        Status written =
            (*rec)->finish(RunFinished{RunStatus::Completed, "", {{"loss", 0.1}}, 2.0});
        QVERIFY(!written.ok());
        QVERIFY2(written.error().find(path) != std::string::npos, written.error().c_str());
        QVERIFY2(written.error().find("database or disk is full") != std::string::npos,
                 written.error().c_str());
        {
            std::lock_guard<std::mutex> lock(mu);
            QCOMPARE(reported.size(), size_t(1));
            QCOMPARE(reported[0], written.error());
        }
        QCOMPARE((*rec)->lastError(), std::optional<std::string>(written.error()));

        // Another connection reads the store: intact, the run failed, its committed steps whole.
        auto run = reader->getRun(*id);
        QVERIFY(run.ok());
        QCOMPARE(run->status, std::string("failed"));
        QVERIFY2(run->message.find("database or disk is full") != std::string::npos,
                 run->message.c_str());
        auto steps = reader->steps(*id);
        QVERIFY(steps.ok());
        // Everything before the batch that did not fit (a group may span two batches).
        QVERIFY2(steps->size() >= size_t(last - 20) && steps->size() < size_t(last),
                 qPrintable(QString::number(steps->size())));
        for (size_t i = 0; i < steps->size(); ++i) {
            QCOMPARE((*steps)[i].globalStep, int64_t(i + 1));
            // loss, accuracy, lr, input_wait_s, compute_s, samples_per_s
            QCOMPARE((*steps)[i].metrics.size(), size_t(6));
        }
        RawDb raw(path);
        QCOMPARE(raw.queryText("PRAGMA integrity_check"), std::string("ok"));
        // With room again, the same store takes new runs.
        auto next = reader->createRun(makeRun("after", 0));
        QVERIFY(next.ok());
        QVERIFY(reader->appendLogs(*next, {{1, "info", "fine again"}}).ok());
    }

    // A store that cannot be written right now (here: another connection holds the write lock
    // past the busy timeout) still opens for reading; interrupted runs are marked later.
    void opensForReadingWhenNotWritable() {
        const std::string path = newPath();
        {
            auto store = openOk(path);
            QVERIFY(store);
            RunRecord r = makeRun("orphan", 0);
            r.pid = deadPid();
            r.host = hostName();
            QVERIFY(store->createRun(r).ok());
        }
        {
            RawDb locker(path);
            locker.exec("BEGIN IMMEDIATE");
            auto reader = RunStore::open(path);
            QVERIFY2(reader.ok(), reader.ok() ? "" : reader.error().c_str());
            auto runs = (*reader)->listRuns();
            QVERIFY(runs.ok());
            QCOMPARE(runs->size(), size_t(1));
            QCOMPARE(runs->front().status, std::string("running"));  // could not be marked yet
            locker.exec("ROLLBACK");
        }
        auto later = openOk(path);
        QVERIFY(later);
        QCOMPARE(later->listRuns()->front().status, std::string("interrupted"));
    }

    void faultHookRefusesBadValues() {
        ::setenv("TRAINDECK_FAULT_STORE_PAGES", "lots", 1);
        auto s = RunStore::open(newPath());
        ::unsetenv("TRAINDECK_FAULT_STORE_PAGES");
        QVERIFY(!s.ok());
        QVERIFY2(s.error().find("TRAINDECK_FAULT_STORE_PAGES") != std::string::npos,
                 s.error().c_str());
    }
};

QTEST_GUILESS_MAIN(TestStore)
#include "test_store.moc"
