// The GUI's File > Import Keras Model and File > Export Model (MainWindow), and the Runs panel's
// Export model (a stored run's latest checkpoint), offscreen.
#include <QFileInfo>
#include <QPushButton>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>
#include <fstream>

#include "engine/api/export.h"
#include "engine/io/keras_archive.h"
#include "engine/io/onnx_export.h"
#include "engine/io/zip_archive.h"
#include "tests/source_dir.h"
#include "ui/main_window.h"
#include "ui/project_controller.h"
#include "ui/runs_panel.h"

using namespace td;

namespace {

ModelWeights weightsFor(const ModelSpec& model, float value) {
    ModelWeights w;
    w.model = model;
    auto layout = weightLayout(model);
    TD_ASSERT(layout.ok());
    for (const LayerWeights& lw : *layout)
        for (const WeightSlot& s : lw.variables) {
            Tensor t(DType::F32, s.shape);
            for (int64_t i = 0; i < t.size(); ++i) t.data<float>()[i] = value * float(i % 7 - 3);
            w.params[s.param] = t;
        }
    return w;
}

// A short run of projects/synthetic_blobs.json into the store `db`; returns the session (its
// trained weights) after fit.
std::unique_ptr<Session> trainBlobs(const std::string& db, const std::string& name,
                                    bool runCheckpoints) {
    auto p = loadProject(std::string(td::dev::kSourceDir) + "/projects/synthetic_blobs.json");
    TD_ASSERT(p.ok());
    p->training.epochs = 2;
    p->training.evaluateTest = false;
    p->training.runCheckpoints = runCheckpoints;
    SessionOptions opt;
    opt.storePath = db;
    opt.runName = name;
    auto s = Session::create(*p, opt);
    if (!s.ok()) qFatal("%s", s.error().c_str());
    if (Status st = (*s)->fit(); !st.ok()) qFatal("%s", st.error().c_str());
    return std::move(s).value();
}

}  // namespace

class TestUiExport : public QObject {
    Q_OBJECT
  private slots:
    void importThenExport() {
        QTemporaryDir dir;
        ui::MainWindow w;
        w.setInteractive(false);
        w.openDefaultProject();
        const Project before = w.projectController()->project();
        QVERIFY(!w.projectController()->isDirty());

        // A Keras file with the default project's model: imported with its weights, in the
        // current data and training setup, unsaved.
        const std::string kerasPath = dir.filePath("model.keras").toStdString();
        QVERIFY(saveKerasArchive(weightsFor(before.model, 0.01f), kerasPath).ok());
        QString error;
        QVERIFY2(w.importKerasModel(QString::fromStdString(kerasPath), &error), qPrintable(error));
        const Project& p = w.projectController()->project();
        QCOMPARE(p.initialWeights, kerasPath);
        QVERIFY(p.model == before.model);
        QCOMPARE(p.data.source.type, before.data.source.type);
        QCOMPARE(p.training.optimizer.name, before.training.optimizer.name);
        QVERIFY(w.projectController()->isDirty());

        // Export: ONNX and .keras by extension; the .keras file reads back with the weights.
        const QString onnx = dir.filePath("m.onnx");
        QVERIFY2(w.exportModelFile(QString::fromStdString(kerasPath), onnx, &error),
                 qPrintable(error));
        int64_t values = 0;
        for (const auto& [name, t] : weightsFor(before.model, 0.01f).params) values += t.size();
        QVERIFY(values > 1000);
        QVERIFY(QFileInfo(onnx).size() > 4 * values);  // every weight an initializer
        const QString keras = dir.filePath("m.keras");
        QVERIFY2(w.exportModelFile(QString::fromStdString(kerasPath), keras, &error),
                 qPrintable(error));
        auto back = loadKerasArchive(keras.toStdString());
        QVERIFY2(back.ok(), back.ok() ? "" : back.error().c_str());
        QCOMPARE(back->weights.params.size(), weightsFor(before.model, 0.01f).params.size());

        // Errors name the file and what was expected; the project stays as it was.
        QVERIFY(
            !w.exportModelFile(QString::fromStdString(kerasPath), dir.filePath("m.txt"), &error));
        QVERIFY2(error.contains("expected a .onnx or .keras file"), qPrintable(error));
        std::ofstream(dir.filePath("bad.keras").toStdString()) << "not a zip";
        QVERIFY(!w.importKerasModel(dir.filePath("bad.keras"), &error));
        QVERIFY2(error.contains("bad.keras: not a zip archive"), qPrintable(error));
        QCOMPARE(w.projectController()->project().initialWeights, kerasPath);
        ModelSpec other = before.model;
        for (LayerSpec& l : other.layers)
            if (l.type == LayerType::Dense) l.units += 3;
        const std::string otherPath = dir.filePath("other.keras").toStdString();
        QVERIFY(saveKerasArchive(weightsFor(other, 0.02f), otherPath).ok());
        QVERIFY(!w.exportModelFile(QString::fromStdString(otherPath), onnx, &error));
        QVERIFY2(error.contains("other.keras: layer") && error.contains("in the file, expected"),
                 qPrintable(error));
    }

    // Runs panel: Export model is offered for a run with a checkpoint and writes the file the
    // (test's) file chooser names; a run without checkpoints gets a disabled button saying why.
    void runsPanelExportsRunModel() {
        QTemporaryDir dir;
        const std::string db = dir.filePath("runs.db").toStdString();
        auto trained = trainBlobs(db, "with checkpoints", true);
        const int64_t id = trained->runId();
        const int64_t offId = trainBlobs(db, "without", false)->runId();

        ui::RunsPanel panel;
        panel.setInteractive(false);
        QString chosen;
        QString askedFor;
        panel.setSaveFileChooser([&](const QString&, const QString& suggested, const QString&) {
            askedFor = suggested;
            return chosen;
        });
        QSignalSpy refreshed(&panel, &ui::RunsPanel::refreshed);
        QSignalSpy exported(&panel, &ui::RunsPanel::modelExported);
        QVERIFY(panel.setDatabasePath(QString::fromStdString(db)));
        QTRY_VERIFY_WITH_TIMEOUT(refreshed.count() > 0, 10000);
        QPushButton* button = panel.exportModelButton();
        QCOMPARE(button->text(), QString("Export model…"));
        QVERIFY(!button->isEnabled());  // nothing selected
        QVERIFY(button->toolTip().contains("Select one run"));

        panel.selectRuns({id});
        QTRY_VERIFY_WITH_TIMEOUT(button->isEnabled(), 10000);
        QVERIFY2(button->toolTip().contains("latest good checkpoint"),
                 qPrintable(button->toolTip()));
        chosen = dir.filePath("blobs.onnx");
        button->click();
        QTRY_COMPARE_WITH_TIMEOUT(exported.count(), 1, 30000);
        QCOMPARE(askedFor, QString("run_%1_with_checkpoints.keras").arg(id));
        QCOMPARE(exported[0][0].value<int64_t>(), id);
        QCOMPARE(exported[0][1].toString(), chosen);
        QVERIFY2(exported[0][3].toString().isEmpty(), qPrintable(exported[0][3].toString()));
        QVERIFY(exported[0][2].toString().endsWith(".tdckpt"));
        auto weights = sessionModelWeights(*trained);
        QVERIFY(weights.ok());
        auto written = readWholeFile(chosen.toStdString(), 1 << 20);
        QVERIFY(written.ok());
        QVERIFY(*written == *onnxModelBytes(*weights));  // the run's trained weights
        chosen = dir.filePath("blobs.keras");
        button->click();
        QTRY_COMPARE_WITH_TIMEOUT(exported.count(), 2, 30000);
        QVERIFY2(exported[1][3].toString().isEmpty(), qPrintable(exported[1][3].toString()));
        auto back = loadKerasArchive(chosen.toStdString());
        QVERIFY2(back.ok(), back.ok() ? "" : back.error().c_str());
        QCOMPARE(back->weights.params.size(), weights->params.size());
        // A cancelled dialog writes nothing; an unknown extension is refused by name.
        chosen.clear();
        button->click();
        QTest::qWait(200);
        QCOMPARE(exported.count(), 2);
        panel.exportModel(id, dir.filePath("blobs.txt"));
        QCOMPARE(exported.count(), 3);
        QVERIFY2(exported[2][3].toString().contains("blobs.txt: expected a .onnx or .keras file"),
                 qPrintable(exported[2][3].toString()));

        // The run without checkpoints: disabled, and the tooltip says why.
        panel.selectRuns({offId});
        QTRY_VERIFY_WITH_TIMEOUT(button->toolTip().contains("training.run_checkpoints off"), 10000);
        QVERIFY(!button->isEnabled());
        panel.selectRuns({id, offId});
        QVERIFY(!button->isEnabled());
    }
};

QTEST_MAIN(TestUiExport)
#include "test_ui_export.moc"
