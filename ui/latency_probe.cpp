#include "ui/latency_probe.h"

#include <algorithm>
#include <cmath>

namespace td::ui {

LatencyProbe::LatencyProbe(QObject* parent) : QObject(parent) {
    timer_.setTimerType(Qt::PreciseTimer);
    timer_.setInterval(kIntervalMs);
    connect(&timer_, &QTimer::timeout, this, &LatencyProbe::tick);
}

void LatencyProbe::start() {
    latenessMs_.clear();
    latenessMs_.reserve(1 << 16);
    tickAtSeconds_.clear();
    tickAtSeconds_.reserve(1 << 16);
    clock_.start();
    lastNs_ = clock_.nsecsElapsed();
    timer_.start();
}

void LatencyProbe::stop() {
    timer_.stop();
}

void LatencyProbe::tick() {
    qint64 now = clock_.nsecsElapsed();
    double lateMs = static_cast<double>(now - lastNs_) / 1e6 - kIntervalMs;
    lastNs_ = now;
    latenessMs_.push_back(std::max(0.0, lateMs));
    tickAtSeconds_.push_back(static_cast<float>(now / 1e9));
}

double LatencyProbe::worstMs() const {
    if (latenessMs_.empty()) return 0;
    return *std::max_element(latenessMs_.begin(), latenessMs_.end());
}

double LatencyProbe::worstAtSeconds() const {
    if (latenessMs_.empty()) return 0;
    auto it = std::max_element(latenessMs_.begin(), latenessMs_.end());
    return tickAtSeconds_[static_cast<size_t>(it - latenessMs_.begin())];
}

double LatencyProbe::percentileMs(double p) const {
    if (latenessMs_.empty()) return 0;
    std::vector<double> v = latenessMs_;
    size_t k = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
    k = std::clamp<size_t>(k, 1, v.size()) - 1;
    std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
    return v[k];
}

QString LatencyProbe::report() const {
    return tr("GUI event latency: worst %1 ms (at %2 s), p99 %3 ms, median %4 ms over %5 ticks")
        .arg(worstMs(), 0, 'f', 1)
        .arg(worstAtSeconds(), 0, 'f', 2)
        .arg(percentileMs(99), 0, 'f', 1)
        .arg(percentileMs(50), 0, 'f', 1)
        .arg(samples());
}

}  // namespace td::ui
