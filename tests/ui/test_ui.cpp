// GUI tests, offscreen: the designer builds a model through its widgets and rejects an invalid
// layer; a short training run fills the charts and lands in the store; Stop and closing the
// window mid-run end the run as "stopped"; a project survives open -> edit -> save -> reload.
#include <qcustomplot.h>
#include <sqlite3.h>

#include <QAction>
#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QItemSelectionModel>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QMenu>
#include <QMenuBar>
#include <QMimeData>
#include <QPlainTextEdit>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>
#include <QRadioButton>
#include <QScrollBar>
#include <QSignalSpy>
#include <QSpinBox>
#include <QSplitter>
#include <QStandardPaths>
#include <QStatusBar>
#include <QTableView>
#include <QTemporaryDir>
#include <QTest>
#include <QThread>
#include <QTimer>
#include <chrono>
#include <functional>
#include <mutex>
#include <set>

#include "engine/api/projects.h"
#include "engine/io/project.h"
#include "engine/store/run_store.h"
#include "tests/source_dir.h"
#include "ui/chart_widget.h"
#include "ui/config_diff.h"
#include "ui/data_panel.h"
#include "ui/file_picker.h"
#include "ui/latency_probe.h"
#include "ui/layer_property_editor.h"
#include "ui/layer_stack_model.h"
#include "ui/main_window.h"
#include "ui/model_designer.h"
#include "ui/monitor_panel.h"
#include "ui/project_checks.h"
#include "ui/project_controller.h"
#include "ui/run_controller.h"
#include "ui/runs_feed.h"
#include "ui/runs_panel.h"
#include "ui/runs_table_model.h"
#include "ui/screenshot_driver.h"
#include "ui/settings.h"
#include "ui/training_panel.h"

using namespace td::ui;

namespace {

// A tiny synthetic classification project: trains in well under a second per epoch.
QString syntheticProject(int epochs, int samples = 512, int logEverySteps = 2) {
    return QString(R"({
  "format": "traindeck-project", "version": 1, "name": "ui test",
  "model": {"class_name": "Sequential", "config": {"name": "tiny", "layers": [
    {"class_name": "InputLayer", "config": {"name": "input_layer", "batch_shape": [null, 8]}},
    {"class_name": "Dense", "config": {"name": "dense", "units": 16, "activation": "relu"}},
    {"class_name": "Dense", "config": {"name": "dense_1", "units": 3, "activation": "softmax"}}]}},
  "data": {"source": {"type": "synthetic", "samples": %2, "test_samples": 64, "shape": [8],
                      "classes": 3, "seed": 3},
           "pipeline": {"map": [], "cache": "memory", "shuffle_buffer": 256, "prefetch": 2},
           "validation_split": 0.25},
  "training": {"epochs": %1, "batch_size": 16, "seed": 7,
               "optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.01}},
               "loss": {"class_name": "SparseCategoricalCrossentropy", "config": {}},
               "metrics": ["accuracy"], "log_every_steps": %3, "evaluate_test": false},
  "precision": "float32", "fusion": true, "strategy": {"type": "one_device"}
})")
        .arg(epochs)
        .arg(samples)
        .arg(logEverySteps);
}

// A VFS in front of the default one that records which threads read database files, so a test
// can tell where a panel's queries run. Installed as the default before any store is opened.
class ReadThreadRecorder {
  public:
    static void install() {
        if (base_) return;
        base_ = sqlite3_vfs_find(nullptr);
        vfs_ = *base_;
        vfs_.zName = "td-read-thread-recorder";
        vfs_.szOsFile = static_cast<int>(sizeof(File)) + base_->szOsFile;
        vfs_.xOpen = &open;
        sqlite3_vfs_register(&vfs_, /*makeDflt=*/1);
    }
    static void start() {
        std::lock_guard<std::mutex> lock(mu_);
        threads_.clear();
        recording_ = true;
    }
    static std::set<QThread*> stop() {
        std::lock_guard<std::mutex> lock(mu_);
        recording_ = false;
        return threads_;
    }

  private:
    struct File {
        sqlite3_file shim;
        sqlite3_file* real() { return reinterpret_cast<sqlite3_file*>(this + 1); }
    };
    static File* self(sqlite3_file* f) { return reinterpret_cast<File*>(f); }
    static void note() {
        std::lock_guard<std::mutex> lock(mu_);
        if (recording_) threads_.insert(QThread::currentThread());
    }
    static int open(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* f, int flags, int* out) {
        File* file = self(f);
        file->shim.pMethods = nullptr;
        const int rc = base_->xOpen(base_, name, file->real(), flags, out);
        if (file->real()->pMethods) {
            std::call_once(methodsOnce_, [&] { makeMethods(file->real()->pMethods); });
            file->shim.pMethods = &methods_;
        }
        return rc;
    }
    // Every call goes to the file's own methods; only the reads are noted.
    static void makeMethods(const sqlite3_io_methods* m) {
        methods_ = *m;
        methods_.xClose = [](sqlite3_file* f) {
            return self(f)->real()->pMethods->xClose(self(f)->real());
        };
        methods_.xRead = [](sqlite3_file* f, void* p, int n, sqlite3_int64 off) {
            note();
            return self(f)->real()->pMethods->xRead(self(f)->real(), p, n, off);
        };
        methods_.xWrite = [](sqlite3_file* f, const void* p, int n, sqlite3_int64 off) {
            return self(f)->real()->pMethods->xWrite(self(f)->real(), p, n, off);
        };
        methods_.xTruncate = [](sqlite3_file* f, sqlite3_int64 n) {
            return self(f)->real()->pMethods->xTruncate(self(f)->real(), n);
        };
        methods_.xSync = [](sqlite3_file* f, int fl) {
            return self(f)->real()->pMethods->xSync(self(f)->real(), fl);
        };
        methods_.xFileSize = [](sqlite3_file* f, sqlite3_int64* n) {
            return self(f)->real()->pMethods->xFileSize(self(f)->real(), n);
        };
        methods_.xLock = [](sqlite3_file* f, int l) {
            return self(f)->real()->pMethods->xLock(self(f)->real(), l);
        };
        methods_.xUnlock = [](sqlite3_file* f, int l) {
            return self(f)->real()->pMethods->xUnlock(self(f)->real(), l);
        };
        methods_.xCheckReservedLock = [](sqlite3_file* f, int* r) {
            return self(f)->real()->pMethods->xCheckReservedLock(self(f)->real(), r);
        };
        methods_.xFileControl = [](sqlite3_file* f, int op, void* a) {
            return self(f)->real()->pMethods->xFileControl(self(f)->real(), op, a);
        };
        methods_.xSectorSize = [](sqlite3_file* f) {
            return self(f)->real()->pMethods->xSectorSize(self(f)->real());
        };
        methods_.xDeviceCharacteristics = [](sqlite3_file* f) {
            return self(f)->real()->pMethods->xDeviceCharacteristics(self(f)->real());
        };
        methods_.xShmMap = [](sqlite3_file* f, int pg, int sz, int ext, void volatile** pp) {
            return self(f)->real()->pMethods->xShmMap(self(f)->real(), pg, sz, ext, pp);
        };
        methods_.xShmLock = [](sqlite3_file* f, int off, int n, int fl) {
            return self(f)->real()->pMethods->xShmLock(self(f)->real(), off, n, fl);
        };
        methods_.xShmBarrier = [](sqlite3_file* f) {
            self(f)->real()->pMethods->xShmBarrier(self(f)->real());
        };
        methods_.xShmUnmap = [](sqlite3_file* f, int del) {
            return self(f)->real()->pMethods->xShmUnmap(self(f)->real(), del);
        };
        methods_.xFetch = [](sqlite3_file* f, sqlite3_int64 off, int n, void** pp) {
            note();
            return self(f)->real()->pMethods->xFetch(self(f)->real(), off, n, pp);
        };
        methods_.xUnfetch = [](sqlite3_file* f, sqlite3_int64 off, void* p) {
            return self(f)->real()->pMethods->xUnfetch(self(f)->real(), off, p);
        };
    }

    static inline sqlite3_vfs* base_ = nullptr;
    static inline sqlite3_vfs vfs_{};
    static inline sqlite3_io_methods methods_{};
    static inline std::once_flag methodsOnce_;
    static inline std::mutex mu_;
    static inline std::set<QThread*> threads_;
    static inline bool recording_ = false;
};

bool writeFile(const QString& path, const QString& text) {
    QFile f(path);
    if (!f.open(QIODevice::WriteOnly | QIODevice::Truncate)) return false;
    return f.write(text.toUtf8()) > 0;
}

// The named child the user sees: a panel that rebuilds a form keeps the old ones until their
// deferred deletion runs, so the newest of that name.
template <typename T>
T* child(QWidget* parent, const char* name) {
    const auto all = parent->findChildren<T*>(QString::fromLatin1(name));
    return all.isEmpty() ? nullptr : all.back();
}

}  // namespace

class TestUi : public QObject {
    Q_OBJECT

  private slots:
    void initTestCase();
    void designerBuildsModelThroughWidgets();
    void designerRejectsInvalidLayer();
    void designerBuildsCnn();
    void designerPaletteHasAugmentationLayers();
    void designerReordersDuplicatesDeletes();
    void propertyEditorValidatesFields();
    void trainingFillsChartsAndStore();
    void monitorShowsGpuFigures();
    void monitorCoalescesReplots();
    void monitorChartsEveryReplica();
    void strategyControlsFollowCapability();
    void failedLaunchKeepsTheStore();
    void dataPanelDescribesPipeline();
    void stopMidRunMarksStopped();
    void closingMidRunMarksStopped();
    void quitQuestionClosesWhenTheRunEnds();
    void dataPreviewGridReflows();
    void dataTabReadsImageFolders();
    void dataTabReadsTfRecordShards();
    void dataTabShowsSamplesAfterAugmentation();
    void monitorSaysWhenInputBound();
    void helpMenuListsShortcutsAndDocumentation();
    void projectRoundTripsUnchanged();
    void configDiffPairsSettings_data();
    void configDiffPairsSettings();
    void chartKeepsUserZoom();
    void chartLegendListsOnlySeriesWithData();
    void chartSmoothsPerStepSeries();
    void runsTableShowsResultsAndChosenColumns();
    void layoutAndHintsForANewUser();
    void undoAndRedoEveryEdit();
    void latencyProbeMeasures();
    void runsPanelFollowsHeadlessRunLive();
    void runsFeedReadsOnlyWhatChanged();
    void runsPanelReadsOffTheGuiThread();
    void runsPanelOverlaysReplicas();
    void screenshotsWaitForPanelData();
    void latencyDuringFashionMnistTraining();

  private:
    std::unique_ptr<MainWindow> makeWindow(const QString& dbName);
    QTemporaryDir dir_;
};

void TestUi::initTestCase() {
    QStandardPaths::setTestModeEnabled(true);
    QCoreApplication::setOrganizationName("TrainDeckTest");
    QCoreApplication::setApplicationName("test_ui");
    QVERIFY(dir_.isValid());
}

std::unique_ptr<MainWindow> TestUi::makeWindow(const QString& dbName) {
    auto w = std::make_unique<MainWindow>();
    w->setInteractive(false);
    QString error;
    bool ok = w->openDatabase(dir_.filePath(dbName), &error);
    if (!ok) qWarning("openDatabase: %s", qPrintable(error));
    w->show();
    w->activateWindow();
    if (!QTest::qWaitForWindowExposed(w.get())) qWarning("window not exposed");
    return w;
}

void TestUi::designerBuildsModelThroughWidgets() {
    auto w = makeWindow("designer.db");
    ProjectController* pc = w->projectController();
    pc->newProject();
    ModelDesigner* d = w->modelDesigner();
    w->tabs()->setCurrentIndex(MainWindow::ModelTab);
    // Clear the stack with the keyboard.
    d->selectRow(0);
    d->stackView()->setFocus();
    for (int i = 0; i < 10 && d->stackModel()->layerCount() > 0; ++i) {
        d->selectRow(0);
        QTest::keyClick(d->stackView(), Qt::Key_Delete);
    }
    QCOMPARE(pc->project().model.layers.size(), size_t(0));

    auto addFromPalette = [&](td::LayerType t) {
        for (int i = 0; i < d->palette()->count(); ++i)
            if (d->palette()->item(i)->data(Qt::UserRole).toInt() == static_cast<int>(t))
                d->palette()->setCurrentRow(i);
        QTest::mouseClick(child<QPushButton>(d, "addLayerButton"), Qt::LeftButton);
    };
    addFromPalette(td::LayerType::Input);
    auto* shape = child<QLineEdit>(d->propertyEditor(), "shapeEdit");
    QVERIFY(shape);
    shape->selectAll();
    QTest::keyClicks(shape, "28, 28");
    QTest::keyClick(shape, Qt::Key_Return);  // applied when finished
    addFromPalette(td::LayerType::Flatten);
    addFromPalette(td::LayerType::Dense);
    auto* units = child<QSpinBox>(d->propertyEditor(), "unitsSpin");
    QVERIFY(units);
    units->selectAll();
    QTest::keyClicks(units, "10");
    QTest::keyClick(units, Qt::Key_Return);  // applied when finished
    QCOMPARE(units->value(), 10);

    QVERIFY2(d->stackModel()->valid(), qPrintable(d->stackModel()->errorText()));
    QCOMPARE(d->stackModel()->info().totalParams, int64_t(784 * 10 + 10));
    const QString summary = d->summaryView()->toPlainText();
    QVERIFY2(summary.contains("7,850") || summary.contains("7850"), qPrintable(summary));
    QVERIFY(summary.contains("memory per sample"));
    QCOMPARE(pc->project().model.layers.size(), size_t(3));
    QCOMPARE(pc->project().model.layers[2].units, int64_t(10));

    // The summary follows edits at once.
    units->selectAll();
    QTest::keyClicks(units, "32");
    QTest::keyClick(units, Qt::Key_Return);  // applied when finished
    QCOMPARE(d->stackModel()->info().totalParams, int64_t(784 * 32 + 32));
    QVERIFY(d->summaryView()->toPlainText().contains("25,120") ||
            d->summaryView()->toPlainText().contains("25120"));
    QVERIFY(pc->isDirty());

    // The compiler's report beside the summary follows the edits too.
    const QString report = d->reportView()->toPlainText();
    QVERIFY2(report.contains("kernels per step"), qPrintable(report));
    QVERIFY(report.contains("fusion groups"));
}

void TestUi::designerRejectsInvalidLayer() {
    auto w = makeWindow("invalid.db");
    ProjectController* pc = w->projectController();
    pc->newProject();  // input 28x28 -> flatten -> dense 10
    ModelDesigner* d = w->modelDesigner();
    QVERIFY(d->stackModel()->valid());
    // Insert Reshape after Flatten and ask for a shape that cannot hold 784 values.
    d->selectRow(1);
    for (int i = 0; i < d->palette()->count(); ++i)
        if (d->palette()->item(i)->data(Qt::UserRole).toInt() ==
            static_cast<int>(td::LayerType::Reshape))
            d->palette()->setCurrentRow(i);
    d->addSelectedPaletteLayer();
    QCOMPARE(d->currentRow(), 2);
    auto* target = child<QLineEdit>(d->propertyEditor(), "targetShapeEdit");
    QVERIFY(target);
    target->selectAll();
    QTest::keyClicks(target, "30, 30");
    QTest::keyClick(target, Qt::Key_Return);  // applied when finished
    QCOMPARE(pc->project().model.layers[2].targetShape, (td::Shape{30, 30}));

    LayerStackModel* m = d->stackModel();
    QVERIFY(!m->valid());
    QCOMPARE(m->errorRow(), 2);
    const QString marked = m->index(2, LayerStackModel::ColOutputShape).data().toString();
    QVERIFY2(marked.contains(m->errorText()), qPrintable(marked));
    QVERIFY(!m->errorText().isEmpty());
    QVERIFY(d->summaryView()->toPlainText().contains(m->errorText()));
    // Start is disabled, and says why.
    QAction* start = w->runController()->startAction();
    QVERIFY(!start->isEnabled());
    QVERIFY2(start->toolTip().contains(m->errorText()), qPrintable(start->toolTip()));
    QVERIFY(!w->runController()->startBlocker().isEmpty());
    QString error;
    QVERIFY(!w->startTraining(&error));
    QVERIFY(error.contains("Cannot start"));

    // Fix it: [784] reshaped to [-1] is valid again and Start comes back.
    target->selectAll();
    QTest::keyClicks(target, "-1");
    QTest::keyClick(target, Qt::Key_Return);  // applied when finished
    QVERIFY(m->valid());
    QCOMPARE(m->errorRow(), -1);
    QVERIFY(w->runController()->startBlocker().isEmpty() ||
            !w->runController()->startBlocker().startsWith("model"));
}

// The image layers from the palette with their property fields; shapes, parameter counts and
// the memory kept for backward in the live summary.
void TestUi::designerBuildsCnn() {
    auto w = makeWindow("cnn.db");
    ProjectController* pc = w->projectController();
    pc->newProject();
    ModelDesigner* d = w->modelDesigner();
    w->tabs()->setCurrentIndex(MainWindow::ModelTab);
    while (d->stackModel()->layerCount() > 0) {
        d->selectRow(0);
        d->stackView()->setFocus();
        QTest::keyClick(d->stackView(), Qt::Key_Delete);
    }
    auto addFromPalette = [&](td::LayerType t) {
        bool found = false;
        for (int i = 0; i < d->palette()->count(); ++i)
            if (d->palette()->item(i)->data(Qt::UserRole).toInt() == static_cast<int>(t)) {
                d->palette()->setCurrentRow(i);
                found = true;
            }
        QVERIFY2(found, td::layerTypeName(t));
        QTest::mouseClick(child<QPushButton>(d, "addLayerButton"), Qt::LeftButton);
    };
    auto type = [&](QLineEdit* e, const char* text) {
        e->selectAll();
        QTest::keyClicks(e, text);
        QTest::keyClick(e, Qt::Key_Return);  // applied when finished
    };
    addFromPalette(td::LayerType::Input);
    type(child<QLineEdit>(d->propertyEditor(), "shapeEdit"), "28, 28, 1");
    addFromPalette(td::LayerType::Rescaling);
    addFromPalette(td::LayerType::Conv2D);  // 32 filters, 3x3, relu
    LayerStackModel* m = d->stackModel();
    QVERIFY2(m->valid(), qPrintable(m->errorText()));
    QCOMPARE(m->index(2, LayerStackModel::ColParams).data().toString(), QString("320"));
    QCOMPARE(m->index(2, LayerStackModel::ColOutputShape).data().toString(),
             QString("(None, 26, 26, 32)"));
    auto* kernel = child<QLineEdit>(d->propertyEditor(), "kernelSizeEdit");
    QVERIFY(kernel);
    type(kernel, "0, 3");
    QVERIFY(d->propertyEditor()->validationMessage().contains("Kernel size"));
    type(kernel, "5, 5");
    QVERIFY(d->propertyEditor()->validationMessage().isEmpty());
    QCOMPARE(m->index(2, LayerStackModel::ColParams).data().toString(), QString("832"));
    auto* padding = child<QComboBox>(d->propertyEditor(), "paddingCombo");
    QVERIFY(padding);
    padding->setCurrentIndex(1);
    emit padding->activated(1);
    QCOMPARE(m->index(2, LayerStackModel::ColOutputShape).data().toString(),
             QString("(None, 28, 28, 32)"));
    addFromPalette(td::LayerType::BatchNormalization);
    QCOMPARE(m->index(3, LayerStackModel::ColParams).data().toString(), QString("128"));
    addFromPalette(td::LayerType::MaxPooling2D);
    addFromPalette(td::LayerType::GlobalAveragePooling2D);
    addFromPalette(td::LayerType::Dense);
    auto* units = child<QSpinBox>(d->propertyEditor(), "unitsSpin");
    units->selectAll();
    QTest::keyClicks(units, "10");
    QTest::keyClick(units, Qt::Key_Return);  // applied when finished
    QVERIFY2(m->valid(), qPrintable(m->errorText()));
    QCOMPARE(m->index(4, LayerStackModel::ColOutputShape).data().toString(),
             QString("(None, 14, 14, 32)"));
    QCOMPARE(m->info().totalParams, int64_t(832 + 128 + 330));
    QCOMPARE(m->info().nonTrainableParams, int64_t(64));
    const QString summary = d->summaryView()->toPlainText();
    QVERIFY2(summary.contains("Non-trainable params: 64"), qPrintable(summary));
    // Kept for backward: the rescaled input and conv output (Conv2D), the normalization's and
    // the pooling's inputs, the Dense input and relu output.
    const double keptKiB = (784 + 25088 + 25088 + 25088 + 32 + 10) * 4 / 1024.0;
    QVERIFY2(summary.contains(QString("training keeps %1 KiB").arg(keptKiB, 0, 'f', 1)),
             qPrintable(summary));
    QCOMPARE(pc->project().model.layers[2].kernelSize, (td::Shape{5, 5}));
    QVERIFY(pc->project().model.layers[2].samePadding);

    // A kernel larger than the image with valid padding: the layer is marked, Start refused.
    d->selectRow(2);
    padding = child<QComboBox>(d->propertyEditor(), "paddingCombo");
    padding->setCurrentIndex(0);
    emit padding->activated(0);
    type(child<QLineEdit>(d->propertyEditor(), "kernelSizeEdit"), "30, 30");
    QVERIFY(!m->valid());
    QCOMPARE(m->errorRow(), 2);
    QVERIFY2(m->errorText().contains("kernel 30x30 is larger than the input 28x28"),
             qPrintable(m->errorText()));
    QVERIFY(!w->runController()->startAction()->isEnabled());
}

// Resizing, CenterCrop and the Random* augmentation layers are in the palette; added after an
// image input they keep or change its shape as Keras does, and their arguments are edited in the
// property form (a factor's range, the fill mode, the target size, the seed).
void TestUi::designerPaletteHasAugmentationLayers() {
    auto w = makeWindow("augment.db");
    ProjectController* pc = w->projectController();
    pc->newProject();
    ModelDesigner* d = w->modelDesigner();
    w->tabs()->setCurrentIndex(MainWindow::ModelTab);
    std::set<int> listed;
    for (int i = 0; i < d->palette()->count(); ++i)
        listed.insert(d->palette()->item(i)->data(Qt::UserRole).toInt());
    for (td::LayerType t :
         {td::LayerType::Resizing, td::LayerType::CenterCrop, td::LayerType::RandomCrop,
          td::LayerType::RandomFlip, td::LayerType::RandomRotation, td::LayerType::RandomZoom,
          td::LayerType::RandomTranslation, td::LayerType::RandomContrast,
          td::LayerType::RandomBrightness})
        QVERIFY2(listed.count(static_cast<int>(t)), td::layerTypeName(t));
    while (d->stackModel()->layerCount() > 0) {
        d->selectRow(0);
        d->stackView()->setFocus();
        QTest::keyClick(d->stackView(), Qt::Key_Delete);
    }
    auto addFromPalette = [&](td::LayerType t) {
        for (int i = 0; i < d->palette()->count(); ++i)
            if (d->palette()->item(i)->data(Qt::UserRole).toInt() == static_cast<int>(t))
                d->palette()->setCurrentRow(i);
        QTest::mouseClick(child<QPushButton>(d, "addLayerButton"), Qt::LeftButton);
    };
    auto type = [&](QLineEdit* e, const char* text) {
        e->selectAll();
        QTest::keyClicks(e, text);
        QTest::keyClick(e, Qt::Key_Return);
    };
    auto setSpin = [](QAbstractSpinBox* box, const char* text) {
        QVERIFY(box);
        box->selectAll();
        QTest::keyClicks(box, text);
        QTest::keyClick(box, Qt::Key_Return);
    };
    addFromPalette(td::LayerType::Input);
    type(child<QLineEdit>(d->propertyEditor(), "shapeEdit"), "28, 28, 1");
    addFromPalette(td::LayerType::RandomRotation);
    setSpin(child<QDoubleSpinBox>(d->propertyEditor(), "factorUpper"), "0.25");
    auto* fill = child<QComboBox>(d->propertyEditor(), "fillModeCombo");
    QVERIFY(fill);
    fill->setCurrentIndex(1);
    emit fill->activated(1);
    type(child<QLineEdit>(d->propertyEditor(), "seedEdit"), "42");
    const td::LayerSpec& rotation = pc->project().model.layers[1];
    QCOMPARE(rotation.factor, (td::FactorRange{-0.1, 0.25}));
    QCOMPARE(rotation.fillMode, td::FillModeKind::Wrap);
    QCOMPARE(rotation.seed, std::optional<uint64_t>(42));
    // A lower end above the upper one is refused with the reason.
    setSpin(child<QDoubleSpinBox>(d->propertyEditor(), "factorLower"), "0.5");
    QVERIFY(d->propertyEditor()->validationMessage().contains("lower value is above"));
    QCOMPARE(pc->project().model.layers[1].factor, (td::FactorRange{-0.1, 0.25}));
    addFromPalette(td::LayerType::Resizing);
    setSpin(child<QSpinBox>(d->propertyEditor(), "heightSpin"), "20");
    addFromPalette(td::LayerType::RandomFlip);
    addFromPalette(td::LayerType::CenterCrop);
    LayerStackModel* m = d->stackModel();
    QVERIFY2(m->valid(), qPrintable(m->errorText()));
    QCOMPARE(m->index(1, LayerStackModel::ColOutputShape).data().toString(),
             QString("(None, 28, 28, 1)"));
    QCOMPARE(m->index(2, LayerStackModel::ColOutputShape).data().toString(),
             QString("(None, 20, 32, 1)"));
    QCOMPARE(m->index(4, LayerStackModel::ColOutputShape).data().toString(),
             QString("(None, 24, 24, 1)"));
    QCOMPARE(m->index(4, LayerStackModel::ColParams).data().toString(), QString("0"));
}

void TestUi::designerReordersDuplicatesDeletes() {
    auto w = makeWindow("reorder.db");
    ProjectController* pc = w->projectController();
    pc->newProject();  // input, flatten, dense
    ModelDesigner* d = w->modelDesigner();
    auto names = [&] {
        QStringList out;
        for (const auto& l : pc->project().model.layers) out << QString::fromStdString(l.name);
        return out;
    };
    QCOMPARE(names(), (QStringList{"input", "flatten", "dense"}));
    d->selectRow(2);
    d->stackView()->setFocus();
    QTest::keyClick(d->stackView(), Qt::Key_D, Qt::ControlModifier);  // duplicate
    QCOMPARE(names(), (QStringList{"input", "flatten", "dense", "dense_1"}));
    QCOMPARE(d->currentRow(), 3);
    QTest::keyClick(d->stackView(), Qt::Key_Up, Qt::ControlModifier);  // move up
    QCOMPARE(names(), (QStringList{"input", "flatten", "dense_1", "dense"}));
    QCOMPARE(d->currentRow(), 2);
    QTest::keyClick(d->stackView(), Qt::Key_Down, Qt::ControlModifier);
    QCOMPARE(names(), (QStringList{"input", "flatten", "dense", "dense_1"}));

    // Drag and drop, as the view delivers it: a row moved onto another, a palette type inserted.
    LayerStackModel* m = d->stackModel();
    std::unique_ptr<QMimeData> rows(m->mimeData({m->index(3, 0)}));
    QVERIFY(m->dropMimeData(rows.get(), Qt::CopyAction, 1, 0, {}));
    QCOMPARE(names(), (QStringList{"input", "dense_1", "flatten", "dense"}));
    QMimeData palette;
    palette.setData(kLayerTypeMime, QByteArray::number(static_cast<int>(td::LayerType::Dropout)));
    QVERIFY(m->dropMimeData(&palette, Qt::CopyAction, 3, 0, {}));
    QCOMPARE(names(), (QStringList{"input", "dense_1", "flatten", "dropout", "dense"}));

    d->selectRow(3);
    QTest::keyClick(d->stackView(), Qt::Key_Delete);
    QCOMPARE(names(), (QStringList{"input", "dense_1", "flatten", "dense"}));
}

void TestUi::propertyEditorValidatesFields() {
    LayerStackModel model;
    td::ModelSpec spec;
    spec.layers = {model.makeLayer(td::LayerType::Input)};
    model.setSpec(spec);
    LayerPropertyEditor editor([&](const QString& n) { return model.nameTaken(n, -1); });
    td::LayerSpec dense = model.makeLayer(td::LayerType::Dense);
    editor.setLayer(dense);
    QSignalSpy edited(&editor, &LayerPropertyEditor::layerEdited);
    auto* name = child<QLineEdit>(&editor, "nameEdit");
    name->selectAll();
    QTest::keyClicks(name, "input_layer");  // taken by the Input layer
    QVERIFY(editor.validationMessage().contains("already"));
    name->selectAll();
    QTest::keyClicks(name, "9bad");
    QVERIFY(editor.validationMessage().contains("Name"));
    // The reason shows right under the field and in its tooltip.
    auto* note = editor.findChild<QLabel*>("fieldNote_nameEdit");
    QVERIFY(note && !note->isHidden() && note->text().contains("Name"));
    QVERIFY(name->toolTip().contains("Name: use letters"));
    name->selectAll();
    QTest::keyClicks(name, "hidden");
    QVERIFY(editor.validationMessage().isEmpty());
    QVERIFY(note->isHidden());
    // A name applies when it is finished, not while it is typed.
    QCOMPARE(edited.count(), 0);
    QTest::keyClick(name, Qt::Key_Return);
    QCOMPARE(edited.count(), 1);
    QCOMPARE(edited.last().first().value<td::LayerSpec>().name, std::string("hidden"));
    // An out-of-range number is refused with its reason, not reverted silently.
    auto* units = child<QSpinBox>(&editor, "unitsSpin");
    QVERIFY(units);
    units->selectAll();
    QTest::keyClicks(units, "0");
    QCOMPARE(edited.count(), 1);  // nothing applied while typing
    QTest::keyClick(units, Qt::Key_Return);
    QCOMPARE(units->value(), 0);
    QVERIFY2(editor.validationMessage().contains("Units"), qPrintable(editor.validationMessage()));
    QCOMPARE(edited.count(), 1);
    units->selectAll();
    QTest::keyClicks(units, "128");
    QTest::keyClick(units, Qt::Key_Return);
    QCOMPARE(edited.count(), 2);
    QCOMPARE(edited.last().first().value<td::LayerSpec>().units, int64_t(128));
    QVERIFY(editor.validationMessage().isEmpty());

    td::Shape s;
    QString error;
    QVERIFY(LayerPropertyEditor::parseShape("28, 28", false, &s, &error));
    QCOMPARE(s, (td::Shape{28, 28}));
    QVERIFY(!LayerPropertyEditor::parseShape("28, -1", false, &s, &error));
    QVERIFY(LayerPropertyEditor::parseShape("-1, 4", true, &s, &error));
    QVERIFY(!LayerPropertyEditor::parseShape("-1, -1", true, &s, &error));
    QVERIFY(error.contains("only one"));
    QVERIFY(!LayerPropertyEditor::parseShape("a, 2", true, &s, &error));
}

// DeviceStats with NVML figures (synthetic: this machine may have no GPU) add one memory and one
// utilisation series per device; devices without figures (CPUs) add none, and a run without any
// keeps the GPU charts hidden.
void TestUi::monitorShowsGpuFigures() {
    auto w = makeWindow("gpu.db");
    RunController* rc = w->runController();
    MonitorPanel* mon = w->monitorPanel();
    w->tabs()->setCurrentIndex(MainWindow::MonitorTab);
    td::RunStarted info;
    info.runId = 1;
    info.epochs = 1;
    info.stepsPerEpoch = 10;
    info.devices = {"cuda:0", "cuda:1"};
    emit rc->runStarted(info);
    QVERIFY(mon->gpuMemoryChart()->isHidden());
    QVERIFY(mon->gpuUtilizationChart()->isHidden());
    for (int step = 1; step <= 3; ++step) {
        EventBatch batch;
        td::StepMetrics s;
        s.epoch = 0;
        s.step = step;
        s.globalStep = step;
        s.metrics = {{"loss", 1.0 / step}};
        batch.steps.push_back(s);
        for (int d = 0; d < 2; ++d) {
            td::DeviceStats ds;
            ds.device = "cuda:" + std::to_string(d) + "/replica " + std::to_string(d);
            ds.memoryUsedBytes = (int64_t(step) + d) << 30;  // GiB
            ds.memoryTotalBytes = int64_t(80) << 30;
            ds.gpuUtilization = d == 0 ? 0.25 * step : -1;  // cuda:1: utilisation unknown
            batch.devices.push_back(ds);
        }
        td::DeviceStats cpu;  // no NVML figures
        cpu.device = "cpu:0";
        batch.devices.push_back(cpu);
        emit rc->eventsArrived(batch);
    }
    QVERIFY(!mon->gpuMemoryChart()->isHidden());
    QVERIFY(!mon->gpuUtilizationChart()->isHidden());
    const int mem0 = mon->seriesIndex("mem/cuda:0/replica 0");
    const int mem1 = mon->seriesIndex("mem/cuda:1/replica 1");
    QVERIFY(mem0 >= 0 && mem1 >= 0);
    QCOMPARE(mon->gpuMemoryChart()->seriesCount(), 2);
    QCOMPARE(mon->gpuMemoryChart()->pointCount(mem0), 3);
    QCOMPARE(mon->gpuMemoryChart()->point(mem1, 2).y(), 4.0);  // step 3 + 1 GiB
    QCOMPARE(mon->gpuMemoryChart()->point(mem1, 2).x(), 0.3);  // at its log point's step
    const int util0 = mon->seriesIndex("util/cuda:0/replica 0");
    QVERIFY(util0 >= 0);
    QCOMPARE(mon->seriesIndex("util/cuda:1/replica 1"), -1);
    QCOMPARE(mon->gpuUtilizationChart()->point(util0, 1).y(), 50.0);  // percent
    QCOMPARE(mon->seriesIndex("mem/cpu:0"), -1);

    // The next run starts without GPU figures: the charts are emptied and hidden again.
    info.devices = {"cpu:0"};
    emit rc->runStarted(info);
    QVERIFY(mon->gpuMemoryChart()->isHidden());
    QCOMPARE(mon->gpuMemoryChart()->seriesCount(), 0);
    QCOMPARE(mon->seriesIndex("mem/cuda:0/replica 0"), -1);
}

void TestUi::trainingFillsChartsAndStore() {
    const QString projectPath = dir_.filePath("train.json");
    QVERIFY(writeFile(projectPath, syntheticProject(2)));
    auto w = makeWindow("train.db");
    QString error;
    QVERIFY2(w->openProject(projectPath, &error), qPrintable(error));
    // The data preview loads in the background when the Data tab is shown.
    QSignalSpy preview(w->dataPanel(), &DataPanel::previewLoaded);
    w->tabs()->setCurrentIndex(MainWindow::DataTab);
    QTRY_VERIFY_WITH_TIMEOUT(preview.count() >= 1, 30000);
    QCOMPARE(preview.last().first().toBool(), true);
    QVERIFY(w->dataPanel()->previewSampleCount() > 0);

    RunController* rc = w->runController();
    QVERIFY2(rc->startBlocker().isEmpty(), qPrintable(rc->startBlocker()));
    QSignalSpy started(rc, &RunController::runStarted);
    QSignalSpy batches(rc, &RunController::eventsArrived);
    QSignalSpy finished(rc, &RunController::runFinished);
    QVERIFY2(w->startTraining(&error), qPrintable(error));
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 120000);
    QCOMPARE(started.count(), 1);
    const auto result = finished.first().first().value<td::RunFinished>();
    QVERIFY2(result.status == td::RunStatus::Completed, result.message.c_str());
    QCOMPARE(rc->state(), RunController::State::Idle);

    MonitorPanel* mon = w->monitorPanel();
    // One device has no all-reduce: the step-time legend does not offer one.
    w->tabs()->setCurrentIndex(MainWindow::MonitorTab);
    w->show();
    mon->stepTimeChart()->fit();
    const QStringList stepParts = mon->stepTimeChart()->legendNames();
    QVERIFY2(stepParts.contains("compute") && !stepParts.contains("all-reduce"),
             qPrintable(stepParts.join(", ")));
    QVERIFY(mon->lossChart()->pointCount(0) > 0);   // per step
    QVERIFY(mon->lossChart()->pointCount(1) == 2);  // per epoch
    QVERIFY(mon->lossChart()->pointCount(2) == 2);  // validation
    QVERIFY(mon->accuracyChart()->pointCount(0) > 0);
    QVERIFY(mon->throughputChart()->pointCount(0) > 0);
    QVERIFY(mon->stepTimeChart()->pointCount(mon->seriesIndex("st/all/compute")) > 0);
    QVERIFY(mon->lastSamplesPerSecond() > 0);
    QCOMPARE(mon->progressBar()->value(), mon->progressBar()->maximum());
    QVERIFY(batches.count() >= 1);
    qInfo("%s", qPrintable(rc->latencyProbe()->report()));

    // The run is in the store, and in the Runs panel.
    auto store = td::RunStore::open(dir_.filePath("train.db").toStdString());
    QVERIFY(store.ok());
    auto runs = store.value()->listRuns();
    QVERIFY(runs.ok());
    QCOMPARE(runs.value().size(), size_t(1));
    QCOMPARE(runs.value()[0].status, std::string("completed"));
    QCOMPARE(runs.value()[0].id, rc->runId());
    auto epochs = store.value()->epochs(rc->runId());
    QVERIFY(epochs.ok());
    QCOMPARE(epochs.value().size(), size_t(2));
    w->runsPanel()->refresh();  // reads on the panel's worker
    QTRY_COMPARE(w->runsPanel()->model()->rowCount(), 1);
    // Overlay the run's curves, and export it.
    w->runsPanel()->view()->selectRow(0);
    QTRY_VERIFY(w->runsPanel()->stepChart()->pointCount(0) > 0);
    QTRY_COMPARE(w->runsPanel()->epochChart()->pointCount(0), 2);
    QVERIFY2(w->runsPanel()->exportCsv(rc->runId(), dir_.filePath("run.csv"), &error),
             qPrintable(error));
    QVERIFY(QFile(dir_.filePath("run.csv")).size() > 0);
    QVERIFY(w->runsPanel()->renameRun(rc->runId(), "renamed"));
    QVERIFY(w->runsPanel()->setNotes(rc->runId(), "a note"));
    QCOMPARE(w->runsPanel()->model()->run(0)->name, std::string("renamed"));
    QCOMPARE(w->runsPanel()->model()->run(0)->notes, std::string("a note"));
    QVERIFY(mon->lossChart()->savePng(dir_.filePath("loss.png")));
    QVERIFY(QFile(dir_.filePath("loss.png")).size() > 0);
}

// Every step is published; the Monitor redraws once per 40 ms drain at most, whatever the rate.
void TestUi::monitorCoalescesReplots() {
    const QString projectPath = dir_.filePath("coalesce.json");
    QVERIFY(writeFile(projectPath, syntheticProject(3, 8192, 1)));
    auto w = makeWindow("coalesce.db");
    QString error;
    QVERIFY2(w->openProject(projectPath, &error), qPrintable(error));
    w->tabs()->setCurrentIndex(MainWindow::MonitorTab);
    RunController* rc = w->runController();
    MonitorPanel* mon = w->monitorPanel();
    QSignalSpy deliveries(rc, &RunController::eventsArrived);
    QSignalSpy finished(rc, &RunController::runFinished);
    QSignalSpy replots(mon->lossChart()->plot(), &QCustomPlot::afterReplot);
    QElapsedTimer clock;
    clock.start();
    QVERIFY2(w->startTraining(&error), qPrintable(error));
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 120000);
    // A run shorter than the replot timer's period ends before its first tick: the chart still
    // redraws on that tick.
    QTRY_VERIFY_WITH_TIMEOUT(replots.count() >= 1, 5000);
    const qint64 elapsedMs = clock.elapsed();
    QCOMPARE(finished.first().first().value<td::RunFinished>().status, td::RunStatus::Completed);
    qint64 events = 0;
    for (const auto& args : deliveries) {
        const auto batch = args.first().value<EventBatch>();
        events += static_cast<qint64>(batch.steps.size() + batch.epochs.size() +
                                      batch.devices.size() + batch.logs.size());
    }
    // 3 epochs of 6144 training rows in batches of 16, every step logged.
    QVERIFY2(events >= 3 * 384, qPrintable(QString::number(events)));
    QCOMPARE(mon->lossChart()->pointCount(0), 3 * 384);
    const qint64 timerBound = elapsedMs / RunController::kDrainIntervalMs + 2;
    qInfo("%lld events in %lld ms: %lld deliveries, %lld loss chart replots", events, elapsedMs,
          static_cast<long long>(deliveries.count()), static_cast<long long>(replots.count()));
    QVERIFY(deliveries.count() >= 1);
    QVERIFY2(deliveries.count() <= events / 10 && deliveries.count() <= timerBound,
             qPrintable(QString("%1 deliveries for %2 events in %3 ms")
                            .arg(deliveries.count())
                            .arg(events)
                            .arg(elapsedMs)));
    QVERIFY(replots.count() >= 1);
    QVERIFY2(replots.count() <= events / 10 && replots.count() <= timerBound,
             qPrintable(QString("%1 replots for %2 events in %3 ms")
                            .arg(replots.count())
                            .arg(events)
                            .arg(elapsedMs)));
}

// Two replicas' figures reach the throughput and step-time charts through the controller's own
// path (queue -> 40 ms drain -> EventBatch -> MonitorPanel), each in its own series.
void TestUi::monitorChartsEveryReplica() {
    auto w = makeWindow("replicas.db");
    w->tabs()->setCurrentIndex(MainWindow::MonitorTab);
    RunController* rc = w->runController();
    MonitorPanel* mon = w->monitorPanel();
    QSignalSpy started(rc, &RunController::runStarted);
    QSignalSpy finished(rc, &RunController::runFinished);

    td::EventBus bus;
    QVERIFY(rc->follow(bus.subscribe()));
    QVERIFY(!rc->follow(bus.subscribe()));  // one run at a time
    td::RunStarted info;
    info.runName = "two replicas";
    info.devices = {"cpu:0", "cpu:1"};
    info.epochs = 1;
    info.stepsPerEpoch = 10;
    info.batchSize = 64;
    bus.publish(info);
    auto replica = [](int r, double sps, double compute, double allReduce, double wait) {
        td::ReplicaStats s;
        s.replica = r;
        s.device = "cpu:" + std::to_string(r);
        s.samplesPerSecond = sps;
        s.computeSeconds = compute;
        s.allReduceSeconds = allReduce;
        s.inputWaitSeconds = wait;
        return s;
    };
    td::StepMetrics a;  // steps 1-2
    a.step = 2;
    a.globalStep = 2;
    a.metrics = {{"loss", 1.5}, {"accuracy", 0.25}};
    a.samplesPerSecond = 3000;
    a.replicas = {replica(0, 1000, 0.010, 0.002, 0.004), replica(1, 2000, 0.020, 0.006, 0.000)};
    td::StepMetrics b;  // steps 3-6; replicas listed out of order
    b.step = 6;
    b.globalStep = 6;
    b.metrics = {{"loss", 1.25}, {"accuracy", 0.5}};
    b.samplesPerSecond = 3600;
    b.replicas = {replica(1, 1900, 0.040, 0.008, 0.004), replica(0, 1700, 0.080, 0.012, 0.020)};
    // mixed_float16: the loss scale and the skipped steps (a skip halved the scale).
    a.lossScale = 32768;
    b.lossScale = 16384;
    b.skippedSteps = 1;
    bus.publish(a);
    bus.publish(b);
    QTRY_COMPARE_WITH_TIMEOUT(mon->throughputChart()->pointCount(mon->seriesIndex("tp/1")), 2,
                              5000);
    QCOMPARE(started.count(), 1);
    ChartWidget* ls = mon->lossScaleChart();
    QVERIFY(!ls->isHidden());
    QCOMPARE(ls->pointCount(mon->seriesIndex("ls")), 2);
    QCOMPARE(ls->point(mon->seriesIndex("ls"), 1), QPointF(0.6, 16384.0));
    QCOMPARE(ls->pointCount(mon->seriesIndex("skip")), 1);
    QCOMPARE(ls->point(mon->seriesIndex("skip"), 0), QPointF(0.6, 1.0));

    // Two replicas: the all-reduce is part of their step time.
    QVERIFY(mon->stepTimeChart()->seriesVisible(mon->seriesIndex("st/all/allreduce")));
    // Throughput: the total and one series per replica, named after its device, drawn as
    // markers of different shapes so replicas with equal figures stay apart.
    ChartWidget* tp = mon->throughputChart();
    QCOMPARE(tp->seriesCount(), 3);
    QVERIFY(tp->seriesVisible(mon->seriesIndex("tp/0")) &&
            tp->seriesVisible(mon->seriesIndex("tp/1")));
    QVERIFY(tp->plot()->graph(mon->seriesIndex("tp/0"))->scatterStyle().shape() !=
            tp->plot()->graph(mon->seriesIndex("tp/1"))->scatterStyle().shape());
    QCOMPARE(tp->seriesName(mon->seriesIndex("tp/0")), QString("cpu:0"));
    QCOMPARE(tp->seriesName(mon->seriesIndex("tp/1")), QString("cpu:1"));
    const QPointF t0 = tp->point(mon->seriesIndex("tp/0"), 0);
    QCOMPARE(t0.x(), 0.2);  // epoch 0, step 2 of 10
    QCOMPARE(t0.y(), 1000.0);
    QCOMPARE(tp->point(mon->seriesIndex("tp/0"), 1).y(), 1700.0);
    QCOMPARE(tp->point(mon->seriesIndex("tp/1"), 0).y(), 2000.0);
    QCOMPARE(tp->point(mon->seriesIndex("tp/1"), 1), QPointF(0.6, 1900.0));
    QCOMPARE(tp->point(mon->seriesIndex("tp/total"), 1).y(), 3600.0);

    // Step time in ms per step: the first event covers 2 steps, the second 4.
    ChartWidget* st = mon->stepTimeChart();
    auto y = [&](const char* key, int i) { return st->point(mon->seriesIndex(key), i).y(); };
    QCOMPARE(st->seriesCount(), 9);  // (mean, replica 0, replica 1) x 3 parts
    QCOMPARE(y("st/0/compute", 0), 5.0);
    QCOMPARE(y("st/0/allreduce", 0), 1.0);
    QCOMPARE(y("st/0/wait", 0), 2.0);
    QCOMPARE(y("st/1/compute", 0), 10.0);
    QCOMPARE(y("st/1/allreduce", 0), 3.0);
    QCOMPARE(y("st/1/wait", 0), 0.0);
    QCOMPARE(y("st/0/compute", 1), 20.0);
    QCOMPARE(y("st/0/allreduce", 1), 3.0);
    QCOMPARE(y("st/0/wait", 1), 5.0);
    QCOMPARE(y("st/1/compute", 1), 10.0);
    QCOMPARE(y("st/1/allreduce", 1), 2.0);
    QCOMPARE(y("st/1/wait", 1), 1.0);
    QCOMPARE(y("st/all/compute", 0), 7.5);
    QCOMPARE(y("st/all/allreduce", 1), 2.5);
    QCOMPARE(y("st/all/wait", 1), 3.0);
    QCOMPARE(st->seriesName(mon->seriesIndex("st/1/allreduce")), QString("cpu:1 all-reduce"));

    // One replica (or the mean) at a time, chosen in the chart's header.
    QComboBox* selector = mon->replicaSelector();
    QVERIFY(selector->isVisibleTo(mon));
    QCOMPARE(selector->count(), 3);
    auto shown = [&] {
        QStringList keys;
        for (const char* g : {"all", "0", "1"})
            for (const char* p : {"compute", "allreduce", "wait"})
                if (st->seriesVisible(mon->seriesIndex(QString("st/%1/%2").arg(g, p))))
                    keys << QString("%1/%2").arg(g, p);
        return keys.join(' ');
    };
    QCOMPARE(shown(), QString("all/compute all/allreduce all/wait"));
    selector->setCurrentIndex(2);
    QCOMPARE(shown(), QString("1/compute 1/allreduce 1/wait"));
    QCOMPARE(st->plot()->legend->itemCount(), 3);
    selector->setCurrentIndex(1);
    QCOMPARE(shown(), QString("0/compute 0/allreduce 0/wait"));

    bus.publish(td::RunFinished{td::RunStatus::Completed, "", {}, 1.0});
    bus.closeAll();
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 1, 5000);
    QCOMPARE(rc->state(), RunController::State::Idle);

    // A run on one device: no selector, the mean is that device.
    td::EventBus single;
    QVERIFY(rc->follow(single.subscribe()));
    info.devices = {"cpu:0"};
    single.publish(info);
    a.replicas.resize(1);
    single.publish(a);
    QTRY_COMPARE_WITH_TIMEOUT(st->pointCount(mon->seriesIndex("st/all/compute")), 1, 5000);
    QVERIFY(!selector->isVisibleTo(mon));
    QCOMPARE(st->seriesCount(), 3);
    QCOMPARE(y("st/all/compute", 0), 5.0);
    QCOMPARE(mon->seriesIndex("st/0/compute"), -1);
    single.publish(td::RunFinished{td::RunStatus::Completed, "", {}, 1.0});
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 2, 5000);
}

// The strategy choices are the engine's (strategyCapability), with its reason under those it
// cannot run; Mirrored shows the CPU replica count, MultiWorkerMirrored its timeout and launch
// command.
void TestUi::strategyControlsFollowCapability() {
    auto w = makeWindow("strategy.db");
    ProjectController* pc = w->projectController();
    TrainingPanel* tp = w->trainingPanel();
    for (const char* type : {"one_device", "mirrored", "multi_worker_mirrored"}) {
        const td::Capability cap = td::strategyCapability(type);
        QRadioButton* b = tp->strategyButton(type);
        QVERIFY(b);
        QCOMPARE(b->isEnabled(), cap.available);
        QLabel* why = tp->strategyReason(type);
        if (cap.available) {
            QVERIFY(!why);
        } else {
            QVERIFY(why);
            QCOMPARE(why->text(), QString::fromStdString(cap.reason));
            QCOMPARE(b->toolTip(), QString::fromStdString(cap.reason));
        }
    }

    auto open = [&](const QString& strategyJson) {
        QString text = syntheticProject(1);
        text.replace(R"("strategy": {"type": "one_device"})", "\"strategy\": " + strategyJson);
        QString error;
        const QString path = dir_.filePath("strategy.json");
        QVERIFY(writeFile(path, text));
        QVERIFY2(w->openProject(path, &error), qPrintable(error));
    };

    open(R"({"type": "mirrored", "replicas": 3})");
    QVERIFY(tp->strategyButton("mirrored")->isChecked());
    QVERIFY(tp->mirroredOptions()->isVisibleTo(tp));
    QVERIFY(!tp->multiWorkerOptions()->isVisibleTo(tp));
    QCOMPARE(tp->replicasSpin()->value(), 3);
    // Batch 16 over 3 replicas.
    QVERIFY2(tp->replicaNote().contains("slices of 5 or 6"), qPrintable(tp->replicaNote()));
    tp->replicasSpin()->setValue(4);
    QCOMPARE(pc->project().strategy.replicas, 4);
    QVERIFY2(tp->replicaNote().contains("4 replicas × 4 samples"), qPrintable(tp->replicaNote()));
    const td::Capability mirrored = td::strategyCapability("mirrored");
    const QString blocker = w->runController()->startBlocker();
    if (mirrored.available) {
        QVERIFY2(blocker.isEmpty(), qPrintable(blocker));
    } else {
        QVERIFY2(blocker.contains(QString::fromStdString(mirrored.reason)), qPrintable(blocker));
    }
    // Back to One device: the project is valid again (the replica count, hidden in that mode,
    // does not block Start), and Mirrored gets its count back.
    tp->strategyButton("one_device")->click();
    QCOMPARE(pc->project().strategy.type, std::string("one_device"));
    QCOMPARE(pc->project().strategy.replicas, 0);
    QVERIFY2(w->runController()->startBlocker().isEmpty(),
             qPrintable(w->runController()->startBlocker()));
    tp->strategyButton("mirrored")->click();
    QCOMPARE(pc->project().strategy.replicas, 4);

    open(R"({"type": "multi_worker_mirrored", "timeout_seconds": 90})");
    QVERIFY(tp->strategyButton("multi_worker_mirrored")->isChecked());
    QVERIFY(!tp->mirroredOptions()->isVisibleTo(tp));
    QVERIFY(tp->multiWorkerOptions()->isVisibleTo(tp));
    QCOMPARE(tp->timeoutSpin()->value(), 90.0);
    const QString db = w->runsPanel()->databasePath();
    QCOMPARE(tp->multiWorkerCommand(),
             QString("mpirun -np 2 traindeck train --db \"%1\" \"%2\"").arg(db, pc->path()));
    tp->launcherCombo()->setCurrentIndex(tp->launcherCombo()->findData("srun"));
    tp->processesSpin()->setValue(4);
    QCOMPARE(tp->multiWorkerCommand(),
             QString("srun --ntasks=4 traindeck train --db \"%1\" \"%2\"").arg(db, pc->path()));
    QCOMPARE(child<QLineEdit>(tp, "multiWorkerCommand")->text(), tp->multiWorkerCommand());
    QVERIFY(child<QLabel>(tp, "multiWorkerSaveNote")->text().isEmpty());  // saved
    tp->timeoutSpin()->setValue(300);
    QCOMPARE(pc->project().strategy.timeoutSeconds, 300.0);
    QVERIFY(!child<QLabel>(tp, "multiWorkerSaveNote")->text().isEmpty());  // edited, not saved
    // The GUI never starts it: its processes run headless.
    QVERIFY(!w->runController()->startBlocker().isEmpty());
}

// `traindeck --db other.db missing.json`: the project does not open, so the store it named is
// not remembered (the next plain launch opens the store it opened before); a launch that opens
// its project remembers its store.
void TestUi::failedLaunchKeepsTheStore() {
    const QString remembered = dir_.filePath("remembered.db"), other = dir_.filePath("other.db");
    Settings::setDatabasePath(remembered);
    {
        MainWindow w;
        w.setInteractive(false);
        QStringList errors;
        QVERIFY(!w.openAtLaunch(other, dir_.filePath("missing.json"), &errors));
        QCOMPARE(errors.size(), 1);
        QVERIFY2(errors[0].contains("missing.json"), qPrintable(errors[0]));
        QCOMPARE(Settings::databasePath(), remembered);
    }
    const QString path = dir_.filePath("launch.json");
    QVERIFY(writeFile(path, syntheticProject(1)));
    MainWindow w;
    w.setInteractive(false);
    QStringList errors;
    QVERIFY(w.openAtLaunch(other, path, &errors));
    QVERIFY2(errors.isEmpty(), qPrintable(errors.join('\n')));
    QCOMPARE(w.runsPanel()->databasePath(), other);
    QCOMPARE(Settings::databasePath(), other);
}

// The preview's pictures fill the pane's width in rows and wrap again when it narrows: no
// sideways scrolling, more pictures per row in a wider pane.
void TestUi::dataPreviewGridReflows() {
    QString project = syntheticProject(1);
    project.replace(R"("batch_shape": [null, 8]}},)",
                    R"("batch_shape": [null, 8, 8]}},
    {"class_name": "Flatten", "config": {"name": "flatten"}},)");
    project.replace(R"("shape": [8],)", R"("shape": [8, 8],)");
    const QString path = dir_.filePath("pictures.json");
    QVERIFY(writeFile(path, project));
    auto w = makeWindow("pictures.db");
    QString error;
    QVERIFY2(w->openProject(path, &error), qPrintable(error));
    w->resize(1400, 900);
    w->show();
    QSignalSpy preview(w->dataPanel(), &DataPanel::previewLoaded);
    w->tabs()->setCurrentIndex(MainWindow::DataTab);
    QTRY_VERIFY_WITH_TIMEOUT(preview.count() >= 1, 30000);
    QVERIFY(preview.last().first().toBool());
    auto* grid = child<QListWidget>(w->dataPanel(), "samplePreview");
    QVERIFY(grid && grid->isVisible() && grid->count() > 8);
    auto firstRow = [&] {
        int n = 0;
        const int top = grid->visualItemRect(grid->item(0)).top();
        for (int i = 0; i < grid->count(); ++i) {
            const QRect r = grid->visualItemRect(grid->item(i));
            if (r.top() != top) break;
            if (r.right() > grid->viewport()->width()) return -1;  // past the pane's edge
            ++n;
        }
        return n;
    };
    QTRY_VERIFY(firstRow() > 1);
    const int wide = firstRow();
    QCOMPARE(grid->horizontalScrollBar()->isVisible(), false);
    w->resize(900, 900);
    QTRY_VERIFY(firstRow() > 0 && firstRow() < wide);
    QCOMPARE(grid->horizontalScrollBar()->isVisible(), false);
    w->resize(1400, 900);
    QTRY_COMPARE(firstRow(), wide);
}

// The shipped image-folder project, on folders its script writes (five images a class): the Data
// tab shows the folder source and its pictures, Start is allowed; a folder that is not there
// blocks Start with a reason, and a folder chosen in the tab becomes the project's.
void TestUi::dataTabReadsImageFolders() {
    const QString folders = dir_.filePath("folders");
    QProcess script;
    script.start(QFile::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3",
                 {QString(td::dev::kSourceDir) + "/projects/make_image_folders.py", "--limit", "5",
                  "--out", folders});
    QVERIFY(script.waitForFinished(120000));
    QVERIFY2(script.exitCode() == 0, script.readAllStandardError().constData());
    QFile shipped(QString(td::dev::kSourceDir) + "/projects/fashion_mnist_folder_cnn.json");
    QVERIFY(shipped.open(QIODevice::ReadOnly));
    QString text = QString::fromUtf8(shipped.readAll());
    text.replace("\"fashion-mnist-png/train\"", "\"" + folders + "/train\"");
    text.replace("\"fashion-mnist-png/test\"", "\"" + folders + "/test\"");
    const QString path = dir_.filePath("folder_project.json");
    QVERIFY(writeFile(path, text));
    auto w = makeWindow("folders.db");
    QString error;
    QVERIFY2(w->openProject(path, &error), qPrintable(error));
    DataPanel* dp = w->dataPanel();
    auto* type = child<QComboBox>(dp, "sourceType");
    QVERIFY(type);
    QCOMPARE(type->currentData().toString(), QString("image_directory"));
    auto* picker = child<FilePicker>(dp, "imageDirectory");
    QVERIFY(picker && picker->isValid());
    QCOMPARE(picker->path(), folders + "/train");
    QSignalSpy preview(dp, &DataPanel::previewLoaded);
    w->tabs()->setCurrentIndex(MainWindow::DataTab);
    QTRY_VERIFY_WITH_TIMEOUT(preview.count() >= 1, 30000);
    QVERIFY(preview.last().first().toBool());
    QVERIFY(dp->previewSampleCount() > 0);
    QVERIFY(child<QListWidget>(dp, "samplePreview")->count() > 0);
    RunController* rc = w->runController();
    QVERIFY2(rc->startBlocker().isEmpty(), qPrintable(rc->startBlocker()));
    // A folder that is not there: Start says which.
    picker->lineEdit()->setText(folders + "/nowhere");
    emit picker->pathEdited(folders + "/nowhere");
    QCOMPARE(w->projectController()->project().data.source.images.directory,
             (folders + "/nowhere").toStdString());
    QVERIFY2(rc->startBlocker().contains("image folder"), qPrintable(rc->startBlocker()));
    QVERIFY(!picker->isValid());
    picker->lineEdit()->setText(folders + "/train");
    emit picker->pathEdited(folders + "/train");
    QVERIFY2(rc->startBlocker().isEmpty(), qPrintable(rc->startBlocker()));
    // Skipping bad files is a choice the project records.
    auto* skip = child<QCheckBox>(dp, "imageSkipBadFiles");
    QVERIFY(skip && !skip->isChecked());
    skip->setChecked(true);
    QVERIFY(w->projectController()->project().data.source.images.skipBadFiles);
    skip->setChecked(false);
    QVERIFY(!w->projectController()->project().data.source.images.skipBadFiles);
}

// The shipped TFRecord project, on shards its script writes (20 images a split): the Data tab
// shows the shards and decoded pictures, Start is allowed; a pattern with no match is refused.
void TestUi::dataTabReadsTfRecordShards() {
    const QString shards = dir_.filePath("shards");
    QProcess script;
    script.start(QFile::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3",
                 {QString(td::dev::kSourceDir) + "/projects/make_tfrecords.py", "--limit", "20",
                  "--shards", "2", "--out", shards});
    QVERIFY(script.waitForFinished(120000));
    QVERIFY2(script.exitCode() == 0, script.readAllStandardError().constData());
    QFile shipped(QString(td::dev::kSourceDir) + "/projects/fashion_mnist_tfrecord_cnn.json");
    QVERIFY(shipped.open(QIODevice::ReadOnly));
    QString text = QString::fromUtf8(shipped.readAll());
    text.replace("\"fashion-mnist-tfrecord/", "\"" + shards + "/");
    const QString path = dir_.filePath("shards_project.json");
    QVERIFY(writeFile(path, text));
    auto w = makeWindow("shards.db");
    QString error;
    QVERIFY2(w->openProject(path, &error), qPrintable(error));
    DataPanel* dp = w->dataPanel();
    auto* type = child<QComboBox>(dp, "sourceType");
    QVERIFY(type);
    QCOMPARE(type->currentData().toString(), QString("tfrecord"));
    auto* files = child<QLineEdit>(dp, "recordFiles");
    QVERIFY(files);
    QCOMPARE(files->text(), shards + "/train-*.tfrecord");
    QCOMPARE(child<QLineEdit>(dp, "recordFeature")->text(), QString("image"));
    QSignalSpy preview(dp, &DataPanel::previewLoaded);
    w->tabs()->setCurrentIndex(MainWindow::DataTab);
    QTRY_VERIFY_WITH_TIMEOUT(preview.count() >= 1, 30000);
    QVERIFY(preview.last().first().toBool());
    QCOMPARE(dp->previewSampleCount(), 20);
    QVERIFY(child<QListWidget>(dp, "samplePreview")->count() > 0);
    RunController* rc = w->runController();
    QVERIFY2(rc->startBlocker().isEmpty(), qPrintable(rc->startBlocker()));
    auto* skip = child<QCheckBox>(dp, "recordSkipBadFiles");
    QVERIFY(skip && !skip->isChecked());
    skip->setChecked(true);
    QVERIFY(w->projectController()->project().data.source.records.skipBadFiles);
    // The cache before the decode: "cache", "decode" lead the map steps, scaling stays after.
    auto* encoded = child<QCheckBox>(dp, "cacheEncoded");
    QVERIFY(encoded && encoded->isEnabled() && !encoded->isChecked());
    encoded->setChecked(true);
    auto ops = [&] {
        QStringList out;
        for (const td::MapStep& m : w->projectController()->project().data.pipeline.map)
            out << QString::fromStdString(m.op);
        return out;
    };
    QVERIFY2(ops().mid(0, 2) == QStringList({"cache", "decode"}), qPrintable(ops().join(",")));
    QVERIFY(ops().contains("scale") && ops().indexOf("scale") > 1);
    QVERIFY2(td::api::validateProject(w->projectController()->project()).ok(),
             td::api::validateProject(w->projectController()->project()).error().c_str());
    encoded->setChecked(false);
    QVERIFY(!ops().contains("decode") && !ops().contains("cache"));
    // Where the decode and the cache sit: at load for a memory cache, else on the map workers.
    QVERIFY2(dp->pipelineDescription().startsWith(
                 "tfrecord (decoded at load, every core) → cache (memory) → shuffle"),
             qPrintable(dp->pipelineDescription()));
    auto* cache = child<QComboBox>(dp, "cache");
    QVERIFY(cache);
    cache->setCurrentIndex(cache->findData("none"));
    emit cache->activated(cache->currentIndex());
    QVERIFY2(dp->pipelineDescription().startsWith(
                 "tfrecord → decode + resize (AUTOTUNE workers, every epoch) → shuffle"),
             qPrintable(dp->pipelineDescription()));
    // A pattern that matches nothing: the preview says which.
    files->setText(shards + "/nothing-*.tfrecord");
    emit files->editingFinished();
    QCOMPARE(w->projectController()->project().data.source.records.files,
             std::vector<std::string>{(shards + "/nothing-*.tfrecord").toStdString()});
    QTRY_VERIFY_WITH_TIMEOUT(preview.count() >= 2 && !preview.last().first().toBool(), 30000);
    cache->setCurrentIndex(cache->findData("memory"));
    emit cache->activated(cache->currentIndex());
    encoded->setChecked(true);
    // A source read whole cannot have a decode step: switching to one drops the pair.
    type->setCurrentIndex(type->findData("synthetic"));
    emit type->activated(type->currentIndex());
    QVERIFY2(!ops().contains("decode"), qPrintable(ops().join(",")));
    QVERIFY(!encoded->isEnabled());
}

// The shipped augmented image-folder project (RandomFlip, RandomTranslation and RandomZoom after
// the input), on folders its script writes: "After augmentation" shows the same samples as the
// training step's layers change them, the next draw changes them again, and unticking brings the
// source's pictures back. A Resizing added while it is on gives pictures of its size; a model
// without such layers has the toggle off, saying why.
void TestUi::dataTabShowsSamplesAfterAugmentation() {
    const QString folders = dir_.filePath("augment_folders");
    QProcess script;
    script.start(QFile::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3",
                 {QString(td::dev::kSourceDir) + "/projects/make_image_folders.py", "--limit", "5",
                  "--out", folders});
    QVERIFY(script.waitForFinished(120000));
    QVERIFY2(script.exitCode() == 0, script.readAllStandardError().constData());
    QFile shipped(QString(td::dev::kSourceDir) +
                  "/projects/fashion_mnist_folder_cnn_augmented.json");
    QVERIFY(shipped.open(QIODevice::ReadOnly));
    QString text = QString::fromUtf8(shipped.readAll());
    text.replace("\"fashion-mnist-png/train\"", "\"" + folders + "/train\"");
    text.replace("\"fashion-mnist-png/test\"", "\"" + folders + "/test\"");
    const QString path = dir_.filePath("augmented_project.json");
    QVERIFY(writeFile(path, text));
    auto w = makeWindow("augment.db");
    QString error;
    QVERIFY2(w->openProject(path, &error), qPrintable(error));
    DataPanel* dp = w->dataPanel();
    QSignalSpy preview(dp, &DataPanel::previewLoaded);
    QSignalSpy augmented(dp, &DataPanel::augmentedPreviewLoaded);
    w->tabs()->setCurrentIndex(MainWindow::DataTab);
    QTRY_VERIFY_WITH_TIMEOUT(preview.count() >= 1, 30000);
    QVERIFY(preview.last().first().toBool());
    auto* toggle = child<QCheckBox>(dp, "augmentPreview");
    auto* next = child<QPushButton>(dp, "augmentNextDraw");
    auto* grid = child<QListWidget>(dp, "samplePreview");
    auto* status = child<QLabel>(dp, "previewStatus");
    QVERIFY(toggle && next && grid && status);
    QVERIFY(toggle->isEnabled());
    QVERIFY(!toggle->isChecked());
    QVERIFY(!next->isEnabled());
    QVERIFY2(toggle->toolTip().contains("random_flip, random_translation, random_zoom"),
             qPrintable(toggle->toolTip()));
    auto icons = [&] {
        QList<QImage> out;
        for (int i = 0; i < grid->count(); ++i)
            out << grid->item(i)->icon().pixmap(QSize(56, 56)).toImage();
        return out;
    };
    auto differing = [](const QList<QImage>& a, const QList<QImage>& b) {
        int n = 0;
        for (int i = 0; i < std::min(a.size(), b.size()); ++i) n += a[i] != b[i] ? 1 : 0;
        return n;
    };
    const QList<QImage> source = icons();
    QCOMPARE(source.size(), 45);  // 50 files, 10% held out for validation
    const QString label3 = grid->item(3)->text();
    QVERIFY(!label3.isEmpty());

    // On: the same samples, changed by the layers' draws (flipped, shifted, zoomed).
    toggle->click();
    QVERIFY(next->isEnabled());
    QTRY_VERIFY_WITH_TIMEOUT(augmented.count() >= 1, 30000);
    QVERIFY2(augmented.last().first().toBool(), qPrintable(status->text()));
    QVERIFY(dp->augmentedShown());
    const QList<QImage> first = icons();
    QCOMPARE(first.size(), source.size());
    QVERIFY2(differing(source, first) > source.size() / 2,
             qPrintable(QString("%1 changed").arg(differing(source, first))));
    QVERIFY2(status->text().contains("draw 0"), qPrintable(status->text()));
    QVERIFY2(grid->item(0)->toolTip().contains("28×28, after augmentation"),
             qPrintable(grid->item(0)->toolTip()));
    QCOMPARE(grid->item(3)->text(), label3);  // the same sample, with its label

    // The next draw: the same samples drawn anew.
    next->click();
    QTRY_VERIFY_WITH_TIMEOUT(augmented.count() >= 2, 30000);
    QVERIFY(augmented.last().first().toBool());
    QCOMPARE(dp->augmentDraw(), uint64_t{1});
    QVERIFY(differing(first, icons()) > 0);
    QVERIFY2(status->text().contains("draw 1"), qPrintable(status->text()));

    // Off: the source's pictures again, exactly.
    toggle->click();
    QVERIFY(!dp->augmentedShown());
    QVERIFY(!next->isEnabled());
    QCOMPARE(differing(source, icons()), 0);
    QCOMPARE(icons().size(), source.size());

    // On again, then a Resizing in front of the augmentation: the pictures take its size.
    toggle->click();
    QTRY_VERIFY_WITH_TIMEOUT(augmented.count() >= 3, 30000);
    w->projectController()->edit([](td::Project& p) {
        td::LayerSpec resize;
        resize.type = td::LayerType::Resizing;
        resize.name = "resizing";
        resize.targetHeight = 20;
        resize.targetWidth = 36;
        p.model.layers.insert(p.model.layers.begin() + 1, resize);
    });
    QTRY_VERIFY_WITH_TIMEOUT(augmented.count() >= 4, 30000);
    QVERIFY2(augmented.last().first().toBool(), qPrintable(status->text()));
    QVERIFY2(status->text().contains("of 20×36"), qPrintable(status->text()));
    QVERIFY2(grid->item(0)->toolTip().contains("20×36"), qPrintable(grid->item(0)->toolTip()));
    QCOMPARE(grid->item(0)->icon().pixmap(QSize(56, 56)).size(), QSize(56, 31));

    // No preprocessing or augmentation layers left: the toggle is off and says why.
    w->projectController()->edit([](td::Project& p) {
        std::erase_if(p.model.layers,
                      [](const td::LayerSpec& l) { return td::isImagePreprocessingLayer(l.type); });
    });
    QVERIFY(!toggle->isEnabled());
    QVERIFY(!toggle->isChecked());
    QVERIFY(!next->isEnabled());
    QVERIFY(!dp->augmentedShown());
    QVERIFY2(toggle->toolTip().contains("no preprocessing or augmentation layers"),
             qPrintable(toggle->toolTip()));
    QVERIFY2(toggle->toolTip().contains("'conv2d' (Conv2D)"), qPrintable(toggle->toolTip()));
    QCOMPARE(differing(source, icons()), 0);
}

// An input-bound epoch is said above the charts, with its share and the change that would help,
// until an epoch that is not; a new run starts without it.
void TestUi::monitorSaysWhenInputBound() {
    auto w = makeWindow("bound.db");
    RunController* rc = w->runController();
    MonitorPanel* mon = w->monitorPanel();
    w->tabs()->setCurrentIndex(MainWindow::MonitorTab);
    w->show();
    td::RunStarted info;
    info.runId = 1;
    info.epochs = 3;
    info.stepsPerEpoch = 10;
    info.devices = {"cpu:0"};
    emit rc->runStarted(info);
    auto* label = child<QLabel>(mon, "inputBound");
    QVERIFY(label && label->isHidden());
    auto epoch = [&](int e, double wait, const std::string& advice) {
        EventBatch batch;
        td::EpochMetrics em;
        em.epoch = e;
        em.seconds = 2.0;
        em.samplesPerSecond = 1000;
        em.metrics = {{"loss", 0.5}};
        em.inputWaitSeconds = wait;
        em.inputBoundAdvice = advice;
        batch.epochs.push_back(em);
        emit rc->eventsArrived(batch);
    };
    epoch(0, 1.3, "a cache after the decode and map steps");
    QVERIFY(label->isVisible());
    QVERIFY2(label->text().contains("epoch 1 spent 65% of its step time waiting for data") &&
                 label->text().contains("a cache after the decode and map steps"),
             qPrintable(label->text()));
    epoch(1, 0.01, "");
    QVERIFY(label->isHidden());
    epoch(2, 1.0, "more map workers");
    QVERIFY(label->isVisible());
    emit rc->runStarted(info);
    QVERIFY(label->isHidden());
}

void TestUi::dataPanelDescribesPipeline() {
    auto w = makeWindow("pipeline.db");
    const QString path = dir_.filePath("pipeline.json");
    QVERIFY(writeFile(path, syntheticProject(1)));
    QString error;
    QVERIFY2(w->openProject(path, &error), qPrintable(error));
    DataPanel* dp = w->dataPanel();
    QCOMPARE(dp->pipelineDescription(),
             QString("synthetic → cache (memory) → shuffle (buffer 256, each epoch) → batch 16 → "
                     "prefetch (2); validation on the last 25% of the training samples"));
    auto* batch = child<QSpinBox>(dp, "batchSize");
    QVERIFY(batch);
    batch->setValue(32);
    QVERIFY2(dp->pipelineDescription().contains("→ batch 32 →"),
             qPrintable(dp->pipelineDescription()));

    // Numbers keep their value when something else on the tab is edited: 1/255 and a
    // validation split of 1/3 are not rewritten as the spin boxes' 0.00392157 and 0.333.
    QString text = syntheticProject(1);
    text.replace(R"("map": [])", R"("map": [{"op": "scale", "factor": 0.00392156862745098}])");
    text.replace(R"("validation_split": 0.25)", R"("validation_split": 0.3333333333333333)");
    QVERIFY(writeFile(path, text));
    QVERIFY2(w->openProject(path, &error), qPrintable(error));
    batch->setValue(64);
    const td::Project& p = w->projectController()->project();
    QCOMPARE(p.training.batchSize, int64_t(64));
    QCOMPARE(p.data.pipeline.map.at(0).factor, 1.0 / 255.0);
    QCOMPARE(p.data.validationSplit, 1.0 / 3.0);
    // A value the user changes is the box's.
    auto* scale = dp->findChild<QDoubleSpinBox*>("scaleFactor");
    QVERIFY(scale);
    scale->setValue(0.5);
    QCOMPARE(w->projectController()->project().data.pipeline.map.at(0).factor, 0.5);
}

void TestUi::stopMidRunMarksStopped() {
    const QString projectPath = dir_.filePath("long.json");
    QVERIFY(writeFile(projectPath, syntheticProject(1000, 2048)));
    auto w = makeWindow("stop.db");
    QString error;
    QVERIFY2(w->openProject(projectPath, &error), qPrintable(error));
    RunController* rc = w->runController();
    QSignalSpy finished(rc, &RunController::runFinished);
    QVERIFY2(w->startTraining(&error), qPrintable(error));
    QTRY_VERIFY_WITH_TIMEOUT(w->monitorPanel()->lossChart()->pointCount(0) > 5, 60000);
    // Pause and resume are honoured, and the progress line says so.
    rc->pauseAction()->trigger();
    QCOMPARE(rc->state(), RunController::State::Paused);
    auto* progressLabel = child<QLabel>(w->monitorPanel(), "progressLabel");
    QVERIFY(progressLabel);
    QVERIFY2(progressLabel->text().startsWith("Paused"), qPrintable(progressLabel->text()));
    rc->pauseAction()->trigger();
    QVERIFY2(!progressLabel->text().startsWith("Paused"), qPrintable(progressLabel->text()));
    QCOMPARE(rc->state(), RunController::State::Running);
    rc->stopAction()->trigger();
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 30000);
    const auto result = finished.first().first().value<td::RunFinished>();
    QCOMPARE(result.status, td::RunStatus::Stopped);
    auto store = td::RunStore::open(dir_.filePath("stop.db").toStdString());
    QVERIFY(store.ok());
    auto run = store.value()->getRun(rc->runId());
    QVERIFY(run.ok());
    QCOMPARE(run.value().status, std::string("stopped"));
    QVERIFY(rc->startAction()->isEnabled());
}

void TestUi::closingMidRunMarksStopped() {
    const QString projectPath = dir_.filePath("close.json");
    QVERIFY(writeFile(projectPath, syntheticProject(1000, 2048)));
    auto w = makeWindow("close.db");
    QString error;
    QVERIFY2(w->openProject(projectPath, &error), qPrintable(error));
    QVERIFY2(w->startTraining(&error), qPrintable(error));
    QTRY_VERIFY_WITH_TIMEOUT(w->monitorPanel()->lossChart()->pointCount(0) > 2, 60000);
    const int64_t id = w->runController()->runId();
    QVERIFY(id > 0);
    QVERIFY(w->close());
    QCOMPARE(w->runController()->state(), RunController::State::Idle);
    auto store = td::RunStore::open(dir_.filePath("close.db").toStdString());
    QVERIFY(store.ok());
    auto run = store.value()->getRun(id);
    QVERIFY(run.ok());
    QCOMPARE(run.value().status, std::string("stopped"));
}

// Closing mid-run asks whether to stop the run; when the run ends while the question is open,
// the question answers itself and the window closes.
void TestUi::quitQuestionClosesWhenTheRunEnds() {
    const QString projectPath = dir_.filePath("quit.json");
    QVERIFY(writeFile(projectPath, syntheticProject(1000, 2048)));
    auto w = makeWindow("quit.db");
    QString error;
    QVERIFY2(w->openProject(projectPath, &error), qPrintable(error));
    QVERIFY2(w->startTraining(&error), qPrintable(error));
    QTRY_VERIFY_WITH_TIMEOUT(w->monitorPanel()->lossChart()->pointCount(0) > 2, 60000);
    w->setInteractive(true);
    bool sawQuestion = false;
    RunController* rc = w->runController();
    // Once the question is up, the run ends by itself (here: stopped from elsewhere).
    std::function<void()> whenAsked = [&] {
        QWidget* modal = QApplication::activeModalWidget();
        if (modal && modal->objectName() == "quitDuringRun") {
            sawQuestion = true;
            rc->stop();
            return;
        }
        QTimer::singleShot(20, whenAsked);
    };
    QTimer::singleShot(20, whenAsked);
    QVERIFY(w->close());
    QVERIFY(sawQuestion);
    QCOMPARE(rc->state(), RunController::State::Idle);
    w->setInteractive(false);
}

void TestUi::helpMenuListsShortcutsAndDocumentation() {
    auto w = makeWindow("help.db");
    const QString keys = w->shortcutsText();
    QVERIFY2(keys.contains("F5") && keys.contains("Start"), qPrintable(keys));
    QVERIFY2(keys.contains("Ctrl+S") && keys.contains("Save"), qPrintable(keys));
    QVERIFY2(keys.contains("Alt+4") && keys.contains("Monitor"), qPrintable(keys));
    const QString readme = MainWindow::documentationPath();
    QVERIFY2(readme.endsWith("README.md") && QFileInfo::exists(readme), qPrintable(readme));
    bool hasHelp = false;
    for (QAction* a : w->menuBar()->actions())
        if (a->text().remove('&') == "Help" && a->menu()) {
            QStringList items;
            for (QAction* i : a->menu()->actions()) items << i->text().remove('&');
            hasHelp = items.contains("Documentation") && items.contains("Keyboard Shortcuts");
        }
    QVERIFY(hasHelp);
    // The status bar carries no measurement outside the latency mode.
    auto* latency = w->findChild<QLabel*>("latencyLabel");
    QVERIFY(latency);
    QVERIFY(latency->isHidden());
}

void TestUi::projectRoundTripsUnchanged() {
    const QString source = QString(td::dev::kSourceDir) + "/projects/fashion_mnist_mlp.json";
    auto w = makeWindow("project.db");
    ProjectController* pc = w->projectController();
    QString error;
    QVERIFY2(w->openProject(source, &error), qPrintable(error));
    QVERIFY(!pc->isDirty());
    const std::string original = td::projectToJson(pc->project());

    // Save unchanged and reload: identical.
    const QString copy = dir_.filePath("copy.json");
    QVERIFY2(pc->saveAs(copy, &error), qPrintable(error));
    QVERIFY2(w->openProject(copy, &error), qPrintable(error));
    QCOMPARE(td::projectToJson(pc->project()), original);

    // Edit through the widgets, save, reload: the edit is kept and nothing else moved.
    auto* epochs = child<QSpinBox>(w->trainingPanel(), "epochs");
    QVERIFY(epochs);
    epochs->setValue(3);
    QVERIFY(pc->isDirty());
    QVERIFY(w->windowTitle().contains("[*]"));
    auto* units = static_cast<QSpinBox*>(nullptr);
    w->modelDesigner()->selectRow(2);  // dense
    units = child<QSpinBox>(w->modelDesigner()->propertyEditor(), "unitsSpin");
    QVERIFY(units);
    units->setValue(64);
    const std::string edited = td::projectToJson(pc->project());
    QVERIFY2(pc->save(&error), qPrintable(error));
    QVERIFY(!pc->isDirty());
    QVERIFY2(w->openProject(copy, &error), qPrintable(error));
    QCOMPARE(td::projectToJson(pc->project()), edited);
    QCOMPARE(pc->project().training.epochs, 3);
    QCOMPARE(pc->project().model.layers[2].units, int64_t(64));
    td::Project expected = td::parseProject(original).value();
    expected.training.epochs = 3;
    expected.model.layers[2].units = 64;
    QCOMPARE(td::projectToJson(pc->project()), td::projectToJson(expected));

    // Editing back to the saved value clears the dirty flag.
    epochs->setValue(4);
    QVERIFY(pc->isDirty());
    epochs->setValue(3);
    QVERIFY(!pc->isDirty());

    // A broken file is rejected with the engine's message naming it.
    const QString broken = dir_.filePath("broken.json");
    QVERIFY(writeFile(broken, "{\"format\": \"traindeck-project\", \"model\": 3}"));
    QVERIFY(!w->openProject(broken, &error));
    QVERIFY2(!error.isEmpty(), "no error message");
    QCOMPARE(td::projectToJson(pc->project()), edited);  // the open project is untouched

    // A Keras model with a mixed-precision layer opens, and the status bar says what is ignored.
    QJsonObject mixed = QJsonDocument::fromJson(QByteArray::fromStdString(edited)).object();
    QJsonObject model = mixed["model"].toObject(), config = model["config"].toObject();
    QJsonArray layers = config["layers"].toArray();
    QJsonObject dense = layers[2].toObject(), denseConfig = dense["config"].toObject();
    denseConfig["dtype"] = QJsonObject{{"class_name", "DTypePolicy"},
                                       {"config", QJsonObject{{"name", "mixed_float16"}}}};
    dense["config"] = denseConfig;
    layers[2] = dense;
    config["layers"] = layers;
    model["config"] = config;
    mixed["model"] = model;
    const QString mixedPath = dir_.filePath("mixed.json");
    QVERIFY(writeFile(mixedPath, QString::fromUtf8(QJsonDocument(mixed).toJson())));
    QVERIFY2(w->openProject(mixedPath, &error), qPrintable(error));
    const QString status = w->statusBar()->currentMessage();
    QVERIFY2(status.startsWith("Opened with 1 warning(s): model.config.layers[2].config.dtype") &&
                 status.contains("'mixed_float16' is not applied"),
             qPrintable(status));
}

void TestUi::configDiffPairsSettings_data() {
    QTest::addColumn<QString>("left");
    QTest::addColumn<QString>("right");
    QTest::addColumn<int>("rows");
    QTest::addColumn<int>("differing");
    QTest::newRow("same") << R"({"a": 1, "b": {"c": "x"}})"
                          << R"({"a": 1, "b": {"c": "x"}})" << 2 << 0;
    QTest::newRow("changed") << R"({"a": 1, "b": {"c": "x"}})"
                             << R"({"a": 2, "b": {"c": "x"}})" << 2 << 1;
    QTest::newRow("added") << R"({"a": [1, 2]})"
                           << R"({"a": [1, 2, 3]})" << 3 << 1;
    QTest::newRow("invalid") << "{"
                             << R"({"a": 1})" << 2 << 2;
}

void TestUi::configDiffPairsSettings() {
    QFETCH(QString, left);
    QFETCH(QString, right);
    QFETCH(int, rows);
    QFETCH(int, differing);
    auto out = diffJsonConfigs(left, right);
    QCOMPARE(static_cast<int>(out.size()), rows);
    int d = 0;
    for (const auto& r : out) d += r.differs;
    QCOMPARE(d, differing);
}

void TestUi::chartKeepsUserZoom() {
    ChartWidget chart("test", "x", "y");
    chart.resize(400, 300);
    chart.show();
    int s = chart.addSeries("s", Qt::blue);
    for (int i = 0; i < 10; ++i) chart.append(s, i, i * i);
    chart.replotIfDirty();
    QVERIFY(chart.autoFit());
    QCOMPARE(chart.pointCount(s), 10);
    // A wheel or drag by the user freezes the view; new data do not move it.
    QTest::mousePress(chart.plot(), Qt::LeftButton, Qt::NoModifier, QPoint(200, 150));
    QTest::mouseRelease(chart.plot(), Qt::LeftButton, Qt::NoModifier, QPoint(200, 150));
    QVERIFY(!chart.autoFit());
    chart.plot()->xAxis->setRange(2, 4);
    chart.append(s, 100, 5);
    chart.replotIfDirty();
    QCOMPARE(chart.plot()->xAxis->range().upper, 4.0);
    chart.fit();
    QVERIFY(chart.autoFit());
    QCOMPARE(chart.plot()->xAxis->range().upper, 100.0);
    QVERIFY(chart.savePdf(dir_.filePath("chart.pdf")));
    QVERIFY(QFile(dir_.filePath("chart.pdf")).size() > 0);
}

// The legend sits under the axes (never over data) and lists only visible series with data; an
// empty chart says so, with neutral axes instead of the last data's.
void TestUi::chartLegendListsOnlySeriesWithData() {
    ChartWidget chart("loss", "step", "loss");
    chart.resize(400, 300);
    chart.show();
    const int train = chart.addSeries("train", Qt::blue);
    const int val = chart.addSeries("validation", Qt::red);
    chart.replotIfDirty();
    QVERIFY(chart.showsNoData());
    QVERIFY(chart.legendNames().isEmpty());
    QVERIFY(!chart.plot()->legend->visible());
    for (int i = 0; i < 10; ++i) chart.append(train, i, 10 - i);
    chart.replotIfDirty();
    QVERIFY(!chart.showsNoData());
    QCOMPARE(chart.legendNames(), QStringList{"train"});
    QVERIFY(chart.plot()->legend->layout() != chart.plot()->axisRect()->insetLayout());
    chart.append(val, 9, 4);
    chart.replotIfDirty();
    QCOMPARE(chart.legendNames(), (QStringList{"train", "validation"}));
    chart.setSeriesVisible(val, false);
    chart.replotIfDirty();
    QCOMPARE(chart.legendNames(), QStringList{"train"});
    // A new run clears the data: the axes return to 0-1 and the chart says so.
    chart.clearData();
    chart.replotIfDirty();
    QVERIFY(chart.showsNoData());
    QCOMPARE(chart.plot()->yAxis->range().upper, 1.0);
    QCOMPARE(chart.plot()->xAxis->range().upper, 1.0);
}

// The Runs table: a distinct default name per run, the results (final loss and accuracy, best
// validation accuracy, test accuracy, samples/s) and the settings (precision, strategy) as
// sortable columns; the header's menu hides and shows columns, remembered in the settings.
// TensorBoard's smoothing: the debiased exponential moving average of the raw points, the raw
// line faint behind, one legend entry; 0 draws the raw line alone.
void TestUi::chartSmoothsPerStepSeries() {
    ChartWidget chart("loss", "step", "loss");
    chart.resize(400, 300);
    chart.show();
    const int s = chart.addSeries("train", Qt::blue, ChartWidget::Style::Line, true);
    const double values[] = {1.0, 0.0, 1.0, 0.0};
    for (int i = 0; i < 4; ++i) chart.append(s, i, values[i]);
    chart.setSmoothing(0.5);
    // ema_k = 0.5 ema_{k-1} + 0.5 v_k, divided by 1 - 0.5^(k+1).
    double ema = 0, weight = 0;
    for (int i = 0; i < 4; ++i) {
        ema = 0.5 * ema + 0.5 * values[i];
        weight = 0.5 * weight + 0.5;
        QCOMPARE(chart.smoothedValue(s, i), ema / weight);
    }
    QCOMPARE(chart.legendNames(), QStringList{"train"});
    QVERIFY(chart.plot()->graph(s + 1)->pen().color().alpha() < 255 ||
            chart.plot()->graph(s)->pen().color().alpha() < 255);
    chart.setSmoothing(0);
    QCOMPARE(chart.legendNames(), QStringList{"train"});
    QVERIFY(std::isnan(chart.smoothedValue(s, 10)));
    // The Monitor's loss and accuracy charts carry the control.
    auto w = makeWindow("smoothing.db");
    QVERIFY(w->monitorPanel()->lossChart()->findChild<QDoubleSpinBox*>("smoothing"));
    QCOMPARE(w->monitorPanel()->lossChart()->smoothing(), 0.6);
}

void TestUi::runsTableShowsResultsAndChosenColumns() {
    const QString projectPath = dir_.filePath("columns.json");
    QString text = syntheticProject(2);
    text.replace("\"evaluate_test\": false", "\"evaluate_test\": true");
    QVERIFY(writeFile(projectPath, text));
    auto w = makeWindow("columns.db");
    QString error;
    QVERIFY2(w->openProject(projectPath, &error), qPrintable(error));
    RunController* rc = w->runController();
    for (int i = 0; i < 2; ++i) {
        QSignalSpy finished(rc, &RunController::runFinished);
        QVERIFY2(w->startTraining(&error), qPrintable(error));
        QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 120000);
    }
    auto* view = child<QTableView>(w->runsPanel(), "runsTable");
    QVERIFY(view);
    QAbstractItemModel* m = view->model();
    QTRY_VERIFY_WITH_TIMEOUT(m->rowCount() == 2, 20000);
    auto cell = [&](int row, int col) { return m->index(row, col).data().toString(); };
    // Results arrive with the run's last rows.
    QTRY_VERIFY_WITH_TIMEOUT(cell(0, RunsTableModel::ColTestAcc) != "—", 20000);
    QStringList names;
    for (int row = 0; row < 2; ++row) {
        names << cell(row, RunsTableModel::ColName);
        for (int col : {int(RunsTableModel::ColLoss), int(RunsTableModel::ColAccuracy),
                        int(RunsTableModel::ColBestValAcc), int(RunsTableModel::ColTestAcc),
                        int(RunsTableModel::ColSamplesPerSec)}) {
            bool ok = false;
            QLocale::c().toDouble(cell(row, col), &ok);
            QVERIFY2(ok,
                     qPrintable(
                         QString("row %1 column %2: '%3'").arg(row).arg(col).arg(cell(row, col))));
        }
        QCOMPARE(cell(row, RunsTableModel::ColPrecision), QString("float32"));
        QCOMPARE(cell(row, RunsTableModel::ColStrategy), QString("one_device"));
    }
    QVERIFY2(names[0] != names[1] && names.filter("ui test #").size() == 2,
             qPrintable(names.join(" | ")));
    // Sorting by loss orders by value.
    view->sortByColumn(RunsTableModel::ColLoss, Qt::AscendingOrder);
    QVERIFY(m->index(0, RunsTableModel::ColLoss).data(RunsTableModel::kSortRole).toDouble() <=
            m->index(1, RunsTableModel::ColLoss).data(RunsTableModel::kSortRole).toDouble());
    // Chosen columns: hidden now and in a new window.
    QVERIFY(!view->isColumnHidden(RunsTableModel::ColTestAcc));
    w->runsPanel()->setColumnShown(RunsTableModel::ColTestAcc, false);
    QVERIFY(view->isColumnHidden(RunsTableModel::ColTestAcc));
    auto again = makeWindow("columns.db");
    auto* view2 = child<QTableView>(again->runsPanel(), "runsTable");
    QVERIFY(view2 && view2->isColumnHidden(RunsTableModel::ColTestAcc));
    QVERIFY(!view2->isColumnHidden(RunsTableModel::ColLoss));
    again->runsPanel()->setColumnShown(RunsTableModel::ColTestAcc, true);
}

// The Model tab remembers its splitters; the designer says when a run trains a snapshot; the
// Training tab says what a 16-bit policy costs on this CPU.
void TestUi::layoutAndHintsForANewUser() {
    {
        auto w = makeWindow("layout.db");
        w->resize(1400, 900);
        w->show();
        auto* columns = w->modelDesigner()->findChild<QSplitter*>("modelColumnsSplitter");
        QVERIFY(columns);
        columns->setSizes({150, 400, 850});
        QCoreApplication::processEvents();
        const QList<int> chosen = columns->sizes();
        emit columns->splitterMoved(150, 1);  // as a drag of the handle does
        auto again = makeWindow("layout.db");
        again->resize(1400, 900);
        again->show();
        QCoreApplication::processEvents();
        auto* restored = again->modelDesigner()->findChild<QSplitter*>("modelColumnsSplitter");
        QVERIFY(restored);
        // The same shares of the width (the windows' widths may differ by a few pixels).
        const QList<int> got = restored->sizes();
        QCOMPARE(got.size(), chosen.size());
        auto share = [](const QList<int>& v, int i) {
            double sum = 0;
            for (int x : v) sum += x;
            return v[i] / sum;
        };
        for (int i = 0; i < got.size(); ++i)
            QVERIFY2(std::abs(share(got, i) - share(chosen, i)) < 0.03,
                     qPrintable(QString("column %1: %2 of %3 against %4 of %5")
                                    .arg(i)
                                    .arg(got[i])
                                    .arg(got[0] + got[1] + got[2])
                                    .arg(chosen[i])
                                    .arg(chosen[0] + chosen[1] + chosen[2])));
    }
    const QString projectPath = dir_.filePath("snapshot.json");
    QVERIFY(writeFile(projectPath, syntheticProject(1000, 2048)));
    auto w = makeWindow("snapshot.db");
    QString error;
    QVERIFY2(w->openProject(projectPath, &error), qPrintable(error));
    auto* note = w->modelDesigner()->findChild<QLabel*>("runSnapshotNote");
    QVERIFY(note && note->isHidden());
    RunController* rc = w->runController();
    QSignalSpy finished(rc, &RunController::runFinished);
    QVERIFY2(w->startTraining(&error), qPrintable(error));
    QTRY_VERIFY_WITH_TIMEOUT(!note->isHidden(), 30000);
    rc->stop();
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 30000);
    QTRY_VERIFY(note->isHidden());
    const auto notes = td::precisionNotes(td::PrecisionPolicy::MixedFloat16);
    auto* f16 = w->trainingPanel()->findChild<QLabel*>("precisionNote_mixed_float16");
    if (notes.empty()) {
        QVERIFY(!f16);
    } else {
        QVERIFY(f16);
        QVERIFY2(f16->text().contains("slower than float32"), qPrintable(f16->text()));
    }
    QVERIFY(!w->trainingPanel()->findChild<QLabel*>("precisionNote_float32"));
}

// Edit > Undo / Redo (Ctrl+Z, Ctrl+Shift+Z) over model and settings edits; opening a project
// starts afresh.
void TestUi::undoAndRedoEveryEdit() {
    const QString source = QString(td::dev::kSourceDir) + "/projects/fashion_mnist_mlp.json";
    auto w = makeWindow("undo.db");
    QString error;
    QVERIFY2(w->openProject(source, &error), qPrintable(error));
    ProjectController* pc = w->projectController();
    auto* undo = w->findChild<QAction*>("undoAction");
    auto* redo = w->findChild<QAction*>("redoAction");
    QVERIFY(undo && redo);
    QCOMPARE(undo->shortcut(), QKeySequence(QKeySequence::Undo));
    QCOMPARE(redo->shortcut(), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_Z));
    QVERIFY(!pc->canUndo() && !undo->isEnabled());
    const std::string original = td::projectToJson(pc->project());
    const int epochs = pc->project().training.epochs;

    auto* epochsBox = child<QSpinBox>(w->trainingPanel(), "epochs");
    QVERIFY(epochsBox);
    epochsBox->setValue(epochs + 5);
    QCOMPARE(pc->project().training.epochs, epochs + 5);
    QVERIFY(undo->isEnabled());
    QTest::qWait(ProjectController::kMergeMs + 50);
    ModelDesigner* d = w->modelDesigner();
    const size_t layers = pc->project().model.layers.size();
    d->selectRow(0);
    d->addSelectedPaletteLayer();
    QCOMPARE(pc->project().model.layers.size(), layers + 1);

    undo->trigger();  // the layer
    QCOMPARE(pc->project().model.layers.size(), layers);
    QCOMPARE(d->stackModel()->rowCount(), int(layers));
    QCOMPARE(pc->project().training.epochs, epochs + 5);
    undo->trigger();  // the epochs, in the panel too
    QCOMPARE(pc->project().training.epochs, epochs);
    QCOMPARE(epochsBox->value(), epochs);
    QCOMPARE(td::projectToJson(pc->project()), original);
    QVERIFY(!pc->isDirty());
    QVERIFY(!undo->isEnabled() && redo->isEnabled());
    redo->trigger();
    redo->trigger();
    QCOMPARE(pc->project().training.epochs, epochs + 5);
    QCOMPARE(pc->project().model.layers.size(), layers + 1);
    QVERIFY(!redo->isEnabled());
    // A new edit after an undo drops what could be redone.
    undo->trigger();
    epochsBox->setValue(epochs + 1);
    QVERIFY(!redo->isEnabled());
    // Opening a project starts a fresh history.
    QVERIFY2(w->openProject(source, &error), qPrintable(error));
    QVERIFY(!undo->isEnabled() && !redo->isEnabled());
}

void TestUi::latencyProbeMeasures() {
    LatencyProbe probe;
    probe.start();
    QTest::qWait(200);
    probe.stop();
    QVERIFY(probe.samples() > 5);
    QVERIFY(probe.worstMs() >= probe.percentileMs(99));
    QVERIFY(probe.percentileMs(99) >= probe.percentileMs(50));
    qInfo("%s (idle)", qPrintable(probe.report()));
}

// Measurement, not a pass/fail timing check: the seed project trained from the GUI (two epochs)
// with the Monitor tab showing; prints throughput and the GUI thread's event latency.
void TestUi::latencyDuringFashionMnistTraining() {
    if (!QFile::exists(fashionMnistDir() + "/train-images-idx3-ubyte.gz"))
        QSKIP("Fashion-MNIST is not installed (dataset-fashion-mnist)");
    auto w = makeWindow("fashion.db");
    QString error;
    QVERIFY2(
        w->openProject(QString(td::dev::kSourceDir) + "/projects/fashion_mnist_mlp.json", &error),
        qPrintable(error));
    w->trainingPanel()->findChild<QSpinBox*>("epochs")->setValue(2);
    RunController* rc = w->runController();
    QSignalSpy finished(rc, &RunController::runFinished);
    QSignalSpy batches(rc, &RunController::eventsArrived);
    QVERIFY2(w->startTraining(&error), qPrintable(error));
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 300000);
    const auto result = finished.first().first().value<td::RunFinished>();
    QCOMPARE(result.status, td::RunStatus::Completed);
    auto store = td::RunStore::open(dir_.filePath("fashion.db").toStdString());
    QVERIFY(store.ok());
    auto epochs = store.value()->epochs(rc->runId());
    QVERIFY(epochs.ok() && !epochs.value().empty());
    QStringList perEpoch;
    for (const auto& args : batches) {
        for (const auto& e : args.first().value<EventBatch>().epochs)
            perEpoch << QString::number(e.samplesPerSecond, 'f', 0);
    }
    qInfo("fashion_mnist_mlp from the GUI: %.1f s for 2 epochs, samples/s per epoch: %s",
          result.seconds, qPrintable(perEpoch.join(", ")));
    qInfo("%s", qPrintable(rc->latencyProbe()->report()));
}

// A run that the headless trainer (another process) is writing shows up and grows while it runs.
void TestUi::runsPanelFollowsHeadlessRunLive() {
    const QString exe = QCoreApplication::applicationDirPath() + "/../traindeck";
    if (!QFile::exists(exe)) QSKIP("traindeck binary not built");
    const QString projectPath = dir_.filePath("headless.json");
    QVERIFY(writeFile(projectPath, syntheticProject(1000, 2048)));
    const QString db = dir_.filePath("headless.db");
    QProcess trainer;
    trainer.start(exe, {"train", projectPath, "--db", db, "--plain"});
    QVERIFY2(trainer.waitForStarted(10000), qPrintable(trainer.errorString()));
    RunsPanel panel;
    panel.resize(1000, 700);
    panel.show();
    QTRY_VERIFY_WITH_TIMEOUT(QFile::exists(db) && panel.setDatabasePath(db), 30000);
    QTRY_COMPARE_WITH_TIMEOUT(panel.model()->rowCount(), 1, 30000);
    QCOMPARE(panel.model()->run(0)->status, std::string("running"));
    panel.view()->selectRow(0);
    QTRY_VERIFY_WITH_TIMEOUT(panel.stepChart()->pointCount(0) > 0, 30000);
    const int first = panel.stepChart()->pointCount(0);
    QTRY_VERIFY_WITH_TIMEOUT(panel.stepChart()->pointCount(0) > first, 30000);  // polled live
    trainer.terminate();
    QVERIFY(trainer.waitForFinished(30000));
}

// The feed reads the summaries of new and running runs only, never a project document, notices
// deletions, and re-reads everything only on its slow full reload.
void TestUi::runsFeedReadsOnlyWhatChanged() {
    const std::string db = dir_.filePath("feed.db").toStdString();
    auto opened = td::RunStore::open(db);
    QVERIFY2(opened.ok(), opened.ok() ? "" : opened.error().c_str());
    td::RunStore& store = *opened.value();
    auto makeRun = [&](const std::string& name, bool finished) {
        td::RunRecord r;
        r.name = name;
        r.projectJson = "{\"name\": \"" + name + "\"}";
        auto id = store.createRun(r);
        if (id.ok() && finished) (void)store.finishRun(*id, td::RunStatus::Completed, {}, "");
        return id.ok() ? *id : int64_t(-1);
    };
    const int64_t a = makeRun("a", true), b = makeRun("b", true), live = makeRun("live", false);
    QVERIFY(a > 0 && b > 0 && live > 0);

    RunsFeed feed(db, std::chrono::hours(1));
    RunsDelta d = feed.poll();
    QVERIFY2(d.error.empty(), d.error.c_str());
    QVERIFY(d.full);
    QCOMPARE(d.runs.size(), size_t(3));
    for (const td::RunRecord& r : d.runs) {
        QVERIFY(r.projectJson.empty());  // summaries only
        QVERIFY(!r.name.empty());
    }

    d = feed.poll();  // nothing committed
    QVERIFY(d.error.empty() && !d.full && d.runs.empty() && d.removed.empty());

    td::StepRow step;
    step.globalStep = 1;
    step.timeMs = 1;
    step.metrics = {{"loss", 1.0}};
    QVERIFY(store.appendSteps(live, {step}).ok());
    d = feed.poll();
    QVERIFY(!d.full);
    QCOMPARE(d.runs.size(), size_t(1));  // the running run, not the finished ones
    QCOMPARE(d.runs[0].id, live);

    const int64_t c = makeRun("c", true);
    QVERIFY(store.deleteRun(a).ok());
    QVERIFY(store.renameRun(b, "b renamed").ok());
    d = feed.poll();
    QVERIFY(!d.full);
    std::set<int64_t> read;
    for (const td::RunRecord& r : d.runs) read.insert(r.id);
    QCOMPARE(read, (std::set<int64_t>{live, c}));
    QCOMPARE(d.removed, (std::vector<int64_t>{a}));

    QVERIFY(store.finishRun(live, td::RunStatus::Stopped, {}, "").ok());
    d = feed.poll();
    QCOMPARE(d.runs.size(), size_t(1));
    QCOMPARE(d.runs[0].status, std::string("stopped"));
    QVERIFY(store.appendLogs(c, {td::LogRow{1, "info", "x"}}).ok());
    d = feed.poll();
    QVERIFY(d.runs.empty());  // nothing is running any more

    // The full reload (due at once here) finds the rename that no watermark shows.
    RunsFeed eager(db, std::chrono::seconds(0));
    QVERIFY(eager.poll().full);
    QVERIFY(store.setNotes(c, "n").ok());
    d = eager.poll();
    QVERIFY(d.full);
    QCOMPARE(d.runs.size(), size_t(3));
    bool renamed = false;
    for (const td::RunRecord& r : d.runs) renamed = renamed || r.name == "b renamed";
    QVERIFY(renamed);
    QVERIFY(eager.poll().runs.empty());  // due, but nothing committed: nothing read

    RunsFeed missing(dir_.filePath("no/such.db").toStdString());
    d = missing.poll();
    QVERIFY(d.error.find("no/such.db") != std::string::npos);
}

// Every read of the store happens on the panel's worker: the GUI thread never touches the file
// while the panel refreshes, follows a live run or loads the overlay of a selected one.
void TestUi::runsPanelReadsOffTheGuiThread() {
    ReadThreadRecorder::install();  // before any connection to this store is opened
    const QString path = dir_.filePath("offthread.db");
    auto opened = td::RunStore::open(path.toStdString());
    QVERIFY(opened.ok());
    td::RunStore& store = *opened.value();
    std::vector<int64_t> ids;
    for (int i = 0; i < 20; ++i) {
        td::RunRecord r;
        r.name = "run " + std::to_string(i);
        r.projectJson = syntheticProject(1).toStdString();
        auto id = store.createRun(r);
        QVERIFY(id.ok());
        ids.push_back(*id);
    }
    td::StepRow step;
    step.metrics = {{"loss", 1.0}};
    for (int s = 1; s <= 50; ++s) {
        step.globalStep = s;
        step.timeMs = s;
        QVERIFY(store.appendSteps(ids.back(), {step}).ok());
    }

    RunsPanel panel;
    panel.resize(1000, 700);
    panel.show();
    QSignalSpy refreshed(&panel, &RunsPanel::refreshed);
    QVERIFY(panel.setDatabasePath(path));
    QTRY_COMPARE_WITH_TIMEOUT(panel.model()->rowCount(), 20, 10000);

    // Another writer commits (here, on this thread: before recording starts).
    step.globalStep = 51;
    QVERIFY(store.appendSteps(ids.back(), {step}).ok());
    td::RunRecord extra;
    extra.name = "new run";
    QVERIFY(store.createRun(extra).ok());

    ReadThreadRecorder::start();
    const int before = static_cast<int>(refreshed.count());
    panel.refresh();
    QTRY_VERIFY_WITH_TIMEOUT(refreshed.count() > before, 10000);
    QCOMPARE(panel.model()->rowCount(), 21);
    panel.selectRuns({ids.back()});
    panel.view()->selectionModel()->selectionChanged({}, {});
    QTRY_COMPARE_WITH_TIMEOUT(panel.stepChart()->pointCount(0), 51, 10000);
    const std::set<QThread*> readers = ReadThreadRecorder::stop();
    QVERIFY(!readers.empty());  // the recorder saw the reads
    QVERIFY2(!readers.count(QThread::currentThread()), "the GUI thread read the store");
}

// The documentation's pictures show each panel with its data: the Data panel once its preview
// and histogram are loaded, the Runs panel once the selected runs' curves are read.
// The Runs panel draws a stored run's per-replica throughput, one line per replica.
void TestUi::runsPanelOverlaysReplicas() {
    const QString path = dir_.filePath("replica_overlay.db");
    auto opened = td::RunStore::open(path.toStdString());
    QVERIFY(opened.ok());
    td::RunStore& store = *opened.value();
    td::RunRecord run;
    run.name = "mirrored";
    auto id = store.createRun(run);
    QVERIFY(id.ok());
    std::vector<td::StepRow> steps;
    std::vector<td::ReplicaRow> replicas;
    for (int64_t g = 1; g <= 5; ++g) {
        steps.push_back(td::StepRow{g, 0, g, g, {{"loss", 1.0 / double(g)}}});
        for (int r = 0; r < 2; ++r) {
            td::ReplicaRow row;
            row.globalStep = g;
            row.timeMs = g;
            row.stats.replica = r;
            row.stats.device = "cpu:" + std::to_string(r);
            row.stats.samplesPerSecond = 100.0 * double(g) + r;
            replicas.push_back(row);
        }
    }
    QVERIFY(store.appendSteps(*id, steps, replicas).ok());
    QVERIFY(store.finishRun(*id, td::RunStatus::Completed, {}, "").ok());

    RunsPanel panel;
    panel.resize(1000, 700);
    panel.show();
    QVERIFY(panel.setDatabasePath(path));
    QTRY_COMPARE_WITH_TIMEOUT(panel.model()->rowCount(), 1, 10000);
    QComboBox* metric = panel.metricCombo();
    const int perReplica = metric->findData("replicas:samples_per_s");
    QVERIFY(perReplica >= 0);
    metric->setCurrentIndex(perReplica);
    panel.selectRuns({*id});
    panel.view()->selectionModel()->selectionChanged({}, {});
    ChartWidget* chart = panel.stepChart();
    QTRY_COMPARE_WITH_TIMEOUT(chart->seriesCount(), 2, 10000);
    QTRY_COMPARE_WITH_TIMEOUT(chart->pointCount(1), 5, 10000);
    QCOMPARE(chart->pointCount(0), 5);
    QVERIFY2(chart->seriesName(0).endsWith("mirrored cpu:0"), qPrintable(chart->seriesName(0)));
    QVERIFY2(chart->seriesName(1).endsWith("mirrored cpu:1"), qPrintable(chart->seriesName(1)));
    QCOMPARE(chart->point(1, 2), QPointF(3.0, 301.0));
    QCOMPARE(panel.epochChart()->seriesCount(), 0);
    QCOMPARE(chart->yLabel(), QString("samples/s"));  // the axis names what it shows

    // Back to a run-level metric: one line per run again.
    metric->setCurrentIndex(metric->findData("loss"));
    panel.view()->selectionModel()->selectionChanged({}, {});
    QTRY_COMPARE_WITH_TIMEOUT(chart->pointCount(0), 5, 10000);
    QCOMPARE(chart->seriesCount(), 1);
    QCOMPARE(chart->yLabel(), QString("loss"));
    QCOMPARE(panel.epochChart()->yLabel(), QString("loss"));
}

void TestUi::screenshotsWaitForPanelData() {
    const QString projectPath = dir_.filePath("shots.json");
    QVERIFY(writeFile(projectPath, syntheticProject(1, 4096)));
    const QString db = dir_.filePath("shots.db");
    {
        auto store = td::RunStore::open(db.toStdString());
        QVERIFY(store.ok());
        td::RunRecord r;
        r.name = "stored";
        auto id = store.value()->createRun(r);
        QVERIFY(id.ok());
        td::StepRow step;
        step.globalStep = 1;
        step.metrics = {{"loss", 1.0}};
        QVERIFY(store.value()->appendSteps(*id, {step}).ok());
        QVERIFY(store.value()->finishRun(*id, td::RunStatus::Completed, {}, "").ok());
    }
    auto w = makeWindow("shots.db");
    QString error;
    QVERIFY2(w->openProject(projectPath, &error), qPrintable(error));
    const QString out = dir_.filePath("shots");
    // No settling time: the driver has to wait for the panels themselves.
    auto* driver = new ScreenshotDriver(w.get(), out, 1, 0);
    QStringList grabbed;
    int dataSamples = -1, histogramBars = -1, runsPoints = -1;
    connect(driver, &ScreenshotDriver::grabbed, this, [&](const QString& name, bool saved) {
        QVERIFY(saved);
        grabbed << name;
        if (name == "data") {
            dataSamples = w->dataPanel()->previewSampleCount();
            auto* histogram = w->dataPanel()->findChild<QCustomPlot*>("classHistogram");
            auto* bars = histogram && histogram->plottableCount() > 0
                             ? qobject_cast<QCPBars*>(histogram->plottable(0))
                             : nullptr;
            histogramBars = bars ? bars->dataCount() : 0;
        }
        if (name == "runs") runsPoints = w->runsPanel()->stepChart()->pointCount(0);
    });
    QSignalSpy finished(driver, &ScreenshotDriver::finished);
    driver->begin();
    QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 60000);
    QCOMPARE(grabbed, (QStringList{"model", "data", "training", "monitor", "runs"}));
    QVERIFY2(dataSamples > 0, "the Data picture was taken before its preview loaded");
    QCOMPARE(histogramBars, 3);
    QVERIFY2(runsPoints > 0, "the Runs picture was taken before the curves were read");
    for (const QString& name : grabbed) QVERIFY(QFileInfo(out + "/" + name + ".png").size() > 0);
}

QTEST_MAIN(TestUi)
#include "test_ui.moc"
