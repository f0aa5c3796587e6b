// Renders every panel of a main window to PNG files while a real training run goes on (for the
// documentation), then closes the window. Driven by timers, so the GUI keeps running normally.
#pragma once

#include <QObject>
#include <QString>

namespace td::ui {

class MainWindow;

class ScreenshotDriver : public QObject {
    Q_OBJECT
  public:
    // Waits `trainSeconds` of training before grabbing the Monitor and Runs panels.
    ScreenshotDriver(MainWindow* window, const QString& outDir, int trainSeconds);
    void begin();

  private:
    void grab(int tab, const QString& name);
    void grabLive();

    MainWindow* window_;
    QString outDir_;
    int trainSeconds_;
    bool liveDone_ = false;
};

}  // namespace td::ui
