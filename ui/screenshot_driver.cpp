#include "ui/screenshot_driver.h"

#include <QApplication>
#include <QDir>
#include <QPixmap>
#include <QTabWidget>
#include <QTableView>
#include <QTimer>

#include "ui/data_panel.h"
#include "ui/main_window.h"
#include "ui/model_designer.h"
#include "ui/run_controller.h"
#include "ui/runs_panel.h"
#include "ui/runs_table_model.h"

namespace td::ui {

ScreenshotDriver::ScreenshotDriver(MainWindow* window, const QString& outDir, int trainSeconds)
    : QObject(window), window_(window), outDir_(outDir), trainSeconds_(trainSeconds) {}

void ScreenshotDriver::grab(int tab, const QString& name) {
    window_->tabs()->setCurrentIndex(tab);
    // Let layouts settle and queued replots run before grabbing.
    for (int i = 0; i < 5; ++i) QApplication::processEvents();
    QString path = QDir(outDir_).filePath(name + ".png");
    if (!window_->grab().save(path))
        qWarning("screenshots: cannot write %s", qPrintable(path));
    else
        qInfo("screenshots: wrote %s", qPrintable(path));
}

void ScreenshotDriver::begin() {
    QDir().mkpath(outDir_);
    // Static panels first (the data preview loads in the background).
    QTimer::singleShot(2500, this, [this] {
        window_->modelDesigner()->selectRow(2);
        grab(MainWindow::ModelTab, "model");
        grab(MainWindow::DataTab, "data");
        grab(MainWindow::TrainingTab, "training");
        window_->tabs()->setCurrentIndex(MainWindow::MonitorTab);
    });
    QTimer::singleShot(trainSeconds_ * 1000, this, &ScreenshotDriver::grabLive);
    connect(window_->runController(), &RunController::runFinished, this,
            [this] { QTimer::singleShot(500, this, &ScreenshotDriver::grabLive); });
}

void ScreenshotDriver::grabLive() {
    if (liveDone_) return;
    liveDone_ = true;
    grab(MainWindow::MonitorTab, "monitor");
    RunsPanel* runs = window_->runsPanel();
    runs->refresh();
    std::vector<int64_t> ids;
    for (int r = 0; r < runs->model()->rowCount() && ids.size() < 3; ++r)
        ids.push_back(runs->model()->run(r)->id);
    runs->selectRuns(ids);
    // selectRuns does not signal (it restores a selection); overlay the chosen runs explicitly.
    runs->view()->selectionModel()->selectionChanged({}, {});
    QTimer::singleShot(1500, this, [this] {
        grab(MainWindow::RunsTab, "runs");
        window_->setInteractive(false);
        window_->close();
    });
}

}  // namespace td::ui
