// The main window only arranges things: it owns the project and run controllers, puts the panels
// in tabs, and wires menus, toolbar and status bar to them. Behaviour lives in the panels and
// controllers.
#pragma once

#include <QMainWindow>

class QAction;
class QLabel;
class QMenu;
class QTabWidget;

namespace td::ui {

class DataPanel;
class ModelDesigner;
class MonitorPanel;
class ProjectController;
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

    ProjectController* project_;
    RunController* runs_;
    QTabWidget* tabs_;
    ModelDesigner* designer_;
    DataPanel* data_;
    TrainingPanel* training_;
    MonitorPanel* monitor_;
    RunsPanel* runsPanel_;
    QMenu* recentMenu_ = nullptr;
    QMenu* examplesMenu_ = nullptr;
    QAction* undoAction_ = nullptr;
    QAction* redoAction_ = nullptr;
    QLabel* latencyLabel_;
    QLabel* dbLabel_;
    bool interactive_ = true;
};

}  // namespace td::ui
