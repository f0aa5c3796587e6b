#include "ui/gui_main.h"

#include <QApplication>
#include <QFileInfo>
#include <QIcon>
#include <QMessageBox>
#include <QTabWidget>
#include <QTimer>
#include <cstdio>

#include "ui/app_icon.h"
#include "ui/latency_probe.h"
#include "ui/main_window.h"
#include "ui/run_controller.h"
#include "ui/screenshot_driver.h"
#include "ui/settings.h"

namespace td::ui {

int runGui(int argc, char** argv, const std::string& dbPath, const std::string& projectPath,
           bool start, bool quitWhenDone) {
    QApplication app(argc, argv);
    QApplication::setOrganizationName("TrainDeck");
    QApplication::setApplicationName("TrainDeck");
    QApplication::setApplicationVersion(TRAINDECK_VERSION);
    QApplication::setDesktopFileName("traindeck");
    QApplication::setWindowIcon(appIcon());

    MainWindow window;
    const QString screenshots = qEnvironmentVariable("TRAINDECK_SCREENSHOTS");
    if (!screenshots.isEmpty()) window.setInteractive(false);

    QStringList errors;
    const bool asked = window.openAtLaunch(QString::fromStdString(dbPath),
                                           QString::fromStdString(projectPath), &errors);
    if (!asked) start = false;  // never train something other than what was asked for
    for (const QString& error : errors) {
        std::fprintf(stderr, "traindeck: %s\n", qPrintable(error));
        QMessageBox::warning(&window, QObject::tr("TrainDeck"), error);
    }

    window.show();
    if (start) {
        QTimer::singleShot(0, &window, [&window] {
            QString why;
            if (!window.startTraining(&why))
                std::fprintf(stderr, "traindeck: %s\n", qPrintable(why));
        });
    }
    if (start && quitWhenDone) {
        QObject::connect(window.runController(), &RunController::runFinished, &app,
                         [&app, &window](const td::RunFinished& r) {
                             std::printf(
                                 "traindeck: run %s; %s\n", runStatusName(r.status),
                                 qPrintable(window.runController()->latencyProbe()->report()));
                             std::fflush(stdout);
                             QTimer::singleShot(0, &app, &QApplication::quit);
                         });
    }
    // Measurement mode (installer/gui_runs_latency.sh): TRAINDECK_TAB=1..5 shows that tab, and
    // TRAINDECK_LATENCY_SECONDS=N measures the GUI thread's event latency for N seconds from the
    // start of the event loop, whatever the app is doing, prints it and quits.
    const int tab = qEnvironmentVariableIntValue("TRAINDECK_TAB");
    if (tab >= 1 && tab <= window.tabs()->count()) window.tabs()->setCurrentIndex(tab - 1);
    const int latencySeconds = qEnvironmentVariableIntValue("TRAINDECK_LATENCY_SECONDS");
    if (latencySeconds > 0) {
        auto* probe = new LatencyProbe(&app);
        probe->start();
        QTimer::singleShot(latencySeconds * 1000, &app, [probe, &app] {
            probe->stop();
            std::printf("traindeck: %s\n", qPrintable(probe->report()));
            std::fflush(stdout);
            QTimer::singleShot(0, &app, &QApplication::quit);
        });
    }
    if (!screenshots.isEmpty()) {
        int seconds = qEnvironmentVariableIntValue("TRAINDECK_SCREENSHOT_SECONDS");
        auto* driver = new ScreenshotDriver(&window, screenshots, seconds > 0 ? seconds : 12);
        driver->begin();
    }
    return app.exec();
}

}  // namespace td::ui
