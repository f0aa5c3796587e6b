// The run stores of servers, beside the local one in the Runs tab: one page per connected server
// (File > Connect to Server) listing its runs in the same table as the local store's, refreshed
// every few seconds over the server's shared SSH connection, with Watch (the Monitor follows the
// run live), Stop, Pause, Continue, Export model and Compare (two runs of the server, or one of
// them with the run selected in the local store). A server that cannot be reached says why and
// what to do (engine/api/remote.h's explanations), and is tried again on the next refresh.
#pragma once

#include <QDialog>
#include <QWidget>
#include <functional>
#include <vector>

#include "engine/api/remote.h"
#include "engine/core/run_records.h"

class QLabel;
class QLineEdit;
class QPushButton;
class QSortFilterProxyModel;
class QSpinBox;
class QTableView;
class QTimer;

namespace td::ui {

class RemoteLink;
class RunsTableModel;

// File > Connect to Server: a host as ssh takes it, the store's path there and the traindeck
// there. Keys and the SSH agent only: the dialog has no password field.
class ConnectDialog : public QDialog {
    Q_OBJECT
  public:
    explicit ConnectDialog(QWidget* parent = nullptr);
    td::api::RemoteServer server() const;
    void setServer(const td::api::RemoteServer& s);
    QLineEdit* hostEdit() const { return host_; }

  private:
    QLineEdit* host_;
    QSpinBox* port_;
    QLineEdit* store_;
    QLineEdit* traindeck_;
};

class RemoteRunsPage : public QWidget {
    Q_OBJECT
  public:
    static constexpr int kRefreshMs = 3000;

    explicit RemoteRunsPage(RemoteLink* link, QWidget* parent = nullptr);
    RemoteLink* link() const { return link_; }
    RunsTableModel* model() const { return model_; }
    QTableView* view() const { return view_; }
    QLabel* stateLabel() const { return state_; }
    std::vector<int64_t> selectedRunIds() const;
    void selectRun(int64_t id);
    void refresh();

    // Actions on the selection (the buttons; tests call them). Errors go to the state line and,
    // when interactive, a message box.
    void stopSelected();
    void pauseSelected(bool pause);
    // To `path` (.onnx or .keras by its extension); done(error) after.
    void exportModel(int64_t id, const QString& path, std::function<void(const QString&)> done);
    // The rows of a Compare of a server's run with `other` (a local run with its documents, or
    // another run of the server when `otherRemoteId` > 0): the server's run is read with its
    // documents first (show --json).
    void compare(
        int64_t id, const td::RunRecord* other, int64_t otherRemoteId,
        std::function<void(const td::RunRecord& a, const td::RunRecord& b, const QString& error)>
            done);

    void setInteractive(bool on) { interactive_ = on; }
    // The local run to compare with (the Runs tab's local selection, with its documents); null
    // when none is selected.
    void setLocalRunSource(std::function<bool(td::RunRecord*)> source) {
        localRun_ = std::move(source);
    }

  signals:
    void watchRequested(int64_t runId);
    void disconnectRequested();
    void message(const QString& text, bool error);

  private:
    void applyRuns();
    void updateButtons();
    void report(const QString& error);
    void compareSelected();
    void exportSelected();

    RemoteLink* link_;
    RunsTableModel* model_;
    QSortFilterProxyModel* proxy_;
    QTableView* view_;
    QLabel* state_;
    QPushButton* watch_;
    QPushButton* stop_;
    QPushButton* pause_;
    QPushButton* continue_;
    QPushButton* export_;
    QPushButton* compare_;
    QTimer* timer_;
    bool interactive_ = true;
    std::function<bool(td::RunRecord*)> localRun_;
};

}  // namespace td::ui
