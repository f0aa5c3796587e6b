// Work off the GUI thread with a context object (Qt Creator's Utils::onResultReady idea): `work`
// runs on a fresh QThread; `done` runs later on the context's thread with the result, and never
// runs at all if the context object was destroyed first.
#pragma once

#include <QObject>
#include <QPointer>
#include <QThread>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace td::ui {

template <typename Work, typename Done>
void runAsync(QObject* context, Work work, Done done) {
    using R = std::invoke_result_t<Work>;
    auto result = std::make_shared<std::optional<R>>();
    QThread* thread =
        QThread::create([result, w = std::move(work)]() mutable { result->emplace(w()); });
    QObject::connect(thread, &QThread::finished, context,
                     [result, d = std::move(done)]() mutable { d(std::move(**result)); });
    QObject::connect(thread, &QThread::finished, thread, &QObject::deleteLater);
    thread->start();
}

}  // namespace td::ui
