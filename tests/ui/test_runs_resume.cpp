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
    // Stopped as soon as it runs: at its first step boundaries, long before its end.
    bool stopSent = false;
    connect(&rc, &RunController::stateChanged, &rc, [&](RunController::State st) {
        if (st != RunController::State::Running || stopSent) return;
        stopSent = true;
        rc.stop();
    });
    QVERIFY2(rc.start(blobs(12), db, &error), qPrintable(error));
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
    rc.disconnect(&rc, &RunController::stateChanged, nullptr, nullptr);
    QVERIFY2(rc.resume(id, db, &error), qPrintable(error));
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 1, 120000);
    const auto result = finished.first().first().value<td::RunFinished>();
    QVERIFY2(result.status == td::RunStatus::Completed, result.message.c_str());
    QCOMPARE(rc.runId(), id);
    auto store = td::RunStore::open(db.toStdString());
    QVERIFY(store.ok());
    QCOMPARE((*store)->listRuns()->size(), size_t(1));
    QCOMPARE((*store)->getRun(id)->status, std::string("completed"));
    QCOMPARE((*store)->epochs(id)->size(), size_t(12));
    // A completed run is not offered for resuming.
    panel.refresh();
    QTRY_VERIFY_WITH_TIMEOUT(!resume->isEnabled(), 10000);
}

QTEST_MAIN(TestRunsResume)
#include "test_runs_resume.moc"
