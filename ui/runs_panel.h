// Runs panel: the stored runs of one SQLite database (the same store the CLI writes), with filter
// and sort, overlaid curves of the selected runs, rename / notes / delete / CSV export, export of a
// run's model (ONNX or .keras, from its latest good checkpoint), and a side-by-side diff of two
// runs' configurations. Polls the store once a second so runs that the
// headless trainer is writing right now appear and grow live. Every read of the store runs on the
// panel's worker thread; the GUI thread only applies what changed (RunsFeed) and writes the user's
// edits (rename, notes, delete).
#pragma once

#include <QWidget>
#include <functional>
#include <map>
#include <memory>

#include "engine/api/runs.h"

class QComboBox;
class QLabel;
class QLineEdit;
class QPushButton;
class QSortFilterProxyModel;
class QTableView;
class QTimer;

namespace td::ui {

class ChartWidget;
class RunsFeed;
class RunsTableModel;
class SerialWorker;

class RunsPanel : public QWidget {
    Q_OBJECT
  public:
    // Shows or hides a column of the runs table (the header's menu), remembered in Settings.
    void setColumnShown(int column, bool shown);
    static constexpr int kPollIntervalMs = 1000;

    explicit RunsPanel(QWidget* parent = nullptr);
    ~RunsPanel() override;

    bool setDatabasePath(const QString& path, QString* error = nullptr);
    QString databasePath() const { return dbPath_; }
    td::api::RunCatalog* catalog() const { return catalog_.get(); }

    // Asks for a look at the store now (the run list and the selected runs' new rows); the model
    // and charts change when refreshed() is emitted. A request while a look is in progress is
    // served by one more look right after it.
    void refresh();
    RunsTableModel* model() const { return model_; }
    QTableView* view() const { return view_; }
    QLineEdit* filterEdit() const { return filter_; }
    ChartWidget* stepChart() const { return stepChart_; }
    ChartWidget* epochChart() const { return epochChart_; }
    QComboBox* metricCombo() const { return metric_; }
    std::vector<int64_t> selectedRunIds() const;
    void selectRuns(const std::vector<int64_t>& ids);

    // Actions on the selection (also used by tests; interactive ones ask first).
    bool renameRun(int64_t id, const QString& name);
    bool setNotes(int64_t id, const QString& notes);
    // deleteCheckpoints: the run's checkpoint files go too.
    bool deleteRun(int64_t id, bool deleteCheckpoints = false);
    bool exportCsv(int64_t id, const QString& path, QString* error);
    // The run's model with the weights of its latest good checkpoint, as ONNX or .keras by the
    // extension of `path`; done on the panel's worker, then modelExported says how it went.
    void exportModel(int64_t id, const QString& path);
    QPushButton* exportModelButton() const { return exportModel_; }

    // Errors are shown in a message box unless not interactive (tests, scripts); the calls still
    // return them.
    void setInteractive(bool on) { interactive_ = on; }
    // Asks for the output file of an export instead of QFileDialog::getSaveFileName (tests drive
    // the buttons with it): (title, suggested file name, filter) -> path, empty to cancel.
    using SaveFileChooser = std::function<QString(const QString& title, const QString& suggested,
                                                  const QString& filter)>;
    void setSaveFileChooser(SaveFileChooser chooser) { chooseSaveFile_ = std::move(chooser); }

  signals:
    void databaseChanged(const QString& path);
    // Resume was chosen for a stopped, interrupted or failed run (the owner starts it).
    void resumeRequested(int64_t runId);
    // A look at the store was applied to the model and the overlays.
    void refreshed();
    // exportModel() finished: `error` is empty when `path` was written, from `checkpoint`.
    void modelExported(int64_t runId, const QString& path, const QString& checkpoint,
                       const QString& error);

  private:
    struct Overlay {
        QString label;  // "#12 name"
        int color = 0;  // seriesColor index
        int stepSeries = -1;
        int epochSeries = -1;
        std::map<int, int> replicaSeries;  // replica -> step chart series (per-replica metric)
        int64_t lastGlobalStep = 0;
        int epochsShown = 0;
        bool loaded = false;  // read once; only a running run's overlay is read again
    };
    struct Poll;
    void poll();  // starts a look unless one is in progress
    void applyPoll(Poll& result);
    void onSelectionChanged();
    void rebuildOverlays();
    void updateButtons();
    void renameSelected();
    void notesSelected();
    void deleteSelected();
    void resumeSelected();
    void exportSelected();
    void exportModelSelected();
    // Asks the worker whether the selected run has a checkpoint to export (Export model's state).
    void checkModelAvailable(int64_t id, const std::string& key);
    QString saveFileName(const QString& title, const QString& suggested, const QString& filter);
    void diffSelected();
    void showDiff(const td::RunRecord& a, const td::RunRecord& b);
    void showError(const QString& what, const QString& message);

    std::shared_ptr<td::api::RunCatalog> catalog_;  // shared with jobs on the worker (thread-safe)
    std::shared_ptr<RunsFeed> feed_;                // used on the worker thread only
    QString dbPath_;
    int dbGeneration_ = 0;       // looks started for another database are dropped
    int overlayGeneration_ = 0;  // overlay rows read for an older selection are dropped
    bool polling_ = false;
    bool pollAgain_ = false;
    bool resizedColumns_ = false;
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
    QPushButton* resume_;
    QPushButton* export_;
    QPushButton* exportModel_;
    QPushButton* diff_;
    ChartWidget* stepChart_;
    ChartWidget* epochChart_;
    QTimer* poll_;
    std::map<int64_t, Overlay> overlays_;
    std::vector<int64_t> watchNext_;  // resumed runs for the feed to follow from the next look
    // Export model's state: the run (and its status and last write) the answer is for, the key
    // of the check in progress, and why that run has no model ("" when it has a checkpoint).
    std::string modelCheckedKey_, modelPendingKey_, modelCheckedRun_;
    QString modelUnavailable_;
    bool interactive_ = true;
    SaveFileChooser chooseSaveFile_;
    std::unique_ptr<SerialWorker> worker_;  // last member: destroyed (joined) first
};

}  // namespace td::ui
