// SQLite run store. Every sqlite3 call that returns a status goes through TD_SQLITE, which turns a
// failure into an error naming the database path, the call, the statement and sqlite3_errmsg.
#include "engine/store/run_store.h"

#include <signal.h>
#include <sqlite3.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <system_error>
#include <utility>

#include "engine/core/json_text.h"
#include "engine/core/text_limits.h"

namespace td {
namespace {

// --- schema
// ---------------------------------------------------------------------------------------
// Migrations are applied in order; migration i takes the schema from user_version i to i + 1.
// Never edit a migration that has shipped: add a new one.
constexpr const char* kMigrations[] = {
    // 0 -> 1: initial schema.
    R"sql(
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    project_json TEXT NOT NULL DEFAULT '',
    config_json TEXT NOT NULL DEFAULT '{}',
    status TEXT NOT NULL DEFAULT 'running',
    started_at_ms INTEGER NOT NULL,
    ended_at_ms INTEGER NOT NULL DEFAULT 0,
    host TEXT NOT NULL DEFAULT '',
    pid INTEGER NOT NULL DEFAULT 0,
    devices TEXT NOT NULL DEFAULT '',
    model_name TEXT NOT NULL DEFAULT '',
    params INTEGER NOT NULL DEFAULT 0,
    final_metrics_json TEXT NOT NULL DEFAULT '{}',
    message TEXT NOT NULL DEFAULT '',
    notes TEXT NOT NULL DEFAULT ''
);
CREATE INDEX runs_started ON runs(started_at_ms);
CREATE TABLE steps (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    global_step INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    step INTEGER NOT NULL,
    time_ms INTEGER NOT NULL,
    name TEXT NOT NULL,
    value REAL,
    PRIMARY KEY (run_id, global_step, name)
) WITHOUT ROWID;
CREATE TABLE epochs (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    epoch INTEGER NOT NULL,
    time_ms INTEGER NOT NULL,
    seconds REAL NOT NULL DEFAULT 0,
    metrics_json TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, epoch)
) WITHOUT ROWID;
CREATE TABLE device_stats (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    time_ms INTEGER NOT NULL,
    device TEXT NOT NULL,
    utilization REAL,
    memory_bytes INTEGER NOT NULL DEFAULT 0,
    samples_per_s REAL
);
CREATE INDEX device_stats_run ON device_stats(run_id, id);
CREATE TABLE logs (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    time_ms INTEGER NOT NULL,
    level TEXT NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX logs_run ON logs(run_id, id);
)sql",
    // 1 -> 2: last-activity time per run (a viewer can tell a stalled run from a live one), filled
    // in from the rows already stored; index for finding runs by name.
    R"sql(
ALTER TABLE runs ADD COLUMN updated_at_ms INTEGER NOT NULL DEFAULT 0;
UPDATE runs SET updated_at_ms = MAX(started_at_ms, ended_at_ms,
    COALESCE((SELECT MAX(time_ms) FROM steps WHERE run_id = runs.id), 0),
    COALESCE((SELECT MAX(time_ms) FROM epochs WHERE run_id = runs.id), 0),
    COALESCE((SELECT MAX(time_ms) FROM device_stats WHERE run_id = runs.id), 0),
    COALESCE((SELECT MAX(time_ms) FROM logs WHERE run_id = runs.id), 0));
CREATE INDEX runs_name ON runs(name, started_at_ms);
)sql",
    // 2 -> 3: per-replica figures of each logged step (StepMetrics::replicas); older runs have
    // none. The project documents move out of the runs rows into run_documents: a run's row stays
    // small, so the updates a run makes to it (append times, the final status) rewrite it in its
    // page instead of reallocating overflow pages, which a full disk may no longer have.
    R"sql(
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
)sql",
    // 3 -> 4: the checkpoint files each run has (engine/train/checkpoint.h), registered after the
    // rows of the steps before them; older runs have none.
    R"sql(
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
)sql",
    // 4 -> 5: what the GPU reports of itself (NVML) with each device row: memory used and total,
    // utilisation 0..1. NULL where unknown (CPUs, no NVML, and every row of older runs).
    R"sql(
ALTER TABLE device_stats ADD COLUMN gpu_memory_used_bytes INTEGER;
ALTER TABLE device_stats ADD COLUMN gpu_memory_total_bytes INTEGER;
ALTER TABLE device_stats ADD COLUMN gpu_utilization REAL;
)sql",
    // 5 -> 6: the store's identity, written into every checkpoint of its runs, and the highest run
    // id it has given out, so a deleted run's id is never given to a new run. Checkpoint paths
    // become relative to the store's folder (relocateCheckpoints, run after this).
    R"sql(
CREATE TABLE store_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
INSERT INTO store_meta (key, value) VALUES ('store_id', lower(hex(randomblob(16))));
INSERT INTO store_meta (key, value) VALUES ('last_run_id', (SELECT COALESCE(MAX(id), 0) FROM runs));
)sql",
    // 6 -> 7: how long a run stood stopped between its sessions (stopped or interrupted, then
    // resumed: reopenRun adds each gap), so its duration counts the time it trained. Older runs
    // were never credited a gap: 0.
    R"sql(
ALTER TABLE runs ADD COLUMN idle_ms INTEGER NOT NULL DEFAULT 0;
)sql",
};
// The oldest schema a read-only store can be read with (its queries name no newer column or
// table); older stores must be opened writable once, to be brought up to date.
constexpr int kOldestReadOnlySchema = 5;
constexpr int kSchemaVersion = static_cast<int>(std::size(kMigrations));

constexpr int kBusyTimeoutMs = 5000;

// Validation accuracy metric names, in order of preference, for RunRecord::bestValAccuracy.
constexpr const char* kBestValAccuracySql = R"sql(COALESCE(
    (SELECT MAX(json_extract(e.metrics_json, '$.val_accuracy')) FROM epochs e WHERE e.run_id = r.id),
    (SELECT MAX(json_extract(e.metrics_json, '$.val_sparse_categorical_accuracy')) FROM epochs e
        WHERE e.run_id = r.id),
    (SELECT MAX(json_extract(e.metrics_json, '$.val_categorical_accuracy')) FROM epochs e
        WHERE e.run_id = r.id),
    (SELECT MAX(json_extract(e.metrics_json, '$.val_binary_accuracy')) FROM epochs e
        WHERE e.run_id = r.id)))sql";

// --- helpers
// --------------------------------------------------------------------------------------

int64_t nowMs() {
    using namespace std::chrono;
    return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

std::string hostName() {
    char buf[256] = {};
    if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
    return buf;
}

// True unless the process certainly does not exist on this host.
bool pidAlive(int64_t pid) {
    if (pid <= 0 || pid > std::numeric_limits<pid_t>::max()) return false;
    if (kill(static_cast<pid_t>(pid), 0) == 0) return true;
    return errno != ESRCH;  // EPERM: alive, owned by someone else
}

// A statement for an error message: whitespace collapsed, cut after a few words.
std::string shortSql(std::string_view sql) {
    std::string out;
    bool space = false;
    for (char c : sql) {
        if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
            space = !out.empty();
            continue;
        }
        if (space) out += ' ';
        space = false;
        out += c;
        if (out.size() >= 40) {
            out += "...";
            break;
        }
    }
    return out;
}

Error noRun(int64_t runId, const std::string& path) {
    return err("no run with id " + std::to_string(runId) + " in " + path);
}

bool sqlOk(int rc) {
    return rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE;
}

// "runs.db: sqlite3_prepare_v2(INSERT INTO steps ...): no such table: steps"
Error sqlError(sqlite3* db, const std::string& path, int rc, const char* call,
               std::string_view what) {
    std::string msg = path + ": " + call;
    if (!what.empty()) {
        msg += '(';
        msg += shortSql(what);
        msg += ')';
    }
    const char* text = nullptr;
    if (db && sqlite3_errcode(db) != SQLITE_OK) text = sqlite3_errmsg(db);
    msg += ": ";
    msg += text ? text : sqlite3_errstr(rc);
    if ((rc & 0xff) == SQLITE_READONLY)
        msg +=
            " (the run store is read-only: its runs can be listed, shown, compared and "
            "exported, but nothing can be written to it)";
    return err(std::move(msg));
}

Status sqlCheck(sqlite3* db, const std::string& path, int rc, const char* call,
                std::string_view what) {
    if (sqlOk(rc)) return {};
    return sqlError(db, path, rc, call, what);
}

// TD_SQLITE(db, path, what, sqlite3_fn, args...): calls sqlite3_fn(args...) and returns a Status
// naming the call (and `what`, usually the statement) when it fails.
#define TD_SQLITE(db, path, what, fn, ...) sqlCheck((db), (path), fn(__VA_ARGS__), #fn, (what))

class Stmt {
  public:
    static Result<Stmt> prepare(sqlite3* db, const std::string& path, std::string_view sql) {
        sqlite3_stmt* s = nullptr;
        Status st = TD_SQLITE(db, path, sql, sqlite3_prepare_v2, db, sql.data(),
                              static_cast<int>(sql.size()), &s, nullptr);
        if (!st.ok()) {
            (void)sqlite3_finalize(s);  // s is null on failure; finalize(null) is a no-op
            return std::move(st).takeError();
        }
        return Stmt(db, path, s, sql);
    }
    Stmt(Stmt&& o) noexcept
        : db_(o.db_), path_(o.path_), s_(std::exchange(o.s_, nullptr)), sql_(o.sql_) {}
    Stmt& operator=(Stmt&&) = delete;
    Stmt(const Stmt&) = delete;
    ~Stmt() {
        // Its status repeats the last sqlite3_step error, which was already reported.
        (void)sqlite3_finalize(s_);
    }

    Status bindInt(int i, int64_t v) {
        return TD_SQLITE(db_, path_, sql_, sqlite3_bind_int64, s_, i,
                         static_cast<sqlite3_int64>(v));
    }
    // NaN is stored as NULL and read back as NaN.
    Status bindDouble(int i, double v) {
        if (std::isnan(v)) return TD_SQLITE(db_, path_, sql_, sqlite3_bind_null, s_, i);
        return TD_SQLITE(db_, path_, sql_, sqlite3_bind_double, s_, i, v);
    }
    // A negative value (unknown) is stored as NULL.
    Status bindOptInt(int i, int64_t v) {
        if (v < 0) return TD_SQLITE(db_, path_, sql_, sqlite3_bind_null, s_, i);
        return bindInt(i, v);
    }
    Status bindText(int i, std::string_view v) {
        return TD_SQLITE(db_, path_, sql_, sqlite3_bind_text, s_, i, v.data(),
                         static_cast<int>(v.size()), SQLITE_TRANSIENT);
    }

    // true: a row is ready; false: done.
    Result<bool> step() {
        int rc = sqlite3_step(s_);
        if (rc == SQLITE_ROW) return true;
        if (rc == SQLITE_DONE) return false;
        return sqlError(db_, path_, rc, "sqlite3_step", sql_);
    }
    // Runs a statement that returns no rows, then resets it for the next bindings.
    Status run() {
        TD_ASSIGN_OR_RETURN(bool row, step());
        (void)row;
        return reset();
    }
    Status reset() {
        TD_RETURN_IF_ERROR(TD_SQLITE(db_, path_, sql_, sqlite3_reset, s_));
        return TD_SQLITE(db_, path_, sql_, sqlite3_clear_bindings, s_);
    }

    int64_t colInt(int c) const { return sqlite3_column_int64(s_, c); }
    double colDouble(int c) const {
        if (sqlite3_column_type(s_, c) == SQLITE_NULL)
            return std::numeric_limits<double>::quiet_NaN();
        return sqlite3_column_double(s_, c);
    }
    std::optional<int64_t> colOptInt(int c) const {
        if (sqlite3_column_type(s_, c) == SQLITE_NULL) return std::nullopt;
        return sqlite3_column_int64(s_, c);
    }
    std::optional<double> colOptDouble(int c) const {
        if (sqlite3_column_type(s_, c) == SQLITE_NULL) return std::nullopt;
        return sqlite3_column_double(s_, c);
    }
    std::string colText(int c) const {
        const unsigned char* t = sqlite3_column_text(s_, c);
        if (!t) return {};
        return std::string(reinterpret_cast<const char*>(t),
                           static_cast<size_t>(sqlite3_column_bytes(s_, c)));
    }

  private:
    Stmt(sqlite3* db, const std::string& path, sqlite3_stmt* s, std::string_view sql)
        : db_(db), path_(path), s_(s), sql_(sql) {}
    sqlite3* db_;
    const std::string& path_;
    sqlite3_stmt* s_;
    std::string_view sql_;  // statements are string literals
};

Status exec(sqlite3* db, const std::string& path, const char* sql) {
    return TD_SQLITE(db, path, sql, sqlite3_exec, db, sql, nullptr, nullptr, nullptr);
}

// BEGIN IMMEDIATE ... COMMIT; rolls back when destroyed uncommitted.
class Transaction {
  public:
    static Result<Transaction> begin(sqlite3* db, const std::string& path) {
        TD_RETURN_IF_ERROR(exec(db, path, "BEGIN IMMEDIATE"));
        return Transaction(db, path);
    }
    Transaction(Transaction&& o) noexcept : db_(std::exchange(o.db_, nullptr)), path_(o.path_) {}
    Transaction& operator=(Transaction&&) = delete;
    ~Transaction() {
        // Best effort: the error that made us roll back is the one reported.
        if (db_) (void)sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    }
    Status commit() {
        sqlite3* db = std::exchange(db_, nullptr);
        Status st = exec(db, path_, "COMMIT");
        if (!st.ok()) (void)sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
        return st;
    }

  private:
    Transaction(sqlite3* db, const std::string& path) : db_(db), path_(path) {}
    sqlite3* db_;
    const std::string& path_;
};

Result<int64_t> queryInt(sqlite3* db, const std::string& path, const char* sql) {
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db, path, sql));
    TD_ASSIGN_OR_RETURN(bool row, s.step());
    if (!row) return err(path + ": " + shortSql(sql) + " returned no row");
    return s.colInt(0);
}

std::string metricsToJson(const MetricMap& m) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : m) {
        if (std::isfinite(v)) {
            j[k] = v;
        } else if (std::isnan(v)) {
            j[k] = nullptr;
        } else {
            j[k] = v > 0 ? "inf" : "-inf";
        }
    }
    return j.dump();
}

Result<MetricMap> metricsFromJson(const std::string& path, const std::string& text,
                                  std::string_view what) {
    MetricMap m;
    if (text.empty()) return m;
    if (const JsonTextProblem p = jsonTextProblem(text))
        return err(path + ": " + std::string(what) + ": " + describeJsonTextProblem(p));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return err(path + ": " + std::string(what) + ": not a JSON object");
    for (const auto& [k, v] : j.items()) {
        if (v.is_number()) {
            m[k] = v.get<double>();
        } else if (v.is_null()) {
            m[k] = std::numeric_limits<double>::quiet_NaN();
        } else if (v.is_string() && (v == "inf" || v == "-inf")) {
            m[k] = v == "inf" ? std::numeric_limits<double>::infinity()
                              : -std::numeric_limits<double>::infinity();
        } else {
            return err(path + ": " + std::string(what) + ": metric '" + k + "' is not a number");
        }
    }
    return m;
}

bool validStatus(const std::string& s) {
    for (RunStatus st : {RunStatus::Running, RunStatus::Completed, RunStatus::Stopped,
                         RunStatus::Failed, RunStatus::Interrupted})
        if (s == runStatusName(st)) return true;
    return false;
}

// Marks the run as written now; errors when it does not exist. Call inside a transaction.
Status touchRun(sqlite3* db, const std::string& path, int64_t runId, int64_t timeMs) {
    static constexpr const char* kSql =
        "UPDATE runs SET updated_at_ms = MAX(updated_at_ms, ?1) WHERE id = ?2";
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db, path, kSql));
    TD_RETURN_IF_ERROR(s.bindInt(1, timeMs));
    TD_RETURN_IF_ERROR(s.bindInt(2, runId));
    TD_RETURN_IF_ERROR(s.run());
    if (sqlite3_changes(db) == 0) return noRun(runId, path);
    return {};
}

constexpr const char* kRunSelect =
    "SELECT r.id, r.name, COALESCE(d.project_json, ''), COALESCE(d.config_json, '{}'), r.status, "
    "r.started_at_ms, "
    "r.ended_at_ms, r.host, r.pid, r.devices, r.model_name, r.params, r.final_metrics_json, "
    "r.message, r.notes, r.updated_at_ms, ";
// idle_ms, or 0 in a read-only store from before schema 7 (it has no such column).
const char* idleColumn(int schema) {
    return schema >= 7 ? "r.idle_ms, " : "0, ";
}

RunRecord readRun(const Stmt& s) {
    RunRecord r;
    r.id = s.colInt(0);
    r.name = s.colText(1);
    r.projectJson = s.colText(2);
    r.configJson = s.colText(3);
    r.status = s.colText(4);
    r.startedAtMs = s.colInt(5);
    r.endedAtMs = s.colInt(6);
    r.host = s.colText(7);
    r.pid = s.colInt(8);
    r.devices = s.colText(9);
    r.modelName = s.colText(10);
    r.params = s.colInt(11);
    r.finalMetricsJson = s.colText(12);
    r.message = s.colText(13);
    r.notes = s.colText(14);
    r.updatedAtMs = s.colInt(15);
    r.idleMs = s.colInt(16);
    r.bestValAccuracy = s.colOptDouble(17);
    return r;
}

Result<std::vector<RunRecord>> selectRuns(sqlite3* db, const std::string& path, int schema,
                                          const std::string& where, const std::string& param,
                                          int64_t intParam, bool useInt) {
    const std::string sql = std::string(kRunSelect) + idleColumn(schema) + kBestValAccuracySql +
                            " FROM runs r LEFT JOIN run_documents d ON d.run_id = r.id " + where +
                            " ORDER BY r.started_at_ms DESC, r.id DESC";
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db, path, sql));
    if (where.find("?1") != std::string::npos) {
        if (useInt) {
            TD_RETURN_IF_ERROR(s.bindInt(1, intParam));
        } else {
            TD_RETURN_IF_ERROR(s.bindText(1, param));
        }
    }
    std::vector<RunRecord> out;
    for (;;) {
        TD_ASSIGN_OR_RETURN(bool row, s.step());
        if (!row) break;
        out.push_back(readRun(s));
    }
    return out;
}

Result<RunRecord> selectRunById(sqlite3* db, const std::string& path, int schema, int64_t id) {
    TD_ASSIGN_OR_RETURN(auto runs, selectRuns(db, path, schema, "WHERE r.id = ?1", {}, id, true));
    if (runs.empty()) return noRun(id, path);
    return std::move(runs.front());
}

Result<std::vector<StepRow>> selectSteps(sqlite3* db, const std::string& path, int64_t runId,
                                         int64_t afterGlobalStep) {
    static constexpr const char* kSql =
        "SELECT global_step, epoch, step, time_ms, name, value FROM steps "
        "WHERE run_id = ?1 AND global_step > ?2 ORDER BY global_step, name";
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db, path, kSql));
    TD_RETURN_IF_ERROR(s.bindInt(1, runId));
    TD_RETURN_IF_ERROR(s.bindInt(2, afterGlobalStep));
    std::vector<StepRow> out;
    for (;;) {
        TD_ASSIGN_OR_RETURN(bool row, s.step());
        if (!row) break;
        const int64_t g = s.colInt(0);
        if (out.empty() || out.back().globalStep != g) {
            StepRow r;
            r.globalStep = g;
            r.epoch = static_cast<int>(s.colInt(1));
            r.step = s.colInt(2);
            r.timeMs = s.colInt(3);
            out.push_back(std::move(r));
        }
        out.back().metrics[s.colText(4)] = s.colDouble(5);
    }
    return out;
}

Result<std::vector<EpochRow>> selectEpochs(sqlite3* db, const std::string& path, int64_t runId) {
    static constexpr const char* kSql =
        "SELECT epoch, time_ms, seconds, metrics_json FROM epochs WHERE run_id = ?1 ORDER BY epoch";
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db, path, kSql));
    TD_RETURN_IF_ERROR(s.bindInt(1, runId));
    std::vector<EpochRow> out;
    for (;;) {
        TD_ASSIGN_OR_RETURN(bool row, s.step());
        if (!row) break;
        EpochRow r;
        r.epoch = static_cast<int>(s.colInt(0));
        r.timeMs = s.colInt(1);
        r.seconds = s.colDouble(2);
        TD_ASSIGN_OR_RETURN(r.metrics, metricsFromJson(path, s.colText(3),
                                                       "run " + std::to_string(runId) + " epoch " +
                                                           std::to_string(r.epoch)));
        out.push_back(std::move(r));
    }
    return out;
}

Result<std::vector<ReplicaRow>> selectReplicaStats(sqlite3* db, const std::string& path,
                                                   int64_t runId, int64_t afterGlobalStep) {
    static constexpr const char* kSql =
        "SELECT global_step, replica, worker, device, time_ms, samples_per_s, compute_s, "
        "all_reduce_s, input_wait_s FROM replica_stats WHERE run_id = ?1 AND global_step > ?2 "
        "ORDER BY global_step, replica";
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db, path, kSql));
    TD_RETURN_IF_ERROR(s.bindInt(1, runId));
    TD_RETURN_IF_ERROR(s.bindInt(2, afterGlobalStep));
    std::vector<ReplicaRow> out;
    for (;;) {
        TD_ASSIGN_OR_RETURN(bool row, s.step());
        if (!row) break;
        ReplicaRow r;
        r.globalStep = s.colInt(0);
        r.stats.replica = static_cast<int>(s.colInt(1));
        r.stats.worker = static_cast<int>(s.colInt(2));
        r.stats.device = s.colText(3);
        r.timeMs = s.colInt(4);
        r.stats.samplesPerSecond = s.colDouble(5);
        r.stats.computeSeconds = s.colDouble(6);
        r.stats.allReduceSeconds = s.colDouble(7);
        r.stats.inputWaitSeconds = s.colDouble(8);
        out.push_back(std::move(r));
    }
    return out;
}

std::string csvField(const std::string& s) {
    if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
    std::string out = "\"";
    for (char c : s) {
        if (c == '"') out += '"';
        out += c;
    }
    return out + "\"";
}

std::string csvNumber(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}

// One transaction per batch of rows of a run: touch the run's updated_at_ms with the newest row,
// then insert every row with `bind` (which binds parameters 2..; ?1 is the run id).
template <typename Row, typename Bind>
Status appendRunRows(sqlite3* db, const std::string& path, int64_t runId,
                     const std::vector<Row>& rows, const char* sql, Bind bind) {
    TD_ASSIGN_OR_RETURN(Transaction txn, Transaction::begin(db, path));
    int64_t last = 0;
    for (const Row& r : rows) last = std::max(last, r.timeMs);
    TD_RETURN_IF_ERROR(touchRun(db, path, runId, last));
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db, path, sql));
    for (const Row& r : rows) {
        TD_RETURN_IF_ERROR(s.bindInt(1, runId));
        TD_RETURN_IF_ERROR(bind(s, r));
        TD_RETURN_IF_ERROR(s.run());
    }
    return txn.commit();
}

// Inserts (or replaces) per-replica rows; call inside a transaction that touched the run.
Status insertReplicaRows(sqlite3* db, const std::string& path, int64_t runId,
                         const std::vector<ReplicaRow>& rows) {
    if (rows.empty()) return {};
    static constexpr const char* kSql =
        "INSERT OR REPLACE INTO replica_stats (run_id, global_step, replica, worker, device, "
        "time_ms, samples_per_s, compute_s, all_reduce_s, input_wait_s) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db, path, kSql));
    for (const ReplicaRow& r : rows) {
        TD_RETURN_IF_ERROR(s.bindInt(1, runId));
        TD_RETURN_IF_ERROR(s.bindInt(2, r.globalStep));
        TD_RETURN_IF_ERROR(s.bindInt(3, r.stats.replica));
        TD_RETURN_IF_ERROR(s.bindInt(4, r.stats.worker));
        TD_RETURN_IF_ERROR(s.bindText(5, r.stats.device));
        TD_RETURN_IF_ERROR(s.bindInt(6, r.timeMs));
        TD_RETURN_IF_ERROR(s.bindDouble(7, r.stats.samplesPerSecond));
        TD_RETURN_IF_ERROR(s.bindDouble(8, r.stats.computeSeconds));
        TD_RETURN_IF_ERROR(s.bindDouble(9, r.stats.allReduceSeconds));
        TD_RETURN_IF_ERROR(s.bindDouble(10, r.stats.inputWaitSeconds));
        TD_RETURN_IF_ERROR(s.run());
    }
    return {};
}

// The newest report of a surviving worker of a run (RunStore::recordWorkerReport), or "".
Result<std::string> lastWorkerReport(sqlite3* db, const std::string& p, int64_t runId) {
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db, p,
                                              "SELECT text FROM logs WHERE run_id = ?1 AND level = "
                                              "'error' AND text LIKE 'worker rank %' ORDER BY id "
                                              "DESC LIMIT 1"));
    TD_RETURN_IF_ERROR(s.bindInt(1, runId));
    TD_ASSIGN_OR_RETURN(bool row, s.step());
    return row ? s.colText(0) : std::string();
}

// Runs of this host left 'running' by a process that no longer exists were interrupted (with
// what a surviving worker reported, if one did).
Status markInterruptedRuns(sqlite3* db, const std::string& p) {
    const std::string host = hostName();
    std::vector<std::pair<int64_t, int64_t>> dead;  // id, pid
    {
        TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db, p,
                                                  "SELECT id, pid FROM runs WHERE status = "
                                                  "'running' AND host = ?1"));
        TD_RETURN_IF_ERROR(s.bindText(1, host));
        for (;;) {
            TD_ASSIGN_OR_RETURN(bool row, s.step());
            if (!row) break;
            if (!pidAlive(s.colInt(1))) dead.emplace_back(s.colInt(0), s.colInt(1));
        }
    }
    if (!dead.empty()) {
        static constexpr const char* kSql =
            "UPDATE runs SET status = 'interrupted', "
            "ended_at_ms = MAX(started_at_ms, updated_at_ms), message = ?1 "
            "WHERE id = ?2 AND status = 'running'";
        TD_ASSIGN_OR_RETURN(Transaction txn, Transaction::begin(db, p));
        TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db, p, kSql));
        for (const auto& [id, pid] : dead) {
            TD_ASSIGN_OR_RETURN(std::string report, lastWorkerReport(db, p, id));
            TD_RETURN_IF_ERROR(s.bindText(1, "process " + std::to_string(pid) + " on " + host +
                                                 " ended without a final status" +
                                                 (report.empty() ? "" : "; " + report)));
            TD_RETURN_IF_ERROR(s.bindInt(2, id));
            TD_RETURN_IF_ERROR(s.run());
        }
        TD_RETURN_IF_ERROR(txn.commit());
    }
    return {};
}

// The folder a store's relative checkpoint paths start from: the store file's folder as the
// path names it ("" for a bare file name, the working folder).
std::filesystem::path storeFolder(const std::string& storePath) {
    return std::filesystem::path(storePath).parent_path();
}

std::filesystem::path absoluteNormal(const std::filesystem::path& p) {
    std::error_code ec;
    std::filesystem::path a = std::filesystem::absolute(p, ec);
    return (ec ? p : a).lexically_normal();
}

// A path for an SQLite URI (file:...?mode=ro): '%', '?' and '#' would end or change it.
std::string uriPath(const std::string& path) {
    std::string out;
    for (char c : absoluteNormal(path).string()) {
        if (c == '%' || c == '?' || c == '#') {
            char buf[4];
            std::snprintf(buf, sizeof buf, "%%%02X", static_cast<unsigned char>(c));
            out += buf;
        } else {
            out += c;
        }
    }
    return out;
}

}  // namespace

// A read-only WAL store whose shared-memory file cannot be created beside it (a read-only folder
// or mount) is opened as immutable: read as it is on disk, which is all of it once its last
// writer has closed it.
Result<sqlite3*> openStoreConnection(const std::string& path, const std::string& readOnlyReason,
                                     bool create) {
    auto attempt = [&](const std::string& name, int flags) -> Result<sqlite3*> {
        sqlite3* db = nullptr;
        const int rc = sqlite3_open_v2(name.c_str(), &db, flags | SQLITE_OPEN_FULLMUTEX, nullptr);
        if (rc != SQLITE_OK) {
            Error e = sqlError(db, path, rc, "sqlite3_open_v2", "");
            (void)sqlite3_close_v2(db);
            return e;
        }
        Status st = TD_SQLITE(db, path, "", sqlite3_busy_timeout, db, kBusyTimeoutMs);
        // A read-only connection learns whether it can read the WAL only at its first read.
        if (st.ok() && !readOnlyReason.empty())
            st = exec(db, path, "SELECT COUNT(*) FROM sqlite_schema");
        if (!st.ok()) {
            (void)sqlite3_close_v2(db);
            return std::move(st).takeError();
        }
        return db;
    };
    if (readOnlyReason.empty())
        return attempt(path, SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0));
    const int ro = SQLITE_OPEN_READONLY | SQLITE_OPEN_URI;
    auto db = attempt("file:" + uriPath(path) + "?mode=ro", ro);
    if (db.ok()) return db;
    auto immutable = attempt("file:" + uriPath(path) + "?immutable=1", ro);
    if (immutable.ok()) return immutable;
    return err(db.error() + " (the run store is read-only: " + readOnlyReason + ")");
}

namespace {

Result<std::string> readStoreId(sqlite3* db, const std::string& p) {
    TD_ASSIGN_OR_RETURN(int64_t tables,
                        queryInt(db, p,
                                 "SELECT COUNT(*) FROM sqlite_schema WHERE type = 'table' AND "
                                 "name = 'store_meta'"));
    if (tables == 0) return std::string();  // a read-only store of schema 5
    TD_ASSIGN_OR_RETURN(
        Stmt s, Stmt::prepare(db, p, "SELECT value FROM store_meta WHERE key = 'store_id'"));
    TD_ASSIGN_OR_RETURN(bool row, s.step());
    return row ? s.colText(0) : std::string();
}

// Schema 5 -> 6: every registered checkpoint file that is found (at its path as stored, which was
// relative to the folder the command ran in, or in the store folder's shared checkpoints/run-<id>/)
// is linked, or copied where links are impossible, into the store's own folder for the run
// (runCheckpointDir), and its row then names it relative to the store's folder. Files are never
// moved or deleted: another store in the same folder may name the same file, and the readers check
// each checkpoint's identity (its run and model) before using it. A row whose file is not found
// keeps its path.
Status relocateCheckpoints(sqlite3* db, const std::string& p) {
    namespace fs = std::filesystem;
    struct Row {
        int64_t runId;
        std::string path;
    };
    std::vector<Row> rows;
    {
        TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db, p, "SELECT run_id, path FROM checkpoints"));
        for (;;) {
            TD_ASSIGN_OR_RETURN(bool row, s.step());
            if (!row) break;
            rows.push_back({s.colInt(0), s.colText(1)});
        }
    }
    TD_ASSIGN_OR_RETURN(Stmt upd,
                        Stmt::prepare(db, p,
                                      "UPDATE OR REPLACE checkpoints SET path = ?3 WHERE run_id "
                                      "= ?1 AND path = ?2"));
    const fs::path folder = storeFolder(p);
    for (const Row& r : rows) {
        const fs::path stored(r.path);
        const fs::path legacyDir = (folder.empty() ? fs::path(".") : folder) / "checkpoints" /
                                   ("run-" + std::to_string(r.runId));
        std::vector<fs::path> candidates = {stored, folder / stored, legacyDir / stored.filename()};
        std::error_code ec;
        fs::path found;
        for (const fs::path& c : candidates)
            if (!c.empty() && fs::is_regular_file(c, ec)) {
                found = c;
                break;
            }
        if (found.empty()) continue;
        fs::path target = found;
        if (absoluteNormal(found).parent_path() == absoluteNormal(legacyDir)) {
            const fs::path dir = runCheckpointDir(p, r.runId);
            target = dir / found.filename();
            fs::create_directories(dir, ec);
            if (!fs::exists(target, ec)) {
                fs::create_hard_link(found, target, ec);
                if (ec) fs::copy_file(found, target, ec);
                if (ec) target = found;  // it stays where it is, named as it is found
            }
        }
        TD_RETURN_IF_ERROR(upd.bindInt(1, r.runId));
        TD_RETURN_IF_ERROR(upd.bindText(2, r.path));
        TD_RETURN_IF_ERROR(upd.bindText(3, storedCheckpointPath(p, target.string())));
        TD_RETURN_IF_ERROR(upd.run());
    }
    return {};
}

// Test hook: TRAINDECK_FAULT_STORE_PAGES=N lets this connection grow the database by at most N
// pages (SQLite's max_page_count), so a write past that fails with SQLITE_FULL exactly as on a
// full disk, rolling back its transaction. Lets tests fail a run's writes part-way without root.
Status applyFaultInjection(sqlite3* db, const std::string& p) {
    const char* env = std::getenv("TRAINDECK_FAULT_STORE_PAGES");
    if (!env || !*env) return {};
    char* end = nullptr;
    const long long extra = std::strtoll(env, &end, 10);
    if (*end != '\0' || extra < 0)
        return err("TRAINDECK_FAULT_STORE_PAGES: expected a page count >= 0, got '" +
                   std::string(env) + "'");
    TD_ASSIGN_OR_RETURN(int64_t pages, queryInt(db, p, "PRAGMA page_count"));
    const std::string sql = "PRAGMA max_page_count = " + std::to_string(pages + extra);
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db, p, sql));
    TD_ASSIGN_OR_RETURN(bool row, s.step());
    (void)row;
    return {};
}

}  // namespace

// --- RunStore
// -------------------------------------------------------------------------------------

int RunStore::schemaVersion() {
    return kSchemaVersion;
}

std::string storeReadOnlyReason(const std::string& path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return {};  // created writable, or not at all
    if (::access(path.c_str(), W_OK) != 0)
        return errno == EROFS ? "it is on a read-only file system" : "the file is not writable";
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    const std::string dir = parent.empty() ? std::string(".") : parent.string();
    // SQLite writes its journal and shared-memory index beside the database.
    if (::access(dir.c_str(), W_OK) != 0)
        return errno == EROFS ? "it is on a read-only file system"
                              : "its folder " + dir + " is not writable";
    return {};
}

std::string runCheckpointDir(const std::string& storePath, int64_t runId) {
    const std::filesystem::path store(storePath);
    const std::filesystem::path dir = store.has_parent_path() ? store.parent_path() : ".";
    return (dir / "checkpoints" / store.filename() / ("run-" + std::to_string(runId))).string();
}

std::string storedCheckpointPath(const std::string& storePath, const std::string& file) {
    const std::filesystem::path abs = absoluteNormal(file);
    const std::filesystem::path folder = storeFolder(storePath);
    const std::filesystem::path rel =
        abs.lexically_relative(absoluteNormal(folder.empty() ? "." : folder));
    if (!rel.empty() && *rel.begin() != ".." && rel.is_relative()) return rel.string();
    return abs.string();
}

std::string resolvedCheckpointPath(const std::string& storePath, const std::string& stored) {
    const std::filesystem::path s(stored);
    if (s.is_absolute()) return stored;
    return (storeFolder(storePath) / s).string();
}

Result<std::unique_ptr<RunStore>> RunStore::open(const std::string& path) {
    if (path.empty()) return err("run store: empty database path");
    std::unique_ptr<RunStore> store(new RunStore());
    store->path_ = path;
    const std::string& p = store->path_;

    // SQLite says only "unable to open database file" for a directory.
    if (std::error_code ec; std::filesystem::is_directory(path, ec))
        return err(path + ": is a directory, expected a SQLite database file");

    store->readOnlyReason_ = storeReadOnlyReason(path);
    if (store->readOnlyReason_.empty()) {
        const std::filesystem::path parent = std::filesystem::path(path).parent_path();
        if (!parent.empty()) {
            std::error_code ec;
            std::filesystem::create_directories(parent, ec);
            if (ec)
                return err(path + ": cannot create directory " + parent.string() + ": " +
                           ec.message());
        }
    }
    TD_ASSIGN_OR_RETURN(store->db_, openStoreConnection(path, store->readOnlyReason_, true));
    sqlite3* db = store->db_;

    // Read before writing anything: a file that is not a database fails here, untouched.
    TD_ASSIGN_OR_RETURN(int64_t version, queryInt(db, p, "PRAGMA user_version"));
    if (version < 0)
        return err(path + ": invalid database schema version " + std::to_string(version));
    if (version > kSchemaVersion)
        return err(path + ": database schema version " + std::to_string(version) +
                   " is newer than this TrainDeck supports (" + std::to_string(kSchemaVersion) +
                   "); use a newer TrainDeck to open it");

    if (store->readOnly()) {
        if (version < kOldestReadOnlySchema)
            return err(path + ": the run store is read-only (" + store->readOnlyReason_ +
                       ") and was written by an older TrainDeck (schema " +
                       std::to_string(version) +
                       "): open it once where it can be written, to "
                       "bring it up to date");
        TD_ASSIGN_OR_RETURN(store->storeId_, readStoreId(db, p));
        store->schema_ = static_cast<int>(version);
        return store;
    }

    {
        // WAL lets viewers read while a trainer writes. Where WAL is impossible (some network
        // file systems) SQLite keeps the old journal mode, which still works, one at a time.
        TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db, p, "PRAGMA journal_mode=WAL"));
        TD_ASSIGN_OR_RETURN(bool row, s.step());
        (void)row;
    }
    TD_RETURN_IF_ERROR(exec(db, p, "PRAGMA synchronous=NORMAL"));
    TD_RETURN_IF_ERROR(exec(db, p, "PRAGMA foreign_keys=ON"));

    if (version < kSchemaVersion) {
        TD_ASSIGN_OR_RETURN(Transaction txn, Transaction::begin(db, p));
        // Another process may have migrated it while we waited for the write lock.
        TD_ASSIGN_OR_RETURN(version, queryInt(db, p, "PRAGMA user_version"));
        if (version > kSchemaVersion)
            return err(path + ": database schema version " + std::to_string(version) +
                       " is newer than this TrainDeck supports (" + std::to_string(kSchemaVersion) +
                       ")");
        for (int64_t v = version; v < kSchemaVersion; ++v) {
            Status ms = exec(db, p, kMigrations[v]);
            if (!ms.ok())
                return err(path + ": schema migration " + std::to_string(v) + " -> " +
                           std::to_string(v + 1) + " failed: " + ms.error());
        }
        // Stores from before schema 6 kept checkpoint paths relative to the folder a command ran
        // in, and shared one checkpoint folder with every other store beside them.
        if (version < 6) TD_RETURN_IF_ERROR(relocateCheckpoints(db, p));
        const std::string setVersion = "PRAGMA user_version = " + std::to_string(kSchemaVersion);
        TD_RETURN_IF_ERROR(exec(db, p, setVersion.c_str()));
        TD_RETURN_IF_ERROR(txn.commit());
    }
    store->schema_ = kSchemaVersion;
    TD_ASSIGN_OR_RETURN(store->storeId_, readStoreId(db, p));

    // Runs of this host left 'running' by a process that no longer exists were interrupted.
    // Housekeeping only: a store that cannot be written now (a full disk, a read-only file, a
    // writer holding the lock) still opens, so its runs can be read, and a later open marks them.
    (void)markInterruptedRuns(db, p);

    TD_RETURN_IF_ERROR(applyFaultInjection(db, p));
    return store;
}

RunStore::~RunStore() {
    // close_v2 defers the close until every statement is finalized; ours always are.
    if (db_) (void)sqlite3_close_v2(db_);
}

Result<int64_t> RunStore::createRun(const RunRecord& run) {
    if (std::string e = textProblem(run.name, TextKind::Name); !e.empty())
        return err("run name: " + e);
    std::lock_guard<std::mutex> lock(mu_);
    if (!validStatus(run.status))
        return err(path_ + ": createRun: invalid run status '" + run.status + "'");
    // Ids are never given out twice, not even a deleted run's: a run's checkpoints (in
    // runCheckpointDir, and the run id inside each) can then never be taken for another run's.
    static constexpr const char* kSql =
        "INSERT INTO runs (id, name, status, started_at_ms, ended_at_ms, host, pid, devices, "
        "model_name, params, final_metrics_json, message, notes, updated_at_ms) "
        "VALUES (MAX(COALESCE((SELECT MAX(id) FROM runs), 0), "
        "COALESCE((SELECT CAST(value AS INTEGER) FROM store_meta WHERE key = 'last_run_id'), 0)) "
        "+ 1, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)";
    static constexpr const char* kLastIdSql =
        "INSERT OR REPLACE INTO store_meta (key, value) VALUES ('last_run_id', ?1)";
    static constexpr const char* kDocumentsSql =
        "INSERT INTO run_documents (run_id, project_json, config_json) VALUES (?1, ?2, ?3)";
    const int64_t started = run.startedAtMs > 0 ? run.startedAtMs : nowMs();
    TD_ASSIGN_OR_RETURN(Transaction txn, Transaction::begin(db_, path_));
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db_, path_, kSql));
    TD_RETURN_IF_ERROR(s.bindText(1, run.name));
    TD_RETURN_IF_ERROR(s.bindText(2, run.status));
    TD_RETURN_IF_ERROR(s.bindInt(3, started));
    TD_RETURN_IF_ERROR(s.bindInt(4, run.endedAtMs));
    TD_RETURN_IF_ERROR(s.bindText(5, run.host.empty() ? hostName() : run.host));
    TD_RETURN_IF_ERROR(s.bindInt(6, run.pid != 0 ? run.pid : static_cast<int64_t>(getpid())));
    TD_RETURN_IF_ERROR(s.bindText(7, run.devices));
    TD_RETURN_IF_ERROR(s.bindText(8, run.modelName));
    TD_RETURN_IF_ERROR(s.bindInt(9, run.params));
    TD_RETURN_IF_ERROR(s.bindText(10, run.finalMetricsJson.empty() ? "{}" : run.finalMetricsJson));
    TD_RETURN_IF_ERROR(s.bindText(11, run.message));
    TD_RETURN_IF_ERROR(s.bindText(12, run.notes));
    TD_RETURN_IF_ERROR(s.bindInt(13, std::max({started, run.endedAtMs, run.updatedAtMs})));
    TD_RETURN_IF_ERROR(s.run());
    const auto id = static_cast<int64_t>(sqlite3_last_insert_rowid(db_));
    TD_ASSIGN_OR_RETURN(Stmt last, Stmt::prepare(db_, path_, kLastIdSql));
    TD_RETURN_IF_ERROR(last.bindText(1, std::to_string(id)));
    TD_RETURN_IF_ERROR(last.run());
    TD_ASSIGN_OR_RETURN(Stmt d, Stmt::prepare(db_, path_, kDocumentsSql));
    TD_RETURN_IF_ERROR(d.bindInt(1, id));
    TD_RETURN_IF_ERROR(d.bindText(2, run.projectJson));
    TD_RETURN_IF_ERROR(d.bindText(3, run.configJson.empty() ? "{}" : run.configJson));
    TD_RETURN_IF_ERROR(d.run());
    TD_RETURN_IF_ERROR(txn.commit());
    return id;
}

Status RunStore::finishRun(int64_t runId, RunStatus status, const MetricMap& finalMetrics,
                           const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    static constexpr const char* kSql =
        "UPDATE runs SET status = ?1, ended_at_ms = ?2, updated_at_ms = MAX(updated_at_ms, ?2), "
        "final_metrics_json = ?3, message = ?4 WHERE id = ?5";
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db_, path_, kSql));
    TD_RETURN_IF_ERROR(s.bindText(1, runStatusName(status)));
    TD_RETURN_IF_ERROR(s.bindInt(2, status == RunStatus::Running ? 0 : nowMs()));
    TD_RETURN_IF_ERROR(s.bindText(3, metricsToJson(finalMetrics)));
    TD_RETURN_IF_ERROR(s.bindText(4, message));
    TD_RETURN_IF_ERROR(s.bindInt(5, runId));
    TD_RETURN_IF_ERROR(s.run());
    if (sqlite3_changes(db_) == 0) return noRun(runId, path_);
    return {};
}

Status RunStore::appendSteps(int64_t runId, const std::vector<StepRow>& rows,
                             const std::vector<ReplicaRow>& replicas) {
    if (rows.empty() && replicas.empty()) return {};
    std::lock_guard<std::mutex> lock(mu_);
    static constexpr const char* kSql =
        "INSERT OR REPLACE INTO steps (run_id, global_step, epoch, step, time_ms, name, value) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
    TD_ASSIGN_OR_RETURN(Transaction txn, Transaction::begin(db_, path_));
    int64_t last = 0;
    for (const StepRow& r : rows) last = std::max(last, r.timeMs);
    for (const ReplicaRow& r : replicas) last = std::max(last, r.timeMs);
    TD_RETURN_IF_ERROR(touchRun(db_, path_, runId, last));
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db_, path_, kSql));
    for (const StepRow& r : rows) {
        for (const auto& [name, value] : r.metrics) {
            TD_RETURN_IF_ERROR(s.bindInt(1, runId));
            TD_RETURN_IF_ERROR(s.bindInt(2, r.globalStep));
            TD_RETURN_IF_ERROR(s.bindInt(3, r.epoch));
            TD_RETURN_IF_ERROR(s.bindInt(4, r.step));
            TD_RETURN_IF_ERROR(s.bindInt(5, r.timeMs));
            TD_RETURN_IF_ERROR(s.bindText(6, name));
            TD_RETURN_IF_ERROR(s.bindDouble(7, value));
            TD_RETURN_IF_ERROR(s.run());
        }
    }
    TD_RETURN_IF_ERROR(insertReplicaRows(db_, path_, runId, replicas));
    return txn.commit();
}

Status RunStore::appendEpochs(int64_t runId, const std::vector<EpochRow>& rows) {
    if (rows.empty()) return {};
    std::lock_guard<std::mutex> lock(mu_);
    static constexpr const char* kSql =
        "INSERT OR REPLACE INTO epochs (run_id, epoch, time_ms, seconds, metrics_json) "
        "VALUES (?1, ?2, ?3, ?4, ?5)";
    return appendRunRows(db_, path_, runId, rows, kSql, [](Stmt& s, const EpochRow& r) -> Status {
        TD_RETURN_IF_ERROR(s.bindInt(2, r.epoch));
        TD_RETURN_IF_ERROR(s.bindInt(3, r.timeMs));
        TD_RETURN_IF_ERROR(s.bindDouble(4, r.seconds));
        return s.bindText(5, metricsToJson(r.metrics));
    });
}

Status RunStore::appendDeviceStats(int64_t runId, const std::vector<DeviceRow>& rows) {
    if (rows.empty()) return {};
    std::lock_guard<std::mutex> lock(mu_);
    static constexpr const char* kSql =
        "INSERT INTO device_stats (run_id, time_ms, device, utilization, memory_bytes, "
        "samples_per_s, gpu_memory_used_bytes, gpu_memory_total_bytes, gpu_utilization) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";
    return appendRunRows(db_, path_, runId, rows, kSql, [](Stmt& s, const DeviceRow& r) -> Status {
        TD_RETURN_IF_ERROR(s.bindInt(2, r.timeMs));
        TD_RETURN_IF_ERROR(s.bindText(3, r.device));
        TD_RETURN_IF_ERROR(s.bindDouble(4, r.utilization));
        TD_RETURN_IF_ERROR(s.bindInt(5, r.memoryBytes));
        TD_RETURN_IF_ERROR(s.bindDouble(6, r.samplesPerSecond));
        // Unknown (-1) is NULL.
        TD_RETURN_IF_ERROR(s.bindOptInt(7, r.memoryUsedBytes));
        TD_RETURN_IF_ERROR(s.bindOptInt(8, r.memoryTotalBytes));
        return s.bindDouble(
            9, r.gpuUtilization < 0 ? std::numeric_limits<double>::quiet_NaN() : r.gpuUtilization);
    });
}

Status RunStore::appendReplicaStats(int64_t runId, const std::vector<ReplicaRow>& rows) {
    if (rows.empty()) return {};
    std::lock_guard<std::mutex> lock(mu_);
    TD_ASSIGN_OR_RETURN(Transaction txn, Transaction::begin(db_, path_));
    int64_t last = 0;
    for (const ReplicaRow& r : rows) last = std::max(last, r.timeMs);
    TD_RETURN_IF_ERROR(touchRun(db_, path_, runId, last));
    TD_RETURN_IF_ERROR(insertReplicaRows(db_, path_, runId, rows));
    return txn.commit();
}

Status RunStore::appendLogs(int64_t runId, const std::vector<LogRow>& rows) {
    if (rows.empty()) return {};
    std::lock_guard<std::mutex> lock(mu_);
    static constexpr const char* kSql =
        "INSERT INTO logs (run_id, time_ms, level, text) VALUES (?1, ?2, ?3, ?4)";
    return appendRunRows(db_, path_, runId, rows, kSql, [](Stmt& s, const LogRow& r) -> Status {
        TD_RETURN_IF_ERROR(s.bindInt(2, r.timeMs));
        TD_RETURN_IF_ERROR(s.bindText(3, r.level));
        return s.bindText(4, r.text);
    });
}

Status RunStore::recordWorkerReport(int64_t runId, int rank, const std::string& message) {
    LogRow row;
    row.timeMs = nowMs();
    row.level = "error";
    row.text = "worker rank " + std::to_string(rank) + " reported: " + message;
    TD_RETURN_IF_ERROR(appendLogs(runId, {row}));
    std::lock_guard<std::mutex> lock(mu_);
    TD_RETURN_IF_ERROR(markInterruptedRuns(db_, path_));
    // Opening the store may already have marked it, before the report was there.
    static constexpr const char* kSql =
        "UPDATE runs SET message = message || '; ' || ?1 WHERE id = ?2 AND status = "
        "'interrupted' AND message LIKE '% ended without a final status'";
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db_, path_, kSql));
    TD_RETURN_IF_ERROR(s.bindText(1, row.text));
    TD_RETURN_IF_ERROR(s.bindInt(2, runId));
    return s.run();
}

Status RunStore::updateRunInfo(int64_t runId, const std::string& devices, int64_t params) {
    std::lock_guard<std::mutex> lock(mu_);
    static constexpr const char* kSql =
        "UPDATE runs SET devices = CASE WHEN ?1 = '' THEN devices ELSE ?1 END, "
        "params = CASE WHEN ?2 = 0 THEN params ELSE ?2 END, "
        "updated_at_ms = MAX(updated_at_ms, ?3) WHERE id = ?4";
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db_, path_, kSql));
    TD_RETURN_IF_ERROR(s.bindText(1, devices));
    TD_RETURN_IF_ERROR(s.bindInt(2, params));
    TD_RETURN_IF_ERROR(s.bindInt(3, nowMs()));
    TD_RETURN_IF_ERROR(s.bindInt(4, runId));
    TD_RETURN_IF_ERROR(s.run());
    if (sqlite3_changes(db_) == 0) return noRun(runId, path_);
    return {};
}

Status RunStore::reopenRun(int64_t runId, int64_t pid, const std::string& host) {
    std::lock_guard<std::mutex> lock(mu_);
    static constexpr const char* kSql =
        "UPDATE runs SET status = 'running', ended_at_ms = 0, pid = ?1, host = ?2, message = '', "
        "idle_ms = idle_ms + MAX(0, ?3 - CASE WHEN ended_at_ms > 0 THEN ended_at_ms "
        "ELSE updated_at_ms END), updated_at_ms = MAX(updated_at_ms, ?3) WHERE id = ?4";
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db_, path_, kSql));
    TD_RETURN_IF_ERROR(s.bindInt(1, pid != 0 ? pid : static_cast<int64_t>(getpid())));
    TD_RETURN_IF_ERROR(s.bindText(2, host.empty() ? hostName() : host));
    TD_RETURN_IF_ERROR(s.bindInt(3, nowMs()));
    TD_RETURN_IF_ERROR(s.bindInt(4, runId));
    TD_RETURN_IF_ERROR(s.run());
    if (sqlite3_changes(db_) == 0) return noRun(runId, path_);
    return {};
}

Status RunStore::addCheckpoints(int64_t runId, const std::vector<CheckpointRow>& rows,
                                const std::vector<std::string>& forget) {
    if (rows.empty() && forget.empty()) return {};
    std::lock_guard<std::mutex> lock(mu_);
    static constexpr const char* kSql =
        "INSERT OR REPLACE INTO checkpoints (run_id, path, kind, global_step, epoch, step, "
        "monitor_value, bytes, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";
    static constexpr const char* kForgetSql =
        "DELETE FROM checkpoints WHERE run_id = ?1 AND path = ?2";
    TD_ASSIGN_OR_RETURN(Transaction txn, Transaction::begin(db_, path_));
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db_, path_, kSql));
    for (const CheckpointRow& r : rows) {
        TD_RETURN_IF_ERROR(s.bindInt(1, runId));
        TD_RETURN_IF_ERROR(s.bindText(2, storedCheckpointPath(path_, r.path)));
        TD_RETURN_IF_ERROR(s.bindText(3, r.kind));
        TD_RETURN_IF_ERROR(s.bindInt(4, r.globalStep));
        TD_RETURN_IF_ERROR(s.bindInt(5, r.epoch));
        TD_RETURN_IF_ERROR(s.bindInt(6, r.stepInEpoch));
        TD_RETURN_IF_ERROR(r.monitorValue ? s.bindDouble(7, *r.monitorValue)
                                          : s.bindDouble(7, std::nan("")));
        TD_RETURN_IF_ERROR(s.bindInt(8, r.bytes));
        TD_RETURN_IF_ERROR(s.bindInt(9, r.createdAtMs > 0 ? r.createdAtMs : nowMs()));
        TD_RETURN_IF_ERROR(s.run());
    }
    TD_ASSIGN_OR_RETURN(Stmt f, Stmt::prepare(db_, path_, kForgetSql));
    for (const std::string& path : forget) {
        TD_RETURN_IF_ERROR(f.bindInt(1, runId));
        TD_RETURN_IF_ERROR(f.bindText(2, storedCheckpointPath(path_, path)));
        TD_RETURN_IF_ERROR(f.run());
    }
    return txn.commit();
}

Result<std::vector<CheckpointRow>> RunStore::checkpoints(int64_t runId) {
    std::lock_guard<std::mutex> lock(mu_);
    static constexpr const char* kSql =
        "SELECT path, kind, global_step, epoch, step, monitor_value, bytes, created_at_ms "
        "FROM checkpoints WHERE run_id = ?1 ORDER BY global_step DESC, created_at_ms DESC, path";
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db_, path_, kSql));
    TD_RETURN_IF_ERROR(s.bindInt(1, runId));
    std::vector<CheckpointRow> out;
    for (;;) {
        TD_ASSIGN_OR_RETURN(bool row, s.step());
        if (!row) break;
        CheckpointRow r;
        r.path = resolvedCheckpointPath(path_, s.colText(0));
        r.kind = s.colText(1);
        r.globalStep = s.colInt(2);
        r.epoch = static_cast<int>(s.colInt(3));
        r.stepInEpoch = s.colInt(4);
        r.monitorValue = s.colOptDouble(5);
        r.bytes = s.colInt(6);
        r.createdAtMs = s.colInt(7);
        out.push_back(std::move(r));
    }
    return out;
}

Result<std::vector<RunRecord>> RunStore::listRuns() {
    std::lock_guard<std::mutex> lock(mu_);
    return selectRuns(db_, path_, schema_, "", {}, 0, false);
}

Result<RunRecord> RunStore::findRun(const std::string& idOrName) {
    std::lock_guard<std::mutex> lock(mu_);
    const bool digits =
        !idOrName.empty() && idOrName.size() <= 18 &&
        std::all_of(idOrName.begin(), idOrName.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) {
        TD_ASSIGN_OR_RETURN(auto byId, selectRuns(db_, path_, schema_, "WHERE r.id = ?1", {},
                                                  std::stoll(idOrName), true));
        if (!byId.empty()) return std::move(byId.front());
    }
    // Newest first, so the first match is the newest run with that name.
    TD_ASSIGN_OR_RETURN(auto byName,
                        selectRuns(db_, path_, schema_, "WHERE r.name = ?1", idOrName, 0, false));
    if (!byName.empty()) return std::move(byName.front());
    return err("no run '" + idOrName + "' in " + path_);
}

Result<RunRecord> RunStore::getRun(int64_t runId) {
    std::lock_guard<std::mutex> lock(mu_);
    return selectRunById(db_, path_, schema_, runId);
}

Result<std::vector<StepRow>> RunStore::steps(int64_t runId, int64_t afterGlobalStep) {
    std::lock_guard<std::mutex> lock(mu_);
    return selectSteps(db_, path_, runId, afterGlobalStep);
}

Result<std::vector<EpochRow>> RunStore::epochs(int64_t runId) {
    std::lock_guard<std::mutex> lock(mu_);
    return selectEpochs(db_, path_, runId);
}

Result<std::vector<DeviceRow>> RunStore::deviceStats(int64_t runId) {
    std::lock_guard<std::mutex> lock(mu_);
    static constexpr const char* kSql =
        "SELECT time_ms, device, utilization, memory_bytes, samples_per_s, "
        "gpu_memory_used_bytes, gpu_memory_total_bytes, gpu_utilization FROM device_stats "
        "WHERE run_id = ?1 ORDER BY id";
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db_, path_, kSql));
    TD_RETURN_IF_ERROR(s.bindInt(1, runId));
    std::vector<DeviceRow> out;
    for (;;) {
        TD_ASSIGN_OR_RETURN(bool row, s.step());
        if (!row) break;
        DeviceRow r;
        r.timeMs = s.colInt(0);
        r.device = s.colText(1);
        r.utilization = s.colDouble(2);
        r.memoryBytes = s.colInt(3);
        r.samplesPerSecond = s.colDouble(4);
        r.memoryUsedBytes = s.colOptInt(5).value_or(-1);
        r.memoryTotalBytes = s.colOptInt(6).value_or(-1);
        r.gpuUtilization = s.colOptDouble(7).value_or(-1);
        out.push_back(std::move(r));
    }
    return out;
}

Result<std::vector<ReplicaRow>> RunStore::replicaStats(int64_t runId, int64_t afterGlobalStep) {
    std::lock_guard<std::mutex> lock(mu_);
    return selectReplicaStats(db_, path_, runId, afterGlobalStep);
}

Result<std::vector<LogRow>> RunStore::logs(int64_t runId) {
    std::lock_guard<std::mutex> lock(mu_);
    static constexpr const char* kSql =
        "SELECT time_ms, level, text FROM logs WHERE run_id = ?1 ORDER BY id";
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db_, path_, kSql));
    TD_RETURN_IF_ERROR(s.bindInt(1, runId));
    std::vector<LogRow> out;
    for (;;) {
        TD_ASSIGN_OR_RETURN(bool row, s.step());
        if (!row) break;
        out.push_back(LogRow{s.colInt(0), s.colText(1), s.colText(2)});
    }
    return out;
}

Status RunStore::renameRun(int64_t runId, const std::string& name) {
    if (std::string e = textProblem(name, TextKind::Name); !e.empty()) return err("run name: " + e);
    std::lock_guard<std::mutex> lock(mu_);
    static constexpr const char* kSql = "UPDATE runs SET name = ?1 WHERE id = ?2";
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db_, path_, kSql));
    TD_RETURN_IF_ERROR(s.bindText(1, name));
    TD_RETURN_IF_ERROR(s.bindInt(2, runId));
    TD_RETURN_IF_ERROR(s.run());
    if (sqlite3_changes(db_) == 0) return noRun(runId, path_);
    return {};
}

Status RunStore::setNotes(int64_t runId, const std::string& notes) {
    if (std::string e = textProblem(notes, TextKind::LongText); !e.empty())
        return err("notes: " + e);
    std::lock_guard<std::mutex> lock(mu_);
    static constexpr const char* kSql = "UPDATE runs SET notes = ?1 WHERE id = ?2";
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db_, path_, kSql));
    TD_RETURN_IF_ERROR(s.bindText(1, notes));
    TD_RETURN_IF_ERROR(s.bindInt(2, runId));
    TD_RETURN_IF_ERROR(s.run());
    if (sqlite3_changes(db_) == 0) return noRun(runId, path_);
    return {};
}

Status RunStore::deleteRun(int64_t runId) {
    std::lock_guard<std::mutex> lock(mu_);
    // The child tables cascade (foreign_keys=ON); deleting them explicitly as well keeps a
    // database opened elsewhere without foreign keys from leaving orphans behind.
    static constexpr const char* kChildren[] = {
        "DELETE FROM steps WHERE run_id = ?1",
        "DELETE FROM epochs WHERE run_id = ?1",
        "DELETE FROM device_stats WHERE run_id = ?1",
        "DELETE FROM replica_stats WHERE run_id = ?1",
        "DELETE FROM run_documents WHERE run_id = ?1",
        "DELETE FROM logs WHERE run_id = ?1",
        "DELETE FROM checkpoints WHERE run_id = ?1",
    };
    TD_ASSIGN_OR_RETURN(Transaction txn, Transaction::begin(db_, path_));
    for (const char* sql : kChildren) {
        TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db_, path_, sql));
        TD_RETURN_IF_ERROR(s.bindInt(1, runId));
        TD_RETURN_IF_ERROR(s.run());
    }
    TD_ASSIGN_OR_RETURN(Stmt s, Stmt::prepare(db_, path_, "DELETE FROM runs WHERE id = ?1"));
    TD_RETURN_IF_ERROR(s.bindInt(1, runId));
    TD_RETURN_IF_ERROR(s.run());
    if (sqlite3_changes(db_) == 0) return noRun(runId, path_);
    return txn.commit();
}

Result<std::string> RunStore::exportCsv(int64_t runId) {
    std::lock_guard<std::mutex> lock(mu_);
    TD_RETURN_IF_ERROR(selectRunById(db_, path_, schema_, runId));
    TD_ASSIGN_OR_RETURN(auto epochRows, selectEpochs(db_, path_, runId));
    TD_ASSIGN_OR_RETURN(auto stepRows, selectSteps(db_, path_, runId, 0));
    TD_ASSIGN_OR_RETURN(auto replicaRows, selectReplicaStats(db_, path_, runId, 0));

    auto writeCells = [](std::string& out, const std::set<std::string>& names, const MetricMap& m) {
        for (const std::string& n : names) {
            out += ',';
            auto it = m.find(n);
            if (it != m.end()) out += csvNumber(it->second);
        }
        out += '\n';
    };

    std::string out;
    std::set<std::string> names;
    for (const auto& e : epochRows)
        for (const auto& kv : e.metrics) names.insert(kv.first);
    out += "epoch,seconds";
    for (const auto& n : names) {
        out += ',';
        out += csvField(n);
    }
    out += '\n';
    for (const auto& e : epochRows) {
        out += std::to_string(e.epoch) + "," + csvNumber(e.seconds);
        writeCells(out, names, e.metrics);
    }

    out += '\n';
    names.clear();
    for (const auto& s : stepRows)
        for (const auto& kv : s.metrics) names.insert(kv.first);
    out += "global_step,epoch,step";
    for (const auto& n : names) {
        out += ',';
        out += csvField(n);
    }
    out += '\n';
    for (const auto& s : stepRows) {
        out += std::to_string(s.globalStep) + "," + std::to_string(s.epoch) + "," +
               std::to_string(s.step);
        writeCells(out, names, s.metrics);
    }

    if (!replicaRows.empty()) {
        out +=
            "\nglobal_step,replica,worker,device,samples_per_s,compute_s,all_reduce_s,"
            "input_wait_s\n";
        for (const ReplicaRow& r : replicaRows) {
            const ReplicaStats& st = r.stats;
            out += std::to_string(r.globalStep) + "," + std::to_string(st.replica) + "," +
                   std::to_string(st.worker) + "," + csvField(st.device) + "," +
                   csvNumber(st.samplesPerSecond) + "," + csvNumber(st.computeSeconds) + "," +
                   csvNumber(st.allReduceSeconds) + "," + csvNumber(st.inputWaitSeconds) + "\n";
        }
    }
    return out;
}

}  // namespace td
