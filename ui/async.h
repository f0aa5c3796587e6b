// Work off the GUI thread with a context object (Qt Creator's Utils::onResultReady idea): `work`
// runs on a fresh QThread; `done` runs later on the context's thread with the result, and never
// runs at all if the context object was destroyed first.
#pragma once

#include <QObject>
#include <QPointer>
#include <QThread>
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

}  // namespace td::ui
