// Resume from the Runs panel: a stopped run is offered for resuming, and the controller continues
// the same stored run to its end from its checkpoint. Its own suite, outside the ThreadSanitizer
// list (installer/sanitize.sh): the panel hands its store reads to a worker thread through Qt's
// event queue, whose locking inside QtCore TSan cannot see (as for test_ui).
#include <QPushButton>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>

#include "blobs_project.h"
#include "engine/io/project.h"
#include "engine/store/run_store.h"
#include "ui/run_controller.h"
#include "ui/runs_panel.h"

using namespace td::ui;

using tdtest::blobs;

class TestRunsResume : public QObject {
    Q_OBJECT
  private slots:
    void resumeFromRunsPanel();
};

// Stop a run, then Resume it from the Runs panel: the button is offered for the stopped run only,
// and the controller continues the same stored run to its end from its checkpoint.
void TestRunsResume::resumeFromRunsPanel() {
    QTemporaryDir dir;
    const QString db = dir.filePath("r.db");
    RunController rc;
    QSignalSpy finished(&rc, &RunController::runFinished);
    QString error;
    // Stopped once its first steps are logged, long before its end.
    bool stopSent = false;
    connect(&rc, &RunController::eventsArrived, &rc, [&](const EventBatch& b) {
        if (b.steps.empty() || stopSent) return;
        stopSent = true;
        rc.stop();
    });
    QVERIFY2(rc.start(blobs(400), db, &error), qPrintable(error));
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 1, 60000);
    const auto stopped = finished.first().first().value<td::RunFinished>();
    QVERIFY2(stopped.status == td::RunStatus::Stopped, stopped.message.c_str());
    const int64_t id = rc.runId();
    QVERIFY(id > 0);

    RunsPanel panel;
    QSignalSpy refreshed(&panel, &RunsPanel::refreshed);
    QSignalSpy resumeAsked(&panel, &RunsPanel::resumeRequested);
    QVERIFY(panel.setDatabasePath(db));
    QTRY_VERIFY_WITH_TIMEOUT(refreshed.count() > 0, 10000);
    QPushButton* resume = nullptr;
    for (QPushButton* b : panel.findChildren<QPushButton*>())
        if (b->text() == "Resume") resume = b;
    QVERIFY(resume);
    QVERIFY(!resume->isEnabled());  // nothing selected
    panel.selectRuns({id});
    QVERIFY(resume->isEnabled());
    resume->click();
    QCOMPARE(resumeAsked.count(), 1);
    QCOMPARE(resumeAsked.first().first().value<int64_t>(), id);

    finished.clear();
    rc.disconnect(&rc, &RunController::eventsArrived, nullptr, nullptr);
    std::vector<td::StepRow> before;
    {
        auto store = td::RunStore::open(db.toStdString());
        QVERIFY(store.ok());
        before = *(*store)->steps(id);
    }
    QVERIFY(!before.empty());
    // The first batch after RunStarted is the run's stored curves up to its checkpoint, so the
    // Monitor shows the whole run, not only the steps after the resume.
    std::vector<EventBatch> batches;
    int startedAt = -1;
    td::RunStarted started;
    connect(&rc, &RunController::runStarted, &rc, [&](const td::RunStarted& info) {
        startedAt = static_cast<int>(batches.size());
        started = info;
    });
    connect(&rc, &RunController::eventsArrived, &rc,
            [&](const EventBatch& b) { batches.push_back(b); });
    QVERIFY2(rc.resume(id, db, &error), qPrintable(error));
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 1, 120000);
    QVERIFY(startedAt >= 0 && static_cast<size_t>(startedAt) < batches.size());
    const EventBatch& history = batches[static_cast<size_t>(startedAt)];
    QVERIFY(history.history);
    QVERIFY(!history.steps.empty());
    QVERIFY(history.steps.size() <= before.size());
    for (size_t i = 0; i < history.steps.size(); ++i) {
        QCOMPARE(history.steps[i].globalStep, before[i].globalStep);
        QCOMPARE(history.steps[i].metrics.at("loss"), before[i].metrics.at("loss"));
    }
    const td::EpochMetrics* firstEpoch = nullptr;
    for (size_t b = static_cast<size_t>(startedAt) + 1; b < batches.size(); ++b) {
        QVERIFY(!batches[b].history);
        if (!batches[b].steps.empty())
            QVERIFY(batches[b].steps.front().globalStep > history.steps.back().globalStep);
        if (!firstEpoch && !batches[b].epochs.empty()) firstEpoch = &batches[b].epochs.front();
    }
    // Stopped inside an epoch: the resumed epoch says which part of it this run trained, and
    // its rate counts only those samples.
    QVERIFY(firstEpoch);
    const bool midEpoch = started.initialEpoch == firstEpoch->epoch &&
                          history.steps.back().epoch == firstEpoch->epoch;
    if (midEpoch) QVERIFY(firstEpoch->resumedSamples > 0);
    QVERIFY(firstEpoch->resumedSamples < started.trainSamples);
    const auto result = finished.first().first().value<td::RunFinished>();
    QVERIFY2(result.status == td::RunStatus::Completed, result.message.c_str());
    QCOMPARE(rc.runId(), id);
    auto store = td::RunStore::open(db.toStdString());
    QVERIFY(store.ok());
    QCOMPARE((*store)->listRuns()->size(), size_t(1));
    QCOMPARE((*store)->getRun(id)->status, std::string("completed"));
    QCOMPARE((*store)->epochs(id)->size(), size_t(400));
    // A completed run is not offered for resuming.
    panel.refresh();
    QTRY_VERIFY_WITH_TIMEOUT(!resume->isEnabled(), 10000);
}

QTEST_MAIN(TestRunsResume)
#include "test_runs_resume.moc"
