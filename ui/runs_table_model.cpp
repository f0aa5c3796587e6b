#include "ui/runs_table_model.h"

#include <QBrush>
#include <QColor>
#include <QDateTime>
#include <QLocale>

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

}  // namespace

RunsTableModel::RunsTableModel(QObject* parent) : QAbstractTableModel(parent) {}

void RunsTableModel::setRuns(std::vector<td::RunRecord> runs) {
    bool sameRows = runs.size() == runs_.size();
    for (size_t i = 0; sameRows && i < runs.size(); ++i) sameRows = runs[i].id == runs_[i].id;
    if (sameRows) {
        runs_ = std::move(runs);
        if (!runs_.empty()) emit dataChanged(index(0, 0), index(rowCount() - 1, ColCount - 1));
        return;
    }
    beginResetModel();
    runs_ = std::move(runs);
    endResetModel();
}

const td::RunRecord* RunsTableModel::run(int row) const {
    return row >= 0 && row < rowCount() ? &runs_[static_cast<size_t>(row)] : nullptr;
}

const td::RunRecord* RunsTableModel::runById(int64_t id) const {
    return run(rowOf(id));
}

int RunsTableModel::rowOf(int64_t id) const {
    for (size_t i = 0; i < runs_.size(); ++i)
        if (runs_[i].id == id) return static_cast<int>(i);
    return -1;
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
