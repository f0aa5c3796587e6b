// Measures how late the GUI thread's event loop serves a 10 ms precise timer: the lateness of each
// tick is the time the event loop could not respond. Worst and p99 over a window (e.g. one run).
#pragma once

#include <QElapsedTimer>
#include <QObject>
#include <QTimer>
#include <vector>

namespace td::ui {

class LatencyProbe : public QObject {
    Q_OBJECT
  public:
    static constexpr int kIntervalMs = 10;

    explicit LatencyProbe(QObject* parent = nullptr);
    void start();  // resets the statistics
    void stop();
    bool active() const { return timer_.isActive(); }

    int samples() const { return static_cast<int>(latenessMs_.size()); }
    double worstMs() const;
    double worstAtSeconds() const;        // when the worst tick came, since start()
    double percentileMs(double p) const;  // p in [0, 100]
    QString report() const;  // "GUI event latency: worst 3.1 ms, p99 1.2 ms over 1234 ticks"

  private:
    void tick();

    QTimer timer_;
    QElapsedTimer clock_;
    qint64 lastNs_ = 0;
    std::vector<double> latenessMs_;
    std::vector<float> tickAtSeconds_;
};

}  // namespace td::ui
