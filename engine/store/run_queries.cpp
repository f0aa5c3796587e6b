// Read-side queries for polling viewers. Every sqlite3 call that can fail is checked and its error
// names the database path, the call and the statement.
#include "engine/store/run_queries.h"

#include <sqlite3.h>

#include <optional>
#include <string_view>
#include <utility>

#include "engine/store/run_store.h"

namespace td {
namespace {

// The summary columns: the runs row (the project documents, the bulk of a run, are in
// run_documents; of those only the small effective-settings object), and the last epoch's
// samples/s.
// best_val_accuracy follows RunStore's definition (RunRecord::bestValAccuracy).
constexpr const char* kSummarySelect = R"sql(SELECT r.id, r.name, r.status, r.started_at_ms,
    r.ended_at_ms, r.host, r.pid, r.devices, r.model_name, r.params, r.final_metrics_json,
    r.message, r.notes, r.updated_at_ms, COALESCE(
    (SELECT MAX(json_extract(e.metrics_json, '$.val_accuracy')) FROM epochs e WHERE e.run_id = r.id),
    (SELECT MAX(json_extract(e.metrics_json, '$.val_sparse_categorical_accuracy')) FROM epochs e
        WHERE e.run_id = r.id),
    (SELECT MAX(json_extract(e.metrics_json, '$.val_categorical_accuracy')) FROM epochs e
        WHERE e.run_id = r.id),
    (SELECT MAX(json_extract(e.metrics_json, '$.val_binary_accuracy')) FROM epochs e
        WHERE e.run_id = r.id)),
    (SELECT d.config_json FROM run_documents d WHERE d.run_id = r.id),
    (SELECT json_extract(e.metrics_json, '$.samples_per_s') FROM epochs e WHERE e.run_id = r.id
        ORDER BY e.epoch DESC LIMIT 1), )sql";
// The last summary column: idle_ms, or 0 in a read-only store from before schema 7.
std::string summarySelect(int schema) {
    return std::string(kSummarySelect) + (schema >= 7 ? "r.idle_ms" : "0") + " FROM runs r ";
}

Error sqlError(sqlite3* db, const std::string& path, int rc, const char* call,
               std::string_view sql) {
    std::string what(sql.substr(0, 48));
    for (char& c : what)
        if (c == '\n') c = ' ';
    const char* text = db && sqlite3_errcode(db) != SQLITE_OK ? sqlite3_errmsg(db) : nullptr;
    return err(path + ": " + call + "(" + what + (sql.size() > 48 ? "..." : "") +
               "): " + (text ? text : sqlite3_errstr(rc)));
}

// One prepared statement; finalized on destruction.
class Query {
  public:
    static Result<Query> prepare(sqlite3* db, const std::string& path, std::string sql) {
        sqlite3_stmt* s = nullptr;
        const int rc =
            sqlite3_prepare_v2(db, sql.c_str(), static_cast<int>(sql.size()), &s, nullptr);
        if (rc != SQLITE_OK) {
            (void)sqlite3_finalize(s);
            return sqlError(db, path, rc, "sqlite3_prepare_v2", sql);
        }
        return Query(db, path, s, std::move(sql));
    }
    Query(Query&& o) noexcept
        : db_(o.db_), path_(o.path_), s_(std::exchange(o.s_, nullptr)), sql_(std::move(o.sql_)) {}
    Query& operator=(Query&&) = delete;
    Query(const Query&) = delete;
    ~Query() { (void)sqlite3_finalize(s_); }

    Status bindInt(int i, int64_t v) {
        const int rc = sqlite3_bind_int64(s_, i, static_cast<sqlite3_int64>(v));
        if (rc != SQLITE_OK) return sqlError(db_, path_, rc, "sqlite3_bind_int64", sql_);
        return {};
    }
    Result<bool> step() {
        const int rc = sqlite3_step(s_);
        if (rc == SQLITE_ROW) return true;
        if (rc == SQLITE_DONE) return false;
        return sqlError(db_, path_, rc, "sqlite3_step", sql_);
    }
    Status reset() {
        const int rc = sqlite3_reset(s_);
        if (rc != SQLITE_OK) return sqlError(db_, path_, rc, "sqlite3_reset", sql_);
        return {};
    }
    int64_t colInt(int c) const { return sqlite3_column_int64(s_, c); }
    std::string colText(int c) const {
        const unsigned char* t = sqlite3_column_text(s_, c);
        if (!t) return {};
        return std::string(reinterpret_cast<const char*>(t),
                           static_cast<size_t>(sqlite3_column_bytes(s_, c)));
    }
    std::optional<double> colOptDouble(int c) const {
        if (sqlite3_column_type(s_, c) == SQLITE_NULL) return std::nullopt;
        return sqlite3_column_double(s_, c);
    }

  private:
    Query(sqlite3* db, const std::string& path, sqlite3_stmt* s, std::string sql)
        : db_(db), path_(path), s_(s), sql_(std::move(sql)) {}
    sqlite3* db_;
    const std::string& path_;
    sqlite3_stmt* s_;
    std::string sql_;
};

Status exec(sqlite3* db, const std::string& path, const char* sql) {
    const int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return sqlError(db, path, rc, "sqlite3_exec", sql);
    return {};
}

RunRecord readSummary(const Query& q) {
    RunRecord r;
    r.id = q.colInt(0);
    r.name = q.colText(1);
    r.status = q.colText(2);
    r.startedAtMs = q.colInt(3);
    r.endedAtMs = q.colInt(4);
    r.host = q.colText(5);
    r.pid = q.colInt(6);
    r.devices = q.colText(7);
    r.modelName = q.colText(8);
    r.params = q.colInt(9);
    r.finalMetricsJson = q.colText(10);
    r.message = q.colText(11);
    r.notes = q.colText(12);
    r.updatedAtMs = q.colInt(13);
    r.bestValAccuracy = q.colOptDouble(14);
    r.configJson = q.colText(15);
    r.lastEpochSamplesPerSecond = q.colOptDouble(16);
    r.idleMs = q.colInt(17);
    return r;
}

Status readAll(Query& q, std::vector<RunRecord>& out) {
    for (;;) {
        TD_ASSIGN_OR_RETURN(bool row, q.step());
        if (!row) return q.reset();
        out.push_back(readSummary(q));
    }
}

// A read transaction: every query inside sees one snapshot of the database (WAL).
class ReadTransaction {
  public:
    static Result<ReadTransaction> begin(sqlite3* db, const std::string& path) {
        TD_RETURN_IF_ERROR(exec(db, path, "BEGIN"));
        return ReadTransaction(db);
    }
    ReadTransaction(ReadTransaction&& o) noexcept : db_(std::exchange(o.db_, nullptr)) {}
    ReadTransaction& operator=(ReadTransaction&&) = delete;
    ~ReadTransaction() {
        // Nothing was written: ending it can only release the snapshot.
        if (db_) (void)sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
    }

  private:
    explicit ReadTransaction(sqlite3* db) : db_(db) {}
    sqlite3* db_;
};

}  // namespace

Result<std::unique_ptr<RunStoreReader>> RunStoreReader::open(const std::string& path) {
    if (path.empty()) return err("run store: empty database path");
    std::unique_ptr<RunStoreReader> reader(new RunStoreReader());
    reader->path_ = path;
    // Without create: a missing store is an error. Read-write where the store can be written (a
    // reader of a WAL database must be able to map its shared-memory index), else read-only.
    TD_ASSIGN_OR_RETURN(reader->db_, openStoreConnection(path, storeReadOnlyReason(path), false));
    sqlite3* db = reader->db_;
    TD_ASSIGN_OR_RETURN(Query version, Query::prepare(db, path, "PRAGMA user_version"));
    TD_ASSIGN_OR_RETURN(bool row, version.step());
    if (!row || version.colInt(0) < 2)
        return err(path +
                   ": not a TrainDeck run store with a known schema (open it with "
                   "RunStore::open first)");
    reader->schema_ = static_cast<int>(version.colInt(0));
    return reader;
}

RunStoreReader::~RunStoreReader() {
    if (db_) (void)sqlite3_close_v2(db_);
}

Result<RunListSnapshot> RunStoreReader::allRuns(std::optional<int64_t> sinceDataVersion) {
    return snapshot(sinceDataVersion ? &*sinceDataVersion : nullptr, 0, nullptr);
}

Result<RunListSnapshot> RunStoreReader::changedRuns(int64_t sinceDataVersion, int64_t afterId,
                                                    const std::vector<int64_t>& ids) {
    return snapshot(&sinceDataVersion, afterId, &ids);
}

Result<RunListSnapshot> RunStoreReader::snapshot(const int64_t* sinceDataVersion, int64_t afterId,
                                                 const std::vector<int64_t>* ids) {
    RunListSnapshot out;
    TD_ASSIGN_OR_RETURN(ReadTransaction txn, ReadTransaction::begin(db_, path_));
    {
        // First statement of the transaction: the version belongs to the snapshot read below,
        // so a commit that lands later changes it for the next call.
        TD_ASSIGN_OR_RETURN(Query q, Query::prepare(db_, path_, "PRAGMA data_version"));
        TD_ASSIGN_OR_RETURN(bool row, q.step());
        if (!row) return err(path_ + ": PRAGMA data_version returned no row");
        out.dataVersion = q.colInt(0);
    }
    if (sinceDataVersion && *sinceDataVersion == out.dataVersion) {
        out.unchanged = true;
        return out;
    }
    {
        // The rowids of an index on runs: no row (and no project document) is read.
        TD_ASSIGN_OR_RETURN(Query q, Query::prepare(db_, path_,
                                                    "SELECT id FROM runs INDEXED BY runs_started "
                                                    "ORDER BY id"));
        for (;;) {
            TD_ASSIGN_OR_RETURN(bool row, q.step());
            if (!row) break;
            out.runIds.push_back(q.colInt(0));
        }
    }
    if (!ids) {
        TD_ASSIGN_OR_RETURN(Query q,
                            Query::prepare(db_, path_, summarySelect(schema_) + "ORDER BY r.id"));
        TD_RETURN_IF_ERROR(readAll(q, out.runs));
        return out;
    }
    {
        TD_ASSIGN_OR_RETURN(
            Query q,
            Query::prepare(db_, path_, summarySelect(schema_) + "WHERE r.id > ?1 ORDER BY r.id"));
        TD_RETURN_IF_ERROR(q.bindInt(1, afterId));
        TD_RETURN_IF_ERROR(readAll(q, out.runs));
    }
    if (!ids->empty()) {
        TD_ASSIGN_OR_RETURN(Query q,
                            Query::prepare(db_, path_, summarySelect(schema_) + "WHERE r.id = ?1"));
        for (int64_t id : *ids) {
            if (id > afterId) continue;  // read above
            TD_RETURN_IF_ERROR(q.bindInt(1, id));
            TD_RETURN_IF_ERROR(readAll(q, out.runs));
        }
    }
    return out;
}

}  // namespace td
