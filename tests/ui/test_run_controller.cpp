// The GUI's RunController when the run fails outside the model: a store that cannot be opened and
// a store that fills up mid-run both end the run as failed (state back to Idle, Start enabled,
// the reason naming the store) instead of leaving the window "Running" forever.
#include <QAction>
#include <QFile>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>

#include "blobs_project.h"
#include "engine/io/project.h"
#include "engine/store/run_store.h"
#include "ui/run_controller.h"

using namespace td::ui;

using tdtest::blobs;

class TestRunController : public QObject {
    Q_OBJECT
  private slots:
    void storeCannotBeOpened();
    void storeFillsDuringRun();
};

void TestRunController::storeCannotBeOpened() {
    QTemporaryDir dir;
    const QString db = dir.filePath("r.db");
    {
        QFile f(db);
        QVERIFY(f.open(QIODevice::WriteOnly));
        QByteArray noise(65536, '\0');
        for (int i = 0; i < noise.size(); ++i) noise[i] = char((i * 2654435761u) >> 13);
        f.write(noise);
    }
    RunController rc;
    QSignalSpy finished(&rc, &RunController::runFinished);
    QString error;
    QVERIFY2(rc.start(blobs(2), db, &error), qPrintable(error));
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 1, 60000);
    const auto result = finished.first().first().value<td::RunFinished>();
    QCOMPARE(result.status, td::RunStatus::Failed);
    const QString message = QString::fromStdString(result.message);
    QVERIFY2(message.contains(db) && message.contains("file is not a database"),
             qPrintable(message));
    QCOMPARE(rc.state(), RunController::State::Idle);
    QVERIFY(rc.startAction()->isEnabled());
    QVERIFY(!rc.stopAction()->isEnabled());
}

void TestRunController::storeFillsDuringRun() {
    QTemporaryDir dir;
    const QString db = dir.filePath("r.db");
    qputenv("TRAINDECK_FAULT_STORE_PAGES", "12");
    RunController rc;
    QSignalSpy finished(&rc, &RunController::runFinished);
    QSignalSpy batches(&rc, &RunController::eventsArrived);
    QString error;
    QVERIFY2(rc.start(blobs(40), db, &error), qPrintable(error));
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 1, 120000);
    qunsetenv("TRAINDECK_FAULT_STORE_PAGES");
    const auto result = finished.first().first().value<td::RunFinished>();
    QCOMPARE(result.status, td::RunStatus::Failed);
    QVERIFY2(!result.storeError.empty(), result.message.c_str());
    QVERIFY2(QString::fromStdString(result.message).contains("database or disk is full"),
             result.message.c_str());
    QCOMPARE(rc.state(), RunController::State::Idle);
    QVERIFY(rc.startAction()->isEnabled());
    // The Monitor's log got the failure as an error line.
    bool logged = false;
    int epochs = 0;
    for (const auto& args : batches) {
        const auto batch = args.first().value<EventBatch>();
        epochs += static_cast<int>(batch.epochs.size());
        for (const auto& l : batch.logs)
            logged = logged || (l.level == td::LogLine::Level::Error &&
                                l.text.find("database or disk is full") != std::string::npos);
    }
    QVERIFY(logged);
    QVERIFY2(epochs < 40, qPrintable(QString::number(epochs)));  // it stopped early
    auto store = td::RunStore::open(db.toStdString());
    QVERIFY(store.ok());
    auto runs = (*store)->listRuns();
    QVERIFY(runs.ok());
    QCOMPARE(runs->size(), size_t(1));
    QCOMPARE(runs->front().status, std::string("failed"));
}

QTEST_MAIN(TestRunController)
#include "test_run_controller.moc"
