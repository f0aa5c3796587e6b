// Runs panel: the stored runs of one SQLite database (the same store the CLI writes), with filter
// and sort, overlaid curves of the selected runs, rename / notes / delete / CSV export, and a
// side-by-side diff of two runs' configurations. Polls the store once a second so runs that the
// headless trainer is writing right now appear and grow live.
#pragma once

#include <QWidget>
#include <map>
#include <memory>

#include "engine/store/run_store.h"

class QComboBox;
class QLabel;
class QLineEdit;
class QPushButton;
class QSortFilterProxyModel;
class QTableView;
class QTimer;

namespace td::ui {

class ChartWidget;
class RunsTableModel;

class RunsPanel : public QWidget {
    Q_OBJECT
  public:
    static constexpr int kPollIntervalMs = 1000;

    explicit RunsPanel(QWidget* parent = nullptr);
    ~RunsPanel() override;

    bool setDatabasePath(const QString& path, QString* error = nullptr);
    QString databasePath() const { return dbPath_; }
    td::RunStore* store() const { return store_.get(); }

    void refresh();  // re-reads the run list and the selected runs' new rows
    RunsTableModel* model() const { return model_; }
    QTableView* view() const { return view_; }
    QLineEdit* filterEdit() const { return filter_; }
    ChartWidget* stepChart() const { return stepChart_; }
    ChartWidget* epochChart() const { return epochChart_; }
    std::vector<int64_t> selectedRunIds() const;
    void selectRuns(const std::vector<int64_t>& ids);

    // Actions on the selection (also used by tests; interactive ones ask first).
    bool renameRun(int64_t id, const QString& name);
    bool setNotes(int64_t id, const QString& notes);
    bool deleteRun(int64_t id);
    bool exportCsv(int64_t id, const QString& path, QString* error);

  signals:
    void databaseChanged(const QString& path);

  private:
    struct Overlay {
        int stepSeries = -1;
        int epochSeries = -1;
        int64_t lastGlobalStep = 0;
        int epochsShown = 0;
    };
    void onSelectionChanged();
    void rebuildOverlays();
    void pollOverlay(int64_t id, Overlay& o);
    void updateButtons();
    void renameSelected();
    void notesSelected();
    void deleteSelected();
    void exportSelected();
    void diffSelected();
    void showError(const QString& what, const QString& message);

    std::unique_ptr<td::RunStore> store_;
    QString dbPath_;
    RunsTableModel* model_;
    QSortFilterProxyModel* proxy_;
    QTableView* view_;
    QLabel* dbLabel_;
    QLineEdit* filter_;
    QComboBox* statusFilter_;
    QComboBox* metric_;
    QPushButton* rename_;
    QPushButton* notes_;
    QPushButton* delete_;
    QPushButton* export_;
    QPushButton* diff_;
    ChartWidget* stepChart_;
    ChartWidget* epochChart_;
    QTimer* poll_;
    std::map<int64_t, Overlay> overlays_;
};

}  // namespace td::ui
