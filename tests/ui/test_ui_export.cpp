// The GUI's File > Import Keras Model and File > Export Model (MainWindow), offscreen.
#include <QFileInfo>
#include <QTemporaryDir>
#include <QTest>
#include <fstream>

#include "engine/api/export.h"
#include "engine/io/keras_archive.h"
#include "ui/main_window.h"
#include "ui/project_controller.h"

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
};

QTEST_MAIN(TestUiExport)
#include "test_ui_export.moc"
