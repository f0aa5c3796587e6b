#include "engine/core/events.h"

#include <algorithm>

namespace td {

const char* runStatusName(RunStatus s) {
    switch (s) {
        case RunStatus::Running:
            return "running";
        case RunStatus::Completed:
            return "completed";
        case RunStatus::Stopped:
            return "stopped";
        case RunStatus::Failed:
            return "failed";
        case RunStatus::Interrupted:
            return "interrupted";
    }
    return "unknown";
}

void EventQueue::push(Event e) {
    bool wake;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (closed_) return;
        const bool edge =
            std::holds_alternative<RunStarted>(e) || std::holds_alternative<RunFinished>(e);
        edge_ = edge_ || edge;
        q_.push_back(std::move(e));
        wake = popWaiters_ > 0 || edge || q_.size() >= kBatchWake;
    }
    if (wake) cv_.notify_all();
}

std::vector<Event> EventQueue::drain() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Event> out(std::make_move_iterator(q_.begin()), std::make_move_iterator(q_.end()));
    q_.clear();
    edge_ = false;
    return out;
}

std::optional<Event> EventQueue::pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    ++popWaiters_;
    cv_.wait_for(lock, timeout, [&] { return !q_.empty() || closed_; });
    --popWaiters_;
    if (q_.empty()) return std::nullopt;
    Event e = std::move(q_.front());
    q_.pop_front();
    if (q_.empty()) edge_ = false;
    return e;
}

std::vector<Event> EventQueue::waitBatch(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return edge_ || closed_ || q_.size() >= kBatchWake; });
    std::vector<Event> out(std::make_move_iterator(q_.begin()), std::make_move_iterator(q_.end()));
    q_.clear();
    edge_ = false;
    return out;
}

void EventQueue::close() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        closed_ = true;
    }
    cv_.notify_all();
}

bool EventQueue::closed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_ && q_.empty();
}

std::shared_ptr<EventQueue> EventBus::subscribe() {
    auto q = std::make_shared<EventQueue>();
    std::lock_guard<std::mutex> lock(mu_);
    subs_.push_back(q);
    return q;
}

void EventBus::unsubscribe(const std::shared_ptr<EventQueue>& queue) {
    std::lock_guard<std::mutex> lock(mu_);
    subs_.erase(std::remove(subs_.begin(), subs_.end(), queue), subs_.end());
}

void EventBus::publish(const Event& e) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& q : subs_) q->push(e);
}

void EventBus::closeAll() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& q : subs_) q->close();
}

}  // namespace td
