// Renders every panel of a main window to PNG files while a real training run goes on (for the
// documentation), then closes the window. Driven by timers and the panels' own signals, so the
// GUI keeps running normally and each picture shows the panel with its data, as a user sees it:
// the Data panel after its preview and histogram are loaded, the Runs panel after the selected
// runs' curves are read.
#pragma once

#include <QObject>
#include <QString>
#include <vector>

namespace td::ui {

class MainWindow;

class ScreenshotDriver : public QObject {
    Q_OBJECT
  public:
    // The static panels are grabbed `settleMs` after begin() (window shown, layouts settled); the
    // Monitor and Runs panels after `trainSeconds` of training or when the run ends.
    ScreenshotDriver(MainWindow* window, const QString& outDir, int trainSeconds,
                     int settleMs = 2500);
    void begin();

  signals:
    void grabbed(const QString& name, bool saved);  // after each picture
    void finished();                                // after the last one, before closing

  private:
    void grab(int tab, const QString& name);
    void grabStatic();
    void grabLive();
    void grabRuns();

    MainWindow* window_;
    QString outDir_;
    int trainSeconds_;
    int settleMs_;
    bool staticDone_ = false;
    bool liveDue_ = false;
    bool liveDone_ = false;
};

}  // namespace td::ui
