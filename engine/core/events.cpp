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
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (closed_) return;
        q_.push_back(std::move(e));
    }
    cv_.notify_one();
}

std::vector<Event> EventQueue::drain() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Event> out(std::make_move_iterator(q_.begin()), std::make_move_iterator(q_.end()));
    q_.clear();
    return out;
}

std::optional<Event> EventQueue::pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !q_.empty() || closed_; });
    if (q_.empty()) return std::nullopt;
    Event e = std::move(q_.front());
    q_.pop_front();
    return e;
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
