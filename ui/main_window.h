// The main window only arranges things: it owns the project and run controllers, puts the panels
// in tabs, and wires menus, toolbar and status bar to them. Behaviour lives in the panels and
// controllers.
#pragma once

#include <QMainWindow>
#include <QPointer>
#include <functional>

#include "engine/api/remote.h"

class QAction;
class QLabel;
class QMenu;
class QTabWidget;

namespace td::ui {

class DataPanel;
class ModelDesigner;
class MonitorPanel;
class ProjectController;
class RemoteFollow;
class RemoteRunsPage;
class RunController;
class RunsPanel;
class TrainingPanel;

class MainWindow : public QMainWindow {
    Q_OBJECT
  public:
    enum Tab { ModelTab, DataTab, TrainingTab, MonitorTab, RunsTab };

    explicit MainWindow(QWidget* parent = nullptr);
    ~MainWindow() override;

    ProjectController* projectController() const { return project_; }
    RunController* runController() const { return runs_; }
    ModelDesigner* modelDesigner() const { return designer_; }
    DataPanel* dataPanel() const { return data_; }
    TrainingPanel* trainingPanel() const { return training_; }
    MonitorPanel* monitorPanel() const { return monitor_; }
    RunsPanel* runsPanel() const { return runsPanel_; }
    QTabWidget* tabs() const { return tabs_; }
    // The Runs tab's pages: "This computer" (runsPanel()), then one per connected server.
    QTabWidget* runSources() const { return runSources_; }

    // File > Connect to Server: a page for the server in the Runs tab (the one already there for
    // the same host, port and store). Errors (a host ssh would not take) go to `error`.
    RemoteRunsPage* connectServer(const td::api::RemoteServer& server, QString* error = nullptr);
    void disconnectServer(RemoteRunsPage* page);
    std::vector<RemoteRunsPage*> serverPages() const;
    // The Monitor follows run `runId` of the page's server live (RemoteFollow), with Pause and
    // Stop acting there. False (and why) while a run is shown.
    bool watchRemoteRun(RemoteRunsPage* page, int64_t runId, QString* error = nullptr);
    RemoteFollow* remoteFollow() const;
    // Run > Start on Server: the open project sent to `train - --detach` there; the new run is
    // watched. `done` gets its id, or the error.
    void startOnServer(RemoteRunsPage* page,
                       std::function<void(int64_t, const QString&)> done = {});

    // Dialogs (unsaved changes, stop the run?) are skipped when not interactive (tests, scripts).
    void setInteractive(bool on);

    // remember: the store becomes the one the next plain launch opens (Settings).
    bool openDatabase(const QString& path, QString* error = nullptr, bool remember = true);
    // What a launch asked for: the store (`db`, empty: the remembered one) and the project
    // (empty: the last one, or the embedded default). Errors go to `errors`, one a line. A store
    // named here is remembered only when the launch did what was asked (the store and the
    // project, if one was named, opened): a failed launch changes nothing for the next.
    // Returns whether the named project (if any) opened.
    bool openAtLaunch(const QString& db, const QString& project, QStringList* errors);
    bool openProject(const QString& path, QString* error = nullptr);
    void openDefaultProject();
    bool startTraining(QString* error = nullptr);
    // File > Import Keras Model: the .keras file's model with its weights (initial_weights) in
    // the current project's data and training setup, unsaved.
    bool importKerasModel(const QString& kerasPath, QString* error = nullptr);
    // File > Export Model: the project's model with the weights of a .keras file, as ONNX or
    // .keras (by the output's extension). A stored run's weights arrive with its checkpoints.
    bool exportModelFile(const QString& weightsPath, const QString& outputPath,
                         QString* error = nullptr);
    // The Help menu's list of every menu action with a shortcut, as an HTML table.
    QString shortcutsText() const;
    // README.md of the source tree or of the installed documentation; empty when neither exists.
    static QString documentationPath();

  protected:
    void closeEvent(QCloseEvent* event) override;

  private:
    void buildMenus();
    void newProject();
    void openProjectDialog();
    bool save();
    bool saveAs();
    bool maybeSave();  // true when it is fine to discard the current project
    void openDatabaseDialog();
    void populateRecentMenu();
    void populateExamplesMenu();
    void openExample(const QString& path);
    void importKerasDialog();
    void exportModelDialog();
    void updateTitle();
    void updateStartBlocker();
    void showError(const QString& title, const QString& message);
    void connectServerDialog();
    void startOnServerDialog();

    ProjectController* project_;
    RunController* runs_;
    QTabWidget* tabs_;
    ModelDesigner* designer_;
    DataPanel* data_;
    TrainingPanel* training_;
    MonitorPanel* monitor_;
    RunsPanel* runsPanel_;
    QTabWidget* runSources_;
    QAction* startOnServer_ = nullptr;
    QPointer<RemoteFollow> follow_;
    QMenu* recentMenu_ = nullptr;
    QMenu* examplesMenu_ = nullptr;
    QAction* undoAction_ = nullptr;
    QAction* redoAction_ = nullptr;
    QLabel* latencyLabel_;
    QLabel* dbLabel_;
    bool interactive_ = true;
};

}  // namespace td::ui
