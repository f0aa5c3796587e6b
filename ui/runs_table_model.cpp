#include "ui/runs_table_model.h"

#include <QBrush>
#include <QColor>
#include <QDateTime>
#include <QJsonDocument>
#include <QJsonObject>
#include <QJsonValue>
#include <QLocale>
#include <algorithm>
#include <functional>
#include <initializer_list>
#include <iterator>

namespace td::ui {

namespace {

QString duration(int64_t ms) {
    int64_t s = ms / 1000;
    if (s < 60) return QString("%1 s").arg(s);
    if (s < 3600) return QString("%1 min %2 s").arg(s / 60).arg(s % 60);
    return QString("%1 h %2 min").arg(s / 3600).arg((s / 60) % 60);
}

// The time it trained (a resumed run's stopped time not counted).
int64_t durationMs(const td::RunRecord& r) {
    return r.activeMs(QDateTime::currentMSecsSinceEpoch());
}

// What a row shows (its duration also moves while it runs).
bool sameRow(const td::RunRecord& a, const td::RunRecord& b) {
    return a.status != "running" && a.name == b.name && a.status == b.status &&
           a.startedAtMs == b.startedAtMs && a.endedAtMs == b.endedAtMs && a.idleMs == b.idleMs &&
           a.modelName == b.modelName && a.params == b.params &&
           a.bestValAccuracy == b.bestValAccuracy && a.devices == b.devices && a.notes == b.notes &&
           a.message == b.message && a.finalMetricsJson == b.finalMetricsJson &&
           a.configJson == b.configJson &&
           a.lastEpochSamplesPerSecond == b.lastEpochSamplesPerSecond;
}

// The first of `keys` the metrics hold.
std::optional<double> firstOf(const QJsonObject& metrics, std::initializer_list<const char*> keys) {
    for (const char* k : keys)
        if (const QJsonValue v = metrics.value(QLatin1String(k)); v.isDouble()) return v.toDouble();
    return std::nullopt;
}

QVariant number(const std::optional<double>& v, bool sort, int decimals) {
    if (!v) return sort ? QVariant(-1e300) : QVariant(QString("—"));
    return sort ? QVariant(*v) : QVariant(QString::number(*v, 'f', decimals));
}

// More new rows than this at once are shown by a reset instead of one insertion per row.
constexpr size_t kResetAbove = 256;

}  // namespace

RunsTableModel::RunsTableModel(QObject* parent) : QAbstractTableModel(parent) {}

bool RunsTableModel::shownByDefault(int column) {
    return column != ColModel && column != ColPrecision && column != ColStarted;
}

RunsTableModel::Derived RunsTableModel::derive(const td::RunRecord& r) {
    Derived d;
    const QJsonObject metrics =
        QJsonDocument::fromJson(QByteArray::fromStdString(r.finalMetricsJson)).object();
    d.loss = firstOf(metrics, {"loss"});
    d.accuracy = firstOf(metrics, {"accuracy", "sparse_categorical_accuracy",
                                   "categorical_accuracy", "binary_accuracy"});
    d.testAccuracy = firstOf(metrics, {"test_accuracy", "test_sparse_categorical_accuracy",
                                       "test_categorical_accuracy", "test_binary_accuracy"});
    const QJsonObject config =
        QJsonDocument::fromJson(QByteArray::fromStdString(r.configJson)).object();
    d.precision = config.value("precision").toString();
    d.strategy = config.value("strategy").toString();
    return d;
}

void RunsTableModel::setRuns(std::vector<td::RunRecord> runs) {
    beginResetModel();
    runs_ = std::move(runs);
    reindex();
    endResetModel();
}

void RunsTableModel::reindex() {
    derived_.resize(runs_.size());
    for (size_t i = 0; i < runs_.size(); ++i) derived_[i] = derive(runs_[i]);
    rowOfId_.clear();
    rowOfId_.reserve(runs_.size());
    for (size_t i = 0; i < runs_.size(); ++i) rowOfId_[runs_[i].id] = static_cast<int>(i);
}

void RunsTableModel::removeRows(std::vector<int> rows) {
    if (rows.empty()) return;
    std::sort(rows.begin(), rows.end(), std::greater<>());
    // Contiguous runs of rows go in one signal each, the highest first so indices stay valid.
    size_t i = 0;
    while (i < rows.size()) {
        size_t j = i;
        while (j + 1 < rows.size() && rows[j + 1] == rows[j] - 1) ++j;
        const int first = rows[j], last = rows[i];
        beginRemoveRows({}, first, last);
        runs_.erase(runs_.begin() + first, runs_.begin() + last + 1);
        endRemoveRows();
        i = j + 1;
    }
    reindex();
}

void RunsTableModel::applyChanges(std::vector<td::RunRecord> runs, std::vector<int64_t> removed,
                                  bool full) {
    if (runs_.empty()) {
        if (!runs.empty()) setRuns(std::move(runs));
        return;
    }
    if (full) {
        std::unordered_map<int64_t, bool> present;
        present.reserve(runs.size());
        for (const td::RunRecord& r : runs) present[r.id] = true;
        for (const td::RunRecord& r : runs_)
            if (!present.count(r.id)) removed.push_back(r.id);
    }
    std::vector<int> gone;
    for (int64_t id : removed)
        if (int row = rowOf(id); row >= 0) gone.push_back(row);
    removeRows(std::move(gone));

    std::vector<td::RunRecord> added;
    for (td::RunRecord& r : runs) {
        const int row = rowOf(r.id);
        if (row < 0) {
            added.push_back(std::move(r));
            continue;
        }
        td::RunRecord& mine = runs_[static_cast<size_t>(row)];
        if (sameRow(mine, r)) continue;
        mine = std::move(r);
        derived_[static_cast<size_t>(row)] = derive(mine);
        emit dataChanged(index(row, 0), index(row, ColCount - 1));
    }
    if (added.empty()) return;
    if (added.size() > kResetAbove) {
        beginResetModel();
        for (td::RunRecord& r : added) runs_.push_back(std::move(r));
        reindex();
        endResetModel();
        return;
    }
    const int first = rowCount();
    beginInsertRows({}, first, first + static_cast<int>(added.size()) - 1);
    for (td::RunRecord& r : added) {
        rowOfId_[r.id] = static_cast<int>(runs_.size());
        derived_.push_back(derive(r));
        runs_.push_back(std::move(r));
    }
    endInsertRows();
}

bool RunsTableModel::replaceRun(const td::RunRecord& r) {
    const int row = rowOf(r.id);
    if (row < 0) return false;
    runs_[static_cast<size_t>(row)] = r;
    derived_[static_cast<size_t>(row)] = derive(r);
    emit dataChanged(index(row, 0), index(row, ColCount - 1));
    return true;
}

const td::RunRecord* RunsTableModel::run(int row) const {
    return row >= 0 && row < rowCount() ? &runs_[static_cast<size_t>(row)] : nullptr;
}

const td::RunRecord* RunsTableModel::runById(int64_t id) const {
    return run(rowOf(id));
}

int RunsTableModel::rowOf(int64_t id) const {
    auto it = rowOfId_.find(id);
    return it == rowOfId_.end() ? -1 : it->second;
}

int RunsTableModel::rowCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : static_cast<int>(runs_.size());
}

int RunsTableModel::columnCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : ColCount;
}

QVariant RunsTableModel::data(const QModelIndex& index, int role) const {
    const td::RunRecord* r = run(index.row());
    if (!r) return {};
    const Derived& d = derived_[static_cast<size_t>(index.row())];
    if (role == kIdRole) return static_cast<qlonglong>(r->id);
    if (role == Qt::DisplayRole || role == kSortRole) {
        const bool sort = role == kSortRole;
        switch (index.column()) {
            case ColId:
                return static_cast<qlonglong>(r->id);
            case ColName:
                return QString::fromStdString(r->name);
            case ColStatus:
                return QString::fromStdString(r->status);
            case ColStarted:
                if (sort) return static_cast<qlonglong>(r->startedAtMs);
                return QDateTime::fromMSecsSinceEpoch(r->startedAtMs)
                    .toString("yyyy-MM-dd HH:mm:ss");
            case ColDuration:
                return sort ? QVariant(static_cast<qlonglong>(durationMs(*r)))
                            : QVariant(duration(durationMs(*r)));
            case ColModel:
                return QString::fromStdString(r->modelName);
            case ColParams:
                return sort ? QVariant(static_cast<qlonglong>(r->params))
                            : QVariant(QLocale::c().toString(static_cast<qlonglong>(r->params)));
            case ColLoss:
                return number(d.loss, sort, 4);
            case ColAccuracy:
                return number(d.accuracy, sort, 4);
            case ColBestValAcc:
                return number(r->bestValAccuracy, sort, 4);
            case ColTestAcc:
                return number(d.testAccuracy, sort, 4);
            case ColSamplesPerSec:
                if (!r->lastEpochSamplesPerSecond) return number(std::nullopt, sort, 0);
                return sort
                           ? QVariant(*r->lastEpochSamplesPerSecond)
                           : QVariant(QLocale::c().toString(*r->lastEpochSamplesPerSecond, 'f', 0));
            case ColPrecision:
                return d.precision.isEmpty() ? QString("—") : d.precision;
            case ColStrategy:
                return d.strategy.isEmpty() ? QString("—") : d.strategy;
            case ColDevices:
                return QString::fromStdString(r->devices);
            case ColNotes:
                return QString::fromStdString(r->notes).section('\n', 0, 0);
        }
    } else if (role == Qt::ToolTipRole) {
        QString tip = QString::fromStdString(r->message);
        if (!r->notes.empty())
            tip += (tip.isEmpty() ? "" : "\n\n") + QString::fromStdString(r->notes);
        return tip.isEmpty() ? QVariant() : QVariant(tip);
    } else if (role == Qt::ForegroundRole && index.column() == ColStatus) {
        if (r->status == "running") return QBrush(QColor(0, 110, 200));
        if (r->status == "failed") return QBrush(QColor(176, 0, 32));
        if (r->status == "stopped" || r->status == "interrupted")
            return QBrush(QColor(170, 110, 0));
        return QBrush(QColor(20, 130, 60));
    } else if (role == Qt::TextAlignmentRole) {
        switch (index.column()) {
            case ColId:
            case ColParams:
            case ColDuration:
            case ColLoss:
            case ColAccuracy:
            case ColBestValAcc:
            case ColTestAcc:
            case ColSamplesPerSec:
                return int(Qt::AlignRight | Qt::AlignVCenter);
            default:
                break;
        }
    }
    return {};
}

QVariant RunsTableModel::headerData(int section, Qt::Orientation o, int role) const {
    if (o != Qt::Horizontal || section < 0 || section >= ColCount) return {};
    static const char* names[] = {"ID",        "Name",          "Status",    "Started",
                                  "Duration",  "Model",         "Params",    "Loss",
                                  "Accuracy",  "Best val acc.", "Test acc.", "Samples/s",
                                  "Precision", "Strategy",      "Devices",   "Notes"};
    static_assert(std::size(names) == ColCount);
    static const char* tips[] = {"",
                                 "",
                                 "",
                                 "",
                                 "From start to end (or now, while running)",
                                 "",
                                 "Parameters",
                                 "Final training loss",
                                 "Final training accuracy",
                                 "Best validation accuracy over the epochs",
                                 "Accuracy on the test split after training",
                                 "Samples per second in the last epoch",
                                 "",
                                 "Distribution strategy",
                                 "Devices of the replicas",
                                 "First line of the notes"};
    static_assert(std::size(tips) == ColCount);
    if (role == Qt::DisplayRole) return tr(names[section]);
    if (role == Qt::ToolTipRole && *tips[section]) return tr(tips[section]);
    return {};
}

}  // namespace td::ui
