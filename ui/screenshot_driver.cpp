#include "ui/screenshot_driver.h"

#include <QApplication>
#include <QDir>
#include <QItemSelectionModel>
#include <QPixmap>
#include <QTabWidget>
#include <QTableView>
#include <QTimer>
#include <algorithm>
#include <functional>

#include "ui/data_panel.h"
#include "ui/main_window.h"
#include "ui/model_designer.h"
#include "ui/run_controller.h"
#include "ui/runs_panel.h"
#include "ui/runs_table_model.h"

namespace td::ui {

ScreenshotDriver::ScreenshotDriver(MainWindow* window, const QString& outDir, int trainSeconds,
                                   int settleMs)
    : QObject(window),
      window_(window),
      outDir_(outDir),
      trainSeconds_(trainSeconds),
      settleMs_(settleMs) {}

void ScreenshotDriver::grab(int tab, const QString& name) {
    window_->tabs()->setCurrentIndex(tab);
    // Let layouts settle and queued replots run before grabbing.
    for (int i = 0; i < 5; ++i) QApplication::processEvents();
    QString path = QDir(outDir_).filePath(name + ".png");
    const bool saved = window_->grab().save(path);
    if (!saved)
        qWarning("screenshots: cannot write %s", qPrintable(path));
    else
        qInfo("screenshots: wrote %s", qPrintable(path));
    emit grabbed(name, saved);
}

void ScreenshotDriver::begin() {
    QDir().mkpath(outDir_);
    QTimer::singleShot(settleMs_, this, &ScreenshotDriver::grabStatic);
    QTimer::singleShot(trainSeconds_ * 1000, this, &ScreenshotDriver::grabLive);
    connect(window_->runController(), &RunController::runFinished, this,
            [this] { QTimer::singleShot(500, this, &ScreenshotDriver::grabLive); });
}

void ScreenshotDriver::grabStatic() {
    window_->modelDesigner()->selectRow(2);
    grab(MainWindow::ModelTab, "model");
    // Showing the Data tab starts its preview when the project's is not loaded yet: grab once it
    // is there (or has failed, which is what the user sees then).
    window_->tabs()->setCurrentIndex(MainWindow::DataTab);
    DataPanel* data = window_->dataPanel();
    auto rest = [this] {
        grab(MainWindow::DataTab, "data");
        grab(MainWindow::TrainingTab, "training");
        window_->tabs()->setCurrentIndex(MainWindow::MonitorTab);
        staticDone_ = true;
        if (liveDue_) grabLive();
    };
    if (data->previewPending())
        connect(data, &DataPanel::previewLoaded, this, rest, Qt::SingleShotConnection);
    else
        rest();
}

void ScreenshotDriver::grabLive() {
    if (liveDone_) return;
    if (!staticDone_) {  // a slow preview: the live pictures follow the static ones
        liveDue_ = true;
        return;
    }
    liveDone_ = true;
    grab(MainWindow::MonitorTab, "monitor");
    // The Runs panel reads the store on its worker: select the newest runs once the list is
    // current, and grab once their curves are read.
    RunsPanel* runs = window_->runsPanel();
    connect(
        runs, &RunsPanel::refreshed, this,
        [this, runs] {
            std::vector<int64_t> ids;
            for (int r = 0; r < runs->model()->rowCount(); ++r)
                ids.push_back(runs->model()->run(r)->id);
            std::sort(ids.begin(), ids.end(), std::greater<>());
            if (ids.size() > 3) ids.resize(3);  // the newest
            runs->selectRuns(ids);
            if (ids.empty()) {
                grabRuns();
                return;
            }
            connect(runs, &RunsPanel::refreshed, this, &ScreenshotDriver::grabRuns,
                    Qt::SingleShotConnection);
            // selectRuns does not signal (it restores a selection); overlay the chosen runs.
            runs->view()->selectionModel()->selectionChanged({}, {});
        },
        Qt::SingleShotConnection);
    runs->refresh();
}

void ScreenshotDriver::grabRuns() {
    grab(MainWindow::RunsTab, "runs");
    emit finished();
    window_->setInteractive(false);
    window_->close();
}

}  // namespace td::ui
