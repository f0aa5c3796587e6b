// Exact resume of the shipped projects as users run them: `traindeck train`, killed with SIGKILL
// inside an epoch after the first, then `train --resume`, ends with the uninterrupted run's every
// logged loss and final weights, bit for bit. The default project at batch 32 and 256, the wide MLP
// (784-1024-1024-10), the default project with augmentation layers in front (RandomFlip and
// RandomTranslation, keyed by the step and the sample) and the CNN project; the processes see the
// machine's threads as a user's do.
#include <signal.h>

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QRegularExpression>
#include <QtTest>
#include <cstring>
#include <map>

#include "engine/api/runs.h"
#include "engine/backend/backend.h"
#include "engine/store/run_store.h"
#include "engine/train/checkpoint.h"
#include "tests/engine/cli_process.h"

namespace {

// `traindeck ARGS` with the environment a user has (no OMP_NUM_THREADS), stdout read as it comes.
struct Proc {
    QProcess p;
    QString out;
    explicit Proc(const QStringList& args) {
        QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
        env.remove("OMP_NUM_THREADS");
        p.setProcessEnvironment(env);
        p.setProcessChannelMode(QProcess::MergedChannels);
        p.start(td::dev::kBinary, args);
    }
    bool waitFor(const QString& text, int seconds) {
        for (int i = 0; i < seconds * 20 && !out.contains(text); ++i) {
            p.waitForReadyRead(50);
            out += QString::fromUtf8(p.readAll());
            if (p.state() == QProcess::NotRunning) break;
        }
        return out.contains(text) && p.state() == QProcess::Running;
    }
    int finish(int seconds) {
        p.waitForFinished(seconds * 1000);
        out += QString::fromUtf8(p.readAll());
        return p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1;
    }
};

// Every logged loss of run 1, by global step, as stored (the bits of the double).
std::map<int64_t, double> losses(const QString& db) {
    std::map<int64_t, double> out;
    auto store = td::RunStore::open(db.toStdString());
    if (!store.ok()) return out;
    auto rows = (*store)->steps(1);
    if (!rows.ok()) return out;
    for (const td::StepRow& r : *rows) out[r.globalStep] = r.metrics.at("loss");
    return out;
}

}  // namespace

class TestResumeExact : public QObject {
    Q_OBJECT
  private slots:
    void killedAndResumedEqualsUninterrupted_data();
    void killedAndResumedEqualsUninterrupted();
};

void TestResumeExact::killedAndResumedEqualsUninterrupted_data() {
    QTest::addColumn<QString>("project");
    QTest::addColumn<int>("batch");
    QTest::addColumn<int>("epochs");
    QTest::addColumn<bool>("wide");
    QTest::addColumn<bool>("augmented");
    QTest::addColumn<QString>("precision");  // empty: the project's
    // Epochs of the seed MLP last a tenth of a second or two: six of them, so that the kill
    // lands inside the run whatever the machine's speed.
    QTest::newRow("default project, batch 32")
        << "fashion_mnist_mlp.json" << 32 << 6 << false << false << QString();
    QTest::newRow("default project, batch 256")
        << "fashion_mnist_mlp.json" << 256 << 6 << false << false << QString();
    QTest::newRow("wide MLP, batch 256")
        << "fashion_mnist_mlp.json" << 256 << 3 << true << false << QString();
    QTest::newRow("default project with augmentation, batch 256")
        << "fashion_mnist_mlp.json" << 256 << 6 << false << true << QString();
    QTest::newRow("CNN project") << "fashion_mnist_cnn.json" << 0 << 2 << false << false
                                 << QString();
    // Its second convolution in bf16 where the CPU has native bf16 convolutions (the first,
    // over one channel, stays f32); its test accuracy as float32's after two epochs.
    QTest::newRow("CNN project, mixed_bfloat16")
        << "fashion_mnist_cnn.json" << 0 << 2 << false << false << QString("mixed_bfloat16");
}

void TestResumeExact::killedAndResumedEqualsUninterrupted() {
    QFETCH(QString, project);
    QFETCH(int, batch);
    QFETCH(int, epochs);
    QFETCH(bool, wide);
    QFETCH(bool, augmented);
    QFETCH(QString, precision);
#ifdef TD_RESUME_EXACT_SMALL_ONLY
    if (wide || augmented || batch == 0) QSKIP("a sanitizer build: the seed MLP's rows only");
#endif
    if (precision == "mixed_bfloat16" && !td::cpuHalfConvolutions(td::DType::BF16))
        QSKIP("this CPU has no native bf16 convolution (AVX512-BF16 or AMX-BF16)");
    QTemporaryDir dir;
    QString path = td::test::project(project.toUtf8().constData());
    // The 784-1024-1024-10 MLP, augmentation before the Flatten, or another precision.
    if (wide || augmented || !precision.isEmpty()) {
        QFile in(path);
        QVERIFY(in.open(QIODevice::ReadOnly));
        QJsonObject p = QJsonDocument::fromJson(in.readAll()).object();
        QJsonObject model = p["model"].toObject(), config = model["config"].toObject();
        QJsonArray layers;
        for (const QJsonValue l : config["layers"].toArray()) {
            QJsonObject layer = l.toObject();
            if (augmented && layer["class_name"] == "Flatten") {
                layers.append(
                    QJsonObject{{"class_name", "Reshape"},
                                {"config", QJsonObject{{"target_shape", QJsonArray{28, 28, 1}}}}});
                layers.append(QJsonObject{{"class_name", "RandomFlip"},
                                          {"config", QJsonObject{{"mode", "horizontal"}}}});
                layers.append(QJsonObject{
                    {"class_name", "RandomTranslation"},
                    {"config", QJsonObject{{"height_factor", 0.1}, {"width_factor", 0.1}}}});
            }
            if (wide && layer["class_name"] == "Dense" &&
                layer["config"].toObject()["units"] != 10) {
                for (const char* name : {"dense_a", "dense_b"}) {
                    QJsonObject c = layer["config"].toObject();
                    c["units"] = 1024;
                    c["name"] = name;
                    layers.append(QJsonObject{{"class_name", "Dense"}, {"config", c}});
                }
                continue;
            }
            layers.append(layer);
        }
        config["layers"] = layers;
        model["config"] = config;
        p["model"] = model;
        if (!precision.isEmpty()) p["precision"] = precision;
        path = dir.filePath("changed.json");
        QFile out(path);
        QVERIFY(out.open(QIODevice::WriteOnly));
        out.write(QJsonDocument(p).toJson());
    }
    QStringList common{"--epochs", QString::number(epochs), "--plain"};
    if (batch > 0) common << "--batch-size" << QString::number(batch);
    const QString straightDb = dir.filePath("straight.db"), killedDb = dir.filePath("killed.db");

    Proc straight(QStringList{"train", path, "--db", straightDb} + common);
    QVERIFY2(straight.finish(900) == 0, qPrintable(straight.out));
    if (!precision.isEmpty()) {
        // The shipped CNN reaches 0.87-0.89 in float32 after two epochs.
        const QRegularExpressionMatch acc =
            QRegularExpression("test_accuracy: ([0-9.]+)").match(straight.out);
        QVERIFY2(acc.hasMatch() && acc.captured(1).toDouble() > 0.85, qPrintable(straight.out));
    }

    Proc victim(QStringList{"train", path, "--db", killedDb} + common);
    QVERIFY2(victim.waitFor(QString("Epoch 2/%1").arg(epochs), 600), qPrintable(victim.out));
    // A quarter into epoch 2 or later (those steps stored): the killed epoch's steps are trained
    // again from the checkpoint of its start.
    const QRegularExpressionMatch m = QRegularExpression("(\\d+) steps/epoch").match(victim.out);
    QVERIFY2(m.hasMatch(), qPrintable(victim.out));
    const int64_t target = m.captured(1).toLongLong() * 5 / 4;
    QElapsedTimer waited;
    waited.start();
    while (waited.elapsed() < 600000 && victim.p.state() == QProcess::Running) {
        const auto stored = losses(killedDb);
        if (!stored.empty() && stored.rbegin()->first >= target) break;
        QThread::msleep(20);
    }
    QVERIFY2(
        victim.p.state() == QProcess::Running && !losses(killedDb).empty() &&
            losses(killedDb).rbegin()->first < epochs * m.captured(1).toLongLong(),
        qPrintable(QString("the run ended before it could be killed (%1 steps an epoch, "
                           "stored up to step %2)")
                       .arg(m.captured(1))
                       .arg(losses(killedDb).empty() ? -1 : losses(killedDb).rbegin()->first)));
    ::kill(static_cast<pid_t>(victim.p.processId()), SIGKILL);
    QCOMPARE(victim.finish(60), -1);
    QVERIFY2(losses(killedDb).size() < losses(straightDb).size(),
             qPrintable(QString("killed run stored %1 steps (up to %2), the uninterrupted %3")
                            .arg(losses(killedDb).size())
                            .arg(losses(killedDb).empty() ? 0 : losses(killedDb).rbegin()->first)
                            .arg(losses(straightDb).size())));

    Proc resumed({"train", "--resume", "1", "--db", killedDb, "--plain"});
    QVERIFY2(resumed.finish(900) == 0, qPrintable(resumed.out));
    QVERIFY2(resumed.out.contains("resuming from"), qPrintable(resumed.out));

    const auto want = losses(straightDb), got = losses(killedDb);
    QVERIFY(!want.empty());
    QCOMPARE(got.size(), want.size());
    for (const auto& [step, loss] : want) {
        const auto it = got.find(step);
        QVERIFY2(it != got.end(), qPrintable(QString("step %1 missing").arg(step)));
        QVERIFY2(std::memcmp(&it->second, &loss, sizeof loss) == 0,
                 qPrintable(QString("step %1: resumed loss %2, uninterrupted %3")
                                .arg(step)
                                .arg(it->second, 0, 'g', 17)
                                .arg(loss, 0, 'g', 17)));
    }
    auto a = td::api::latestCheckpointForRun(straightDb.toStdString(), 1);
    auto b = td::api::latestCheckpointForRun(killedDb.toStdString(), 1);
    QVERIFY(a.ok() && b.ok());
    auto ma = td::readCheckpointModel(*a), mb = td::readCheckpointModel(*b);
    QVERIFY(ma.ok() && mb.ok());
    QCOMPARE(mb->globalStep, ma->globalStep);
    QCOMPARE(mb->weights.size(), ma->weights.size());
    for (size_t i = 0; i < ma->weights.size(); ++i)
        QVERIFY2(std::memcmp(ma->weights[i].value.raw(), mb->weights[i].value.raw(),
                             ma->weights[i].value.bytes()) == 0,
                 ma->weights[i].name.c_str());
}

QTEST_GUILESS_MAIN(TestResumeExact)
#include "test_resume_exact.moc"
