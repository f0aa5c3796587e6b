#include "ui/main_window.h"

#include <QAction>
#include <QApplication>
#include <QCloseEvent>
#include <QDesktopServices>
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QInputDialog>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QRegularExpression>
#include <QStatusBar>
#include <QStyle>
#include <QTabWidget>
#include <QTimer>
#include <QToolBar>
#include <QUrl>

#include "engine/api/export.h"
#include "engine/api/projects.h"
#include "ui/data_panel.h"
#include "ui/latency_probe.h"
#include "ui/model_designer.h"
#include "ui/monitor_panel.h"
#include "ui/project_checks.h"
#include "ui/project_controller.h"
#include "ui/remote_link.h"
#include "ui/run_controller.h"
#include "ui/runs_panel.h"
#include "ui/servers_panel.h"
#include "ui/settings.h"
#include "ui/training_panel.h"

namespace td::ui {

MainWindow::MainWindow(QWidget* parent)
    : QMainWindow(parent), project_(new ProjectController(this)), runs_(new RunController(this)) {
    setObjectName("TrainDeckMainWindow");
    designer_ = new ModelDesigner(project_);
    data_ = new DataPanel(project_);
    training_ = new TrainingPanel(project_);
    monitor_ = new MonitorPanel(runs_);
    runsPanel_ = new RunsPanel;
    runSources_ = new QTabWidget;
    runSources_->setObjectName("runSources");
    runSources_->setDocumentMode(true);
    runSources_->addTab(runsPanel_, tr("This computer"));
    runSources_->setTabToolTip(0, tr("The local run store"));
    tabs_ = new QTabWidget;
    tabs_->setObjectName("mainTabs");
    tabs_->addTab(designer_, tr("&1 Model"));
    tabs_->addTab(data_, tr("&2 Data"));
    tabs_->addTab(training_, tr("&3 Training"));
    tabs_->addTab(monitor_, tr("&4 Monitor"));
    tabs_->addTab(runSources_, tr("&5 Runs"));
    tabs_->setTabToolTip(ModelTab, tr("Design the layers of a Sequential model"));
    tabs_->setTabToolTip(DataTab, tr("Choose the data and the input pipeline"));
    tabs_->setTabToolTip(TrainingTab, tr("Optimizer, loss, callbacks, precision and strategy"));
    tabs_->setTabToolTip(MonitorTab, tr("Start, watch and stop training"));
    tabs_->setTabToolTip(RunsTab,
                         tr("Browse and compare stored runs, here and on connected servers"));
    setCentralWidget(tabs_);

    latencyLabel_ = new QLabel;
    latencyLabel_->setObjectName("latencyLabel");
    // A measurement (installer/gui_runs_latency.sh), not something a user acts on: shown only
    // in that mode.
    latencyLabel_->setVisible(qEnvironmentVariableIsSet("TRAINDECK_LATENCY_SECONDS"));
    dbLabel_ = new QLabel;
    statusBar()->addPermanentWidget(latencyLabel_);
    statusBar()->addPermanentWidget(dbLabel_);
    buildMenus();

    connect(project_, &ProjectController::projectReplaced, this, [this] {
        updateTitle();
        updateStartBlocker();
    });
    connect(project_, &ProjectController::projectEdited, this, &MainWindow::updateStartBlocker);
    connect(project_, &ProjectController::dirtyChanged, this, &MainWindow::updateTitle);
    connect(project_, &ProjectController::pathChanged, this, [this](const QString& path) {
        updateTitle();
        if (!path.isEmpty()) {
            Settings::addRecentFile(path);
            Settings::setLastProject(path);
        }
    });
    connect(runs_, &RunController::startRequested, this, [this] { startTraining(); });
    connect(runs_, &RunController::stateChanged, this,
            [this] { designer_->setRunInProgress(runs_->busy()); });
    connect(runs_, &RunController::runStarted, runsPanel_, &RunsPanel::refresh);
    connect(runsPanel_, &RunsPanel::resumeRequested, this, [this](int64_t id) {
        tabs_->setCurrentIndex(MonitorTab);
        runs_->resume(id, runsPanel_->databasePath());
    });
    connect(
        runsPanel_, &RunsPanel::modelExported, this,
        [this](int64_t id, const QString& path, const QString& checkpoint, const QString& error) {
            if (error.isEmpty())
                statusBar()->showMessage(tr("Exported run #%1's model to %2 (from %3)")
                                             .arg(id)
                                             .arg(path, QFileInfo(checkpoint).fileName()),
                                         10000);
            else
                statusBar()->showMessage(error, 10000);
        });
    connect(runs_, &RunController::runFinished, this, [this](const td::RunFinished& r) {
        runsPanel_->refresh();
        latencyLabel_->setText(runs_->latencyProbe()->report());
        statusBar()->showMessage(tr("Run %1").arg(td::runStatusName(r.status)), 10000);
    });
    // A run trains a copy of the project: editing during a run prepares the next one.
    connect(project_, &ProjectController::projectReplaced, this, [this] {
        monitor_->setLossScaleVisible(project_->project().precision ==
                                      td::PrecisionPolicy::MixedFloat16);
    });
    auto* latencyTimer = new QTimer(this);
    latencyTimer->setInterval(1000);
    connect(latencyTimer, &QTimer::timeout, this, [this] {
        if (runs_->latencyProbe()->active())
            latencyLabel_->setText(runs_->latencyProbe()->report());
    });
    latencyTimer->start();
    connect(runsPanel_, &RunsPanel::databaseChanged, this, [this](const QString& path) {
        dbLabel_->setText(tr("Runs: %1").arg(QFileInfo(path).fileName()));
        dbLabel_->setToolTip(path);
        training_->setDatabasePath(path);
    });

    resize(1400, 900);
    const QByteArray geometry = Settings::windowGeometry();
    if (!geometry.isEmpty()) restoreGeometry(geometry);
    const QByteArray state = Settings::windowState();
    if (!state.isEmpty()) restoreState(state);
    tabs_->setCurrentIndex(std::clamp(Settings::currentTab(), 0, tabs_->count() - 1));
    updateTitle();
    updateStartBlocker();
    monitor_->setLossScaleVisible(false);
}

MainWindow::~MainWindow() {
    runs_->shutdown();
}

void MainWindow::buildMenus() {
    QStyle* st = style();
    QMenu* file = menuBar()->addMenu(tr("&File"));
    QAction* newAct = file->addAction(st->standardIcon(QStyle::SP_FileIcon), tr("&New Project"),
                                      this, &MainWindow::newProject);
    newAct->setShortcut(QKeySequence::New);
    QAction* openAct = file->addAction(st->standardIcon(QStyle::SP_DialogOpenButton),
                                       tr("&Open Project…"), this, &MainWindow::openProjectDialog);
    openAct->setShortcut(QKeySequence::Open);
    recentMenu_ = file->addMenu(tr("Open &Recent"));
    connect(recentMenu_, &QMenu::aboutToShow, this, &MainWindow::populateRecentMenu);
    examplesMenu_ = file->addMenu(tr("&Examples"));
    connect(examplesMenu_, &QMenu::aboutToShow, this, &MainWindow::populateExamplesMenu);
    file->addSeparator();
    QAction* saveAct = file->addAction(st->standardIcon(QStyle::SP_DialogSaveButton), tr("&Save"),
                                       this, &MainWindow::save);
    saveAct->setShortcut(QKeySequence::Save);
    file->addAction(tr("Save &As…"), this, &MainWindow::saveAs)->setShortcut(QKeySequence::SaveAs);
    file->addSeparator();
    file->addAction(tr("Open Run &Database…"), this, &MainWindow::openDatabaseDialog);
    file->addAction(tr("&Connect to Server…"), this, &MainWindow::connectServerDialog)
        ->setObjectName("connectServerAction");
    file->addSeparator();
    file->addAction(tr("&Import Keras Model…"), this, &MainWindow::importKerasDialog);
    file->addAction(tr("&Export Model…"), this, &MainWindow::exportModelDialog);
    file->addSeparator();
    file->addAction(tr("&Quit"), this, &QWidget::close)->setShortcut(QKeySequence::Quit);

    QMenu* edit = menuBar()->addMenu(tr("&Edit"));
    undoAction_ = edit->addAction(tr("&Undo"), project_, &ProjectController::undo);
    undoAction_->setObjectName("undoAction");
    undoAction_->setShortcut(QKeySequence::Undo);
    redoAction_ = edit->addAction(tr("&Redo"), project_, &ProjectController::redo);
    redoAction_->setObjectName("redoAction");
    redoAction_->setShortcuts(
        {QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_Z), QKeySequence(Qt::CTRL | Qt::Key_Y)});
    auto updateUndo = [this] {
        undoAction_->setEnabled(project_->canUndo());
        redoAction_->setEnabled(project_->canRedo());
    };
    connect(project_, &ProjectController::undoStateChanged, this, updateUndo);
    updateUndo();

    QMenu* run = menuBar()->addMenu(tr("&Run"));
    run->addAction(runs_->startAction());
    run->addAction(runs_->pauseAction());
    run->addAction(runs_->stopAction());
    run->addSeparator();
    startOnServer_ =
        run->addAction(tr("Start on &Server…"), this, &MainWindow::startOnServerDialog);
    startOnServer_->setObjectName("startOnServerAction");
    startOnServer_->setEnabled(false);
    startOnServer_->setToolTip(tr("Connect to a server first (File > Connect to Server)"));

    QMenu* view = menuBar()->addMenu(tr("&View"));
    for (int i = 0; i < tabs_->count(); ++i) {
        QAction* a = view->addAction(tabs_->tabText(i).remove('&'));
        a->setShortcut(QKeySequence(Qt::ALT | static_cast<Qt::Key>(Qt::Key_1 + i)));
        connect(a, &QAction::triggered, this, [this, i] { tabs_->setCurrentIndex(i); });
    }

    QMenu* help = menuBar()->addMenu(tr("&Help"));
    QAction* docs = help->addAction(tr("&Documentation"), this, [this] {
        const QString readme = documentationPath();
        if (readme.isEmpty() || !QDesktopServices::openUrl(QUrl::fromLocalFile(readme)))
            showError(tr("Documentation"),
                      readme.isEmpty()
                          ? tr("The documentation (README.md) is not installed on this machine.")
                          : tr("No application opens %1.").arg(readme));
    });
    docs->setShortcut(QKeySequence::HelpContents);
    help->addAction(tr("&Keyboard Shortcuts"), this, [this] {
        QMessageBox box(this);
        box.setWindowTitle(tr("Keyboard shortcuts"));
        box.setTextFormat(Qt::RichText);
        box.setText(shortcutsText());
        box.exec();
    });
    help->addSeparator();
    help->addAction(tr("&About TrainDeck"), this, [this] {
        QMessageBox::about(this, tr("About TrainDeck"),
                           tr("<b>TrainDeck %1</b><br>Design, train and monitor Keras-style "
                              "Sequential networks.<br><br>1. Build a model on the Model tab.<br>"
                              "2. Pick data on the Data tab.<br>3. Tune training on the Training "
                              "tab.<br>4. Press Start (F5) and watch the Monitor tab.<br>5. "
                              "Compare runs on the Runs tab.")
                               .arg(QApplication::applicationVersion()));
    });

    QToolBar* tb = addToolBar(tr("Main"));
    tb->setObjectName("mainToolBar");
    tb->setToolButtonStyle(Qt::ToolButtonTextBesideIcon);
    tb->addAction(newAct);
    tb->addAction(openAct);
    tb->addAction(saveAct);
    tb->addSeparator();
    tb->addAction(runs_->startAction());
    tb->addAction(runs_->pauseAction());
    tb->addAction(runs_->stopAction());
}

bool MainWindow::openDatabase(const QString& path, QString* error, bool remember) {
    QString why;
    if (!runsPanel_->setDatabasePath(path, &why)) {
        if (error) *error = why;
        return false;
    }
    if (remember) Settings::setDatabasePath(path);
    return true;
}

bool MainWindow::openAtLaunch(const QString& db, const QString& project, QStringList* errors) {
    QString error;
    const bool storeOpened =
        openDatabase(db.isEmpty() ? Settings::databasePath() : db, &error, /*remember=*/false);
    if (!storeOpened) errors->append(error);
    bool opened = false;
    if (!project.isEmpty()) {
        opened = openProject(project, &error);
        if (!opened) errors->append(error);
    } else {
        const QString last = Settings::lastProject();
        if (!last.isEmpty() && QFileInfo::exists(last)) opened = openProject(last);
    }
    if (!opened) openDefaultProject();
    if (!db.isEmpty() && storeOpened && (project.isEmpty() || opened))
        Settings::setDatabasePath(db);
    return project.isEmpty() || opened;
}

bool MainWindow::openProject(const QString& path, QString* error) {
    QString why;
    if (!project_->open(path, &why)) {
        if (error) *error = why;
        return false;
    }
    Settings::addRecentFile(project_->path());
    Settings::setLastProject(project_->path());
    // Keys of the Keras model accepted but not applied (a mixed-precision layer policy, ...).
    const auto& warnings = project_->project().warnings;
    if (!warnings.empty())
        statusBar()->showMessage(tr("Opened with %n warning(s): %1", "", int(warnings.size()))
                                     .arg(QString::fromStdString(warnings.front())),
                                 20000);
    return true;
}

void MainWindow::openDefaultProject() {
    QString error;
    QString text = ProjectController::defaultProjectText();
    if (text.isEmpty() || !project_->openFromText(text, "fashion_mnist_mlp.json", &error)) {
        project_->newProject();
    }
}

bool MainWindow::startTraining(QString* error) {
    updateStartBlocker();
    if (runsPanel_->databasePath().isEmpty()) {
        openDatabase(Settings::databasePath());
    }
    tabs_->setCurrentIndex(MonitorTab);
    return runs_->start(project_->project(), runsPanel_->databasePath(), error);
}

void MainWindow::closeEvent(QCloseEvent* event) {
    // Watching a run on a server ends with the window; the run goes on there.
    if (runs_->busy() && !runs_->following() && interactive_) {
        QMessageBox box(QMessageBox::Question, tr("Training is running"),
                        tr("A run is in progress. Stop it (it is kept in the store, marked "
                           "stopped) and quit?"),
                        QMessageBox::Yes | QMessageBox::Cancel, this);
        box.setObjectName("quitDuringRun");
        box.setDefaultButton(QMessageBox::Cancel);
        // The run ending while the question is open answers it: there is nothing left to stop.
        const auto ended = connect(runs_, &RunController::runFinished, &box,
                                   [&box] { box.done(QMessageBox::Yes); });
        const int answer = box.exec();
        disconnect(ended);
        if (answer != QMessageBox::Yes) {
            event->ignore();
            return;
        }
    }
    if (!maybeSave()) {
        event->ignore();
        return;
    }
    runs_->shutdown();
    Settings::setWindowLayout(saveGeometry(), saveState());
    Settings::setCurrentTab(tabs_->currentIndex());
    event->accept();
}

void MainWindow::newProject() {
    if (!maybeSave()) return;
    project_->newProject();
    tabs_->setCurrentIndex(ModelTab);
}

void MainWindow::openProjectDialog() {
    if (!maybeSave()) return;
    QString start =
        project_->path().isEmpty() ? QDir::homePath() : QFileInfo(project_->path()).absolutePath();
    QString path = QFileDialog::getOpenFileName(this, tr("Open project"), start,
                                                tr("TrainDeck projects (*.json);;All files (*)"));
    if (path.isEmpty()) return;
    QString error;
    if (!openProject(path, &error)) showError(tr("Open project"), error);
}

bool MainWindow::save() {
    if (project_->path().isEmpty()) return saveAs();
    QString error;
    if (!project_->save(&error)) {
        showError(tr("Save project"), error);
        return false;
    }
    statusBar()->showMessage(tr("Saved %1").arg(project_->path()), 5000);
    return true;
}

bool MainWindow::saveAs() {
    QString suggested = project_->path().isEmpty()
                            ? QDir::homePath() + "/" +
                                  QString::fromStdString(project_->project().name)
                                      .toLower()
                                      .replace(QRegularExpression("[^a-z0-9]+"), "_") +
                                  ".json"
                            : project_->path();
    QString path = QFileDialog::getSaveFileName(this, tr("Save project as"), suggested,
                                                tr("TrainDeck projects (*.json)"));
    if (path.isEmpty()) return false;
    if (!path.endsWith(".json", Qt::CaseInsensitive)) path += ".json";
    QString error;
    if (!project_->saveAs(path, &error)) {
        showError(tr("Save project"), error);
        return false;
    }
    statusBar()->showMessage(tr("Saved %1").arg(path), 5000);
    return true;
}

bool MainWindow::maybeSave() {
    if (!project_->isDirty() || !interactive_) return true;
    auto answer = QMessageBox::warning(
        this, tr("Unsaved changes"),
        tr("The project \"%1\" has unsaved changes. Save them?").arg(project_->displayName()),
        QMessageBox::Save | QMessageBox::Discard | QMessageBox::Cancel, QMessageBox::Save);
    if (answer == QMessageBox::Save) return save();
    return answer == QMessageBox::Discard;
}

void MainWindow::openDatabaseDialog() {
    QString path = QFileDialog::getSaveFileName(
        this, tr("Open or create a run database"), runsPanel_->databasePath(),
        tr("SQLite run stores (*.db *.sqlite);;All files (*)"), nullptr,
        QFileDialog::DontConfirmOverwrite);
    if (path.isEmpty()) return;
    QString error;
    if (!openDatabase(path, &error)) showError(tr("Open run database"), error);
}

void MainWindow::populateRecentMenu() {
    recentMenu_->clear();
    const QStringList files = Settings::recentFiles();
    for (const QString& f : files) {
        QAction* a = recentMenu_->addAction(QFileInfo(f).fileName());
        a->setToolTip(f);
        a->setStatusTip(f);
        connect(a, &QAction::triggered, this, [this, f] {
            if (!maybeSave()) return;
            QString error;
            if (!openProject(f, &error)) showError(tr("Open recent project"), error);
        });
    }
    if (files.isEmpty()) recentMenu_->addAction(tr("(none)"))->setEnabled(false);
    recentMenu_->addSeparator();
    recentMenu_->addAction(tr("Clear list"), [] { Settings::clearRecentFiles(); });
}

void MainWindow::populateExamplesMenu() {
    examplesMenu_->clear();
    QStringList dirs{QString(TRAINDECK_SOURCE_DIR) + "/projects", "/usr/share/traindeck/projects",
                     QApplication::applicationDirPath() + "/../share/traindeck/projects"};
    QStringList seen;
    for (const QString& d : dirs) {
        for (const QFileInfo& fi : QDir(d).entryInfoList({"*.json"}, QDir::Files, QDir::Name)) {
            if (seen.contains(fi.fileName())) continue;
            seen << fi.fileName();
            QString path = fi.absoluteFilePath();
            examplesMenu_->addAction(fi.completeBaseName(), this,
                                     [this, path] { openExample(path); });
        }
    }
    if (!seen.contains("fashion_mnist_mlp.json")) {
        examplesMenu_->addAction(tr("fashion_mnist_mlp (built in)"), this, [this] {
            if (maybeSave()) openDefaultProject();
        });
    }
}

void MainWindow::openExample(const QString& path) {
    if (!maybeSave()) return;
    QFile f(path);
    QString error;
    if (!f.open(QIODevice::ReadOnly)) {
        showError(tr("Open example"), tr("Cannot read %1: %2").arg(path, f.errorString()));
        return;
    }
    // Examples open untitled, so saving never writes into the examples folder.
    if (!project_->openFromText(QString::fromUtf8(f.readAll()), QFileInfo(path).fileName(), &error))
        showError(tr("Open example"), error);
}

QString MainWindow::documentationPath() {
    const QStringList candidates{
        QString(TRAINDECK_SOURCE_DIR) + "/README.md",
        QApplication::applicationDirPath() + "/../share/doc/traindeck/README.md",
        "/usr/share/doc/traindeck/README.md"};
    for (const QString& c : candidates)
        if (QFileInfo::exists(c)) return QFileInfo(c).absoluteFilePath();
    return {};
}

QString MainWindow::shortcutsText() const {
    QString rows;
    const auto addRow = [&rows](const QString& what, const QString& keys) {
        rows += QString("<tr><td>%1</td><td>&nbsp;&nbsp;<b>%2</b></td></tr>")
                    .arg(what.toHtmlEscaped(), keys.toHtmlEscaped());
    };
    for (QAction* menu : menuBar()->actions()) {
        if (!menu->menu()) continue;
        for (QAction* a : menu->menu()->actions()) {
            if (a->shortcut().isEmpty()) continue;
            addRow(menu->text().remove('&') + " › " + a->text().remove('&').remove("…"),
                   a->shortcut().toString(QKeySequence::NativeText));
        }
    }
    return "<table>" + rows + "</table>";
}

void MainWindow::updateTitle() {
    setWindowTitle(QString("%1[*] — TrainDeck").arg(project_->displayName()));
    setWindowModified(project_->isDirty());
}

void MainWindow::updateStartBlocker() {
    runs_->setStartBlocker(startBlocker(project_->project()));
}

bool MainWindow::importKerasModel(const QString& kerasPath, QString* error) {
    auto imported = td::importKerasModel(kerasPath.toStdString(), &project_->project());
    if (!imported) {
        if (error) *error = QString::fromStdString(imported.error());
        return false;
    }
    project_->adoptUnsaved(std::move(imported->project));
    tabs_->setCurrentIndex(ModelTab);
    statusBar()->showMessage(
        tr("Imported %1: training starts from its weights").arg(QFileInfo(kerasPath).fileName()),
        10000);
    return true;
}

void MainWindow::setInteractive(bool on) {
    interactive_ = on;
    runsPanel_->setInteractive(on);
}

bool MainWindow::exportModelFile(const QString& weightsPath, const QString& outputPath,
                                 QString* error) {
    const bool onnx = outputPath.endsWith(".onnx", Qt::CaseInsensitive);
    if (!onnx && !outputPath.endsWith(".keras", Qt::CaseInsensitive)) {
        if (error) *error = tr("%1: expected a .onnx or .keras file").arg(outputPath);
        return false;
    }
    auto weights = td::projectModelWeights(project_->project(), weightsPath.toStdString());
    td::Status st =
        weights ? td::exportModel(*weights, onnx ? td::ExportFormat::Onnx : td::ExportFormat::Keras,
                                  outputPath.toStdString())
                : td::Status(td::err(weights.error()));
    if (!st) {
        if (error) *error = QString::fromStdString(st.error());
        return false;
    }
    statusBar()->showMessage(tr("Exported %1").arg(outputPath), 10000);
    return true;
}

void MainWindow::importKerasDialog() {
    if (!maybeSave()) return;
    QString path = QFileDialog::getOpenFileName(this, tr("Import Keras model"), QDir::homePath(),
                                                tr("Keras 3 models (*.keras)"));
    if (path.isEmpty()) return;
    QString error;
    if (!importKerasModel(path, &error)) showError(tr("Import Keras model"), error);
}

void MainWindow::exportModelDialog() {
    const QString initial = QString::fromStdString(project_->project().initialWeights);
    QString weights = QFileDialog::getOpenFileName(
        this, tr("Weights for the model (a .keras file)"),
        initial.isEmpty() ? QDir::homePath() : initial, tr("Keras 3 models (*.keras)"));
    if (weights.isEmpty()) return;
    QString out = QFileDialog::getSaveFileName(this, tr("Export model"),
                                               QFileInfo(weights).absolutePath() + "/model.onnx",
                                               tr("ONNX (*.onnx);;Keras 3 (*.keras)"));
    if (out.isEmpty()) return;
    QString error;
    if (!exportModelFile(weights, out, &error)) showError(tr("Export model"), error);
}

void MainWindow::showError(const QString& title, const QString& message) {
    statusBar()->showMessage(message, 10000);
    if (interactive_) QMessageBox::warning(this, title, message);
}

RemoteFollow* MainWindow::remoteFollow() const {
    return follow_;
}

std::vector<RemoteRunsPage*> MainWindow::serverPages() const {
    std::vector<RemoteRunsPage*> out;
    for (int i = 1; i < runSources_->count(); ++i)
        if (auto* p = qobject_cast<RemoteRunsPage*>(runSources_->widget(i))) out.push_back(p);
    return out;
}

RemoteRunsPage* MainWindow::connectServer(const td::api::RemoteServer& server, QString* error) {
    if (td::Status st = td::api::checkRemoteServer(server); !st.ok()) {
        if (error) *error = QString::fromStdString(st.error());
        return nullptr;
    }
    for (RemoteRunsPage* p : serverPages()) {
        const td::api::RemoteServer& s = p->link()->server();
        if (s.host == server.host && s.port == server.port && s.store == server.store) {
            runSources_->setCurrentWidget(p);
            return p;
        }
    }
    auto* link = new RemoteLink(server);
    auto* page = new RemoteRunsPage(link);
    link->setParent(page);
    page->setInteractive(interactive_);
    page->setLocalRunSource([this](td::RunRecord* out) {
        const auto ids = runsPanel_->selectedRunIds();
        if (ids.size() != 1 || !runsPanel_->catalog()) return false;
        auto r = runsPanel_->catalog()->run(ids.front());
        if (!r.ok()) return false;
        *out = std::move(r).value();
        return true;
    });
    connect(page, &RemoteRunsPage::watchRequested, this, [this, page](int64_t id) {
        QString why;
        if (!watchRemoteRun(page, id, &why)) showError(tr("Watch a run"), why);
    });
    connect(page, &RemoteRunsPage::disconnectRequested, this,
            [this, page] { disconnectServer(page); });
    connect(page, &RemoteRunsPage::message, this,
            [this](const QString& text, bool) { statusBar()->showMessage(text, 10000); });
    const int at = runSources_->addTab(page, link->label());
    runSources_->setTabToolTip(at, tr("Runs on %1, over SSH").arg(link->label()));
    runSources_->setCurrentIndex(at);
    startOnServer_->setEnabled(true);
    startOnServer_->setToolTip(
        tr("Send the open project to a connected server and start it there"));
    return page;
}

void MainWindow::disconnectServer(RemoteRunsPage* page) {
    if (!page) return;
    if (follow_ && follow_->parent() == page) follow_->cancel();
    runSources_->removeTab(runSources_->indexOf(page));
    page->deleteLater();
    startOnServer_->setEnabled(serverPages().size() > 1 ||
                               (serverPages().size() == 1 && serverPages().front() != page));
}

bool MainWindow::watchRemoteRun(RemoteRunsPage* page, int64_t runId, QString* error) {
    if (runs_->busy()) {
        if (error)
            *error = runs_->following() && follow_
                         ? tr("The Monitor is watching run #%1 already; stop watching it first "
                              "(Stop ends the run there; Disconnect stops watching)")
                               .arg(follow_->runId())
                         : tr("A run is in progress in the Monitor");
        return false;
    }
    RemoteLink* link = page->link();
    auto* follow = new RemoteFollow(link, runId, page);
    RunController::Steering steering;
    // The page may be closed (Disconnect) while the Monitor still shows the run's last events.
    steering.pause = [this, page = QPointer<RemoteRunsPage>(page), runId](bool pause) {
        if (!page) return;
        page->link()->pause(runId, pause, [this](const RemoteLink::Reply& r) {
            if (!r.error.isEmpty()) showError(tr("Pause"), r.error);
        });
    };
    steering.stop = [this, page = QPointer<RemoteRunsPage>(page), runId] {
        if (!page) return;
        page->link()->stop(runId, [this](const RemoteLink::Reply& r) {
            if (!r.error.isEmpty()) showError(tr("Stop"), r.error);
        });
    };
    if (!runs_->follow(follow->queue(), std::move(steering))) {
        delete follow;
        if (error) *error = tr("A run is in progress in the Monitor");
        return false;
    }
    follow_ = follow;
    connect(follow, &RemoteFollow::connectionChanged, this,
            [this](const QString& text, bool) { statusBar()->showMessage(text, 15000); });
    connect(runs_, &RunController::runFinished, follow, [follow] { follow->deleteLater(); });
    follow->start();
    tabs_->setCurrentIndex(MonitorTab);
    return true;
}

void MainWindow::startOnServer(RemoteRunsPage* page,
                               std::function<void(int64_t, const QString&)> done) {
    const QByteArray project = QByteArray::fromStdString(td::api::projectText(project_->project()));
    const QString name = QString::fromStdString(project_->project().name);
    page->link()->startDetached(
        project, name,
        [this, page = QPointer<RemoteRunsPage>(page), done](int64_t id, const QString& error) {
            if (!error.isEmpty()) {
                showError(tr("Start on Server"), error);
            } else if (page) {
                statusBar()->showMessage(
                    tr("Started run #%1 on %2").arg(id).arg(page->link()->label()), 10000);
                page->refresh();
                QString why;
                if (!watchRemoteRun(page, id, &why)) statusBar()->showMessage(why, 10000);
            }
            if (done) done(id, error);
        });
}

void MainWindow::connectServerDialog() {
    ConnectDialog dialog(this);
    if (const QStringList last = Settings::lastServer(); last.size() == 4) {
        td::api::RemoteServer s;
        s.host = last[0].toStdString();
        s.port = last[1].toInt();
        s.store = last[2].toStdString();
        s.traindeck = last[3].toStdString();
        dialog.setServer(s);
    }
    if (dialog.exec() != QDialog::Accepted) return;
    const td::api::RemoteServer s = dialog.server();
    QString error;
    if (!connectServer(s, &error)) {
        showError(tr("Connect to Server"), error);
        return;
    }
    Settings::setLastServer({QString::fromStdString(s.host), QString::number(s.port),
                             QString::fromStdString(s.store), QString::fromStdString(s.traindeck)});
    tabs_->setCurrentIndex(RunsTab);
}

void MainWindow::startOnServerDialog() {
    const auto pages = serverPages();
    if (pages.empty()) return;
    RemoteRunsPage* page = qobject_cast<RemoteRunsPage*>(runSources_->currentWidget());
    if (!page && pages.size() == 1) page = pages.front();
    if (!page) {
        QStringList names;
        for (RemoteRunsPage* p : pages) names << p->link()->label();
        bool ok = false;
        const QString pick = QInputDialog::getItem(
            this, tr("Start on Server"), tr("Start the project on:"), names, 0, false, &ok);
        if (!ok) return;
        page = pages[static_cast<size_t>(names.indexOf(pick))];
    }
    startOnServer(page);
}

}  // namespace td::ui
