// Table model over the run store's run summaries (RunRecord without the project documents).
// Updated in place, row by row, by the periodic refresh: only rows that changed are signalled, so
// views and the sorting proxy do work in proportion to the change, not to the number of runs.
#pragma once

#include <QAbstractTableModel>
#include <QString>
#include <optional>
#include <unordered_map>
#include <vector>

#include "engine/api/runs.h"

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
        ColLoss,           // final training loss
        ColAccuracy,       // final training accuracy
        ColBestValAcc,     // best validation accuracy over the epochs
        ColTestAcc,        // accuracy on the test split after fit
        ColSamplesPerSec,  // the last epoch's
        ColPrecision,
        ColStrategy,
        ColDevices,
        ColNotes,
        ColCount
    };
    // Columns a new table shows; the rest are offered in the header's menu.
    static bool shownByDefault(int column);
    static constexpr int kSortRole = Qt::UserRole;
    static constexpr int kIdRole = Qt::UserRole + 1;

    explicit RunsTableModel(QObject* parent = nullptr);

    void setRuns(std::vector<td::RunRecord> runs);
    // `runs` are new or possibly changed; `removed` are gone. With `full`, `runs` is every run and
    // any other row goes too.
    void applyChanges(std::vector<td::RunRecord> runs, std::vector<int64_t> removed, bool full);
    // Replaces the row with r's id (a local edit); false when there is none.
    bool replaceRun(const td::RunRecord& r);
    const td::RunRecord* run(int row) const;
    const td::RunRecord* runById(int64_t id) const;
    int rowOf(int64_t id) const;

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role) const override;
    QVariant headerData(int section, Qt::Orientation o, int role) const override;

    // What a row shows that is parsed from its JSON documents, once per change of the row.
    struct Derived {
        std::optional<double> loss, accuracy, testAccuracy;
        QString precision, strategy;
    };
    static Derived derive(const td::RunRecord& r);

  private:
    void reindex();
    void removeRows(std::vector<int> rows);

    std::vector<td::RunRecord> runs_;
    std::vector<Derived> derived_;  // per row, as runs_
    std::unordered_map<int64_t, int> rowOfId_;
};

}  // namespace td::ui
