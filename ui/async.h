// Work off the GUI thread with a context object (Qt Creator's Utils::onResultReady idea): `work`
// runs on a fresh QThread; `done` runs later on the context's thread with the result, and never
// runs at all if the context object was destroyed first.
#pragma once

#include <QMetaObject>
#include <QObject>
#include <QPointer>
#include <QThread>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

namespace td::ui {

template <typename Work, typename Done>
void runAsync(QObject* context, Work work, Done done) {
    using R = std::invoke_result_t<Work>;
    // Qt orders `finished` after the work, but through synchronisation inside QtCore that
    // ThreadSanitizer cannot see; the mutex makes the hand-over of the result explicit.
    struct Slot {
        std::mutex mutex;
        std::optional<R> value;
    };
    auto result = std::make_shared<Slot>();
    QThread* thread = QThread::create([result, w = std::move(work)]() mutable {
        R r = w();
        std::lock_guard lock(result->mutex);
        result->value.emplace(std::move(r));
    });
    QObject::connect(thread, &QThread::finished, context, [result, d = std::move(done)]() mutable {
        std::optional<R> r;
        {
            std::lock_guard lock(result->mutex);
            r = std::move(result->value);
        }
        d(std::move(*r));
    });
    QObject::connect(thread, &QThread::finished, thread, &QObject::deleteLater);
    thread->start();
}

// One long-lived thread that runs jobs in the order they were posted, so state such as a database
// connection can stay on it between jobs. `done` runs on the context's thread with the job's
// result. Destroy the worker before its context (make it a member of the context): the destructor
// waits for the job in progress and drops the jobs not yet started, so no result ever reaches a
// destroyed context.
class SerialWorker {
  public:
    explicit SerialWorker(QObject* context) : context_(context), runner_(new QObject) {
        runner_->moveToThread(&thread_);
        // Deleted on its own thread as that ends; jobs still queued are discarded with it.
        QObject::connect(&thread_, &QThread::finished, runner_, &QObject::deleteLater);
        thread_.start();
    }
    ~SerialWorker() {
        alive_->store(false);
        thread_.quit();
        thread_.wait();
    }
    SerialWorker(const SerialWorker&) = delete;
    SerialWorker& operator=(const SerialWorker&) = delete;

    template <typename Work, typename Done>
    void post(Work work, Done done) {
        using R = std::invoke_result_t<Work>;
        QMetaObject::invokeMethod(
            runner_,
            [context = context_, alive = alive_, w = std::move(work),
             d = std::move(done)]() mutable {
                if (!alive->load()) return;
                auto result = std::make_shared<R>(w());
                // The context outlives this call: its destructor is waiting for it.
                QMetaObject::invokeMethod(
                    context, [result, d] { d(std::move(*result)); }, Qt::QueuedConnection);
            },
            Qt::QueuedConnection);
    }

  private:
    QObject* context_;
    QThread thread_;
    QObject* runner_;
    std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);
};

}  // namespace td::ui
