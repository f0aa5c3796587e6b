// Table model over the run store's run records. Updated in place by the periodic refresh so a
// selection survives runs being written by another process.
#pragma once

#include <QAbstractTableModel>
#include <vector>

#include "engine/store/run_store.h"

namespace td::ui {

class RunsTableModel : public QAbstractTableModel {
    Q_OBJECT
  public:
    enum Column {
        ColId,
        ColName,
        ColStatus,
        ColStarted,
        ColDuration,
        ColModel,
        ColParams,
        ColBestValAcc,
        ColDevices,
        ColNotes,
        ColCount
    };
    static constexpr int kSortRole = Qt::UserRole;
    static constexpr int kIdRole = Qt::UserRole + 1;

    explicit RunsTableModel(QObject* parent = nullptr);

    void setRuns(std::vector<td::RunRecord> runs);
    const td::RunRecord* run(int row) const;
    const td::RunRecord* runById(int64_t id) const;
    int rowOf(int64_t id) const;

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role) const override;
    QVariant headerData(int section, Qt::Orientation o, int role) const override;

  private:
    std::vector<td::RunRecord> runs_;
};

}  // namespace td::ui
