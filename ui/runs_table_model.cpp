#include "ui/runs_table_model.h"

#include <QBrush>
#include <QColor>
#include <QDateTime>
#include <QLocale>
#include <algorithm>
#include <functional>

namespace td::ui {

namespace {

QString duration(int64_t ms) {
    int64_t s = ms / 1000;
    if (s < 60) return QString("%1 s").arg(s);
    if (s < 3600) return QString("%1 min %2 s").arg(s / 60).arg(s % 60);
    return QString("%1 h %2 min").arg(s / 3600).arg((s / 60) % 60);
}

int64_t durationMs(const td::RunRecord& r) {
    int64_t end = r.endedAtMs > 0 ? r.endedAtMs : QDateTime::currentMSecsSinceEpoch();
    return std::max<int64_t>(0, end - r.startedAtMs);
}

// What a row shows (its duration also moves while it runs).
bool sameRow(const td::RunRecord& a, const td::RunRecord& b) {
    return a.status != "running" && a.name == b.name && a.status == b.status &&
           a.startedAtMs == b.startedAtMs && a.endedAtMs == b.endedAtMs &&
           a.modelName == b.modelName && a.params == b.params &&
           a.bestValAccuracy == b.bestValAccuracy && a.devices == b.devices && a.notes == b.notes &&
           a.message == b.message;
}

// More new rows than this at once are shown by a reset instead of one insertion per row.
constexpr size_t kResetAbove = 256;

}  // namespace

RunsTableModel::RunsTableModel(QObject* parent) : QAbstractTableModel(parent) {}

void RunsTableModel::setRuns(std::vector<td::RunRecord> runs) {
    beginResetModel();
    runs_ = std::move(runs);
    reindex();
    endResetModel();
}

void RunsTableModel::reindex() {
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
        runs_.push_back(std::move(r));
    }
    endInsertRows();
}

bool RunsTableModel::replaceRun(const td::RunRecord& r) {
    const int row = rowOf(r.id);
    if (row < 0) return false;
    runs_[static_cast<size_t>(row)] = r;
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
            case ColBestValAcc:
                if (!r->bestValAccuracy) return sort ? QVariant(-1.0) : QVariant(QString("—"));
                return sort ? QVariant(*r->bestValAccuracy)
                            : QVariant(QString::number(*r->bestValAccuracy, 'f', 4));
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
        if (index.column() == ColId || index.column() == ColParams ||
            index.column() == ColBestValAcc || index.column() == ColDuration)
            return int(Qt::AlignRight | Qt::AlignVCenter);
    }
    return {};
}

QVariant RunsTableModel::headerData(int section, Qt::Orientation o, int role) const {
    if (o != Qt::Horizontal || role != Qt::DisplayRole) return {};
    static const char* names[] = {"ID",    "Name",   "Status",        "Started", "Duration",
                                  "Model", "Params", "Best val acc.", "Devices", "Notes"};
    return section >= 0 && section < ColCount ? tr(names[section]) : QVariant();
}

}  // namespace td::ui
