#include "ui/data_panel.h"

#include <qcustomplot.h>

#include <QCheckBox>
#include <QComboBox>
#include <QDir>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QPushButton>
#include <QScrollArea>
#include <QSpinBox>
#include <QSplitter>
#include <QStackedWidget>
#include <QTableWidget>
#include <QTimer>
#include <QVBoxLayout>

#include "ui/async.h"
#include "ui/file_picker.h"
#include "ui/layer_property_editor.h"
#include "ui/project_checks.h"
#include "ui/project_controller.h"
#include "ui/settings.h"

namespace td::ui {

namespace {

constexpr int kPreviewSamples = 48;
const QStringList kSourceTypes{"fashion_mnist",   "idx",     "csv", "npy", "synthetic",
                               "image_directory", "tfrecord"};

// File patterns as typed: separated by ';'.
std::vector<std::string> patternsOf(const QString& text) {
    std::vector<std::string> out;
    for (const QString& p : text.split(';', Qt::SkipEmptyParts))
        if (!p.trimmed().isEmpty()) out.push_back(p.trimmed().toStdString());
    return out;
}

QString joinPatterns(const std::vector<std::string>& patterns) {
    QStringList l;
    for (const std::string& p : patterns) l << QString::fromStdString(p);
    return l.join("; ");
}

QString q(const std::string& s) {
    return QString::fromStdString(s);
}

// Finds, updates or removes the map step `op`, keeping the order of the others.
void setMapStep(std::vector<td::MapStep>& steps, const std::string& op, bool on,
                const td::MapStep& value, bool atFront) {
    auto it =
        std::find_if(steps.begin(), steps.end(), [&](const td::MapStep& s) { return s.op == op; });
    if (!on) {
        if (it != steps.end()) steps.erase(it);
    } else if (it != steps.end()) {
        *it = value;
    } else if (atFront) {
        // After the decode (an encoded cache's "cache", "decode" pair): a step acts on pixels.
        auto decode = std::find_if(steps.begin(), steps.end(),
                                   [](const td::MapStep& s) { return s.op == "decode"; });
        steps.insert(decode == steps.end() ? steps.begin() : decode + 1, value);
    } else {
        steps.push_back(value);
    }
}

// A spin box's value for a project field whose value it shows rounded to its decimals: the
// field's own value while the box still shows it (1/255 stays 0.00392156862745098, not the box's
// 0.00392157), the box's once the user changed it.
double shownValue(const QDoubleSpinBox* box, double field) {
    const double shown = QString::number(field, 'f', box->decimals()).toDouble();
    return box->value() == shown ? field : box->value();
}

const td::MapStep* findStep(const std::vector<td::MapStep>& steps, const std::string& op) {
    for (const auto& s : steps)
        if (s.op == op) return &s;
    return nullptr;
}

// Whether the cache keeps encoded files or records: a "cache" step before the "decode" step.
bool encodedCache(const std::vector<td::MapStep>& steps) {
    for (const td::MapStep& s : steps) {
        if (s.op == "decode") return false;
        if (s.op == "cache") return findStep(steps, "decode") != nullptr;
    }
    return false;
}

// On: the map starts with "cache", "decode" (the other steps after them, in their order); off:
// neither (the cache then holds decoded samples, as without a "decode" step).
void setEncodedCache(std::vector<td::MapStep>& steps, bool on) {
    if (!on && !findStep(steps, "decode")) return;
    std::erase_if(steps, [](const td::MapStep& s) { return s.op == "cache" || s.op == "decode"; });
    if (on) steps.insert(steps.begin(), {td::MapStep{.op = "cache"}, td::MapStep{.op = "decode"}});
}

bool decodesFiles(const std::string& sourceType) {
    return sourceType == "image_directory" || sourceType == "tfrecord";
}

}  // namespace

AutotuneSpin::AutotuneSpin(int minimum, int maximum, QWidget* parent) : QWidget(parent) {
    auto_ = new QCheckBox(tr("AUTOTUNE"));
    auto_->setToolTip(tr("Let the pipeline tune this value while it runs (tf.data.AUTOTUNE)."));
    spin_ = new QSpinBox;
    spin_->setRange(minimum, maximum);
    auto* h = new QHBoxLayout(this);
    h->setContentsMargins(0, 0, 0, 0);
    h->addWidget(auto_);
    h->addWidget(spin_, 1);
    connect(auto_, &QCheckBox::toggled, this, [this](bool on) {
        spin_->setEnabled(!on);
        emit edited(value());
    });
    connect(spin_, &QSpinBox::valueChanged, this, [this] { emit edited(value()); });
}

int64_t AutotuneSpin::value() const {
    return auto_->isChecked() ? td::kAutotune : spin_->value();
}

void AutotuneSpin::setValue(int64_t v) {
    QSignalBlocker b1(auto_), b2(spin_);
    auto_->setChecked(v == td::kAutotune);
    spin_->setEnabled(v != td::kAutotune);
    if (v != td::kAutotune) spin_->setValue(static_cast<int>(v));
}

DataPanel::DataPanel(ProjectController* project, QWidget* parent)
    : QWidget(parent), project_(project) {
    sourceType_ = new QComboBox;
    sourceType_->setObjectName("sourceType");
    sourceType_->addItem(tr("Fashion-MNIST (built-in)"), "fashion_mnist");
    sourceType_->addItem(tr("IDX files (MNIST format)"), "idx");
    sourceType_->addItem(tr("CSV file"), "csv");
    sourceType_->addItem(tr("NumPy .npy arrays"), "npy");
    sourceType_->addItem(tr("Synthetic (generated)"), "synthetic");
    sourceType_->addItem(tr("Image folder (a sub-folder per class)"), "image_directory");
    sourceType_->addItem(tr("TFRecord shards (tf.train.Example)"), "tfrecord");
    pages_ = new QStackedWidget;
    buildSourcePages();
    connect(sourceType_, &QComboBox::activated, this, [this](int i) {
        pages_->setCurrentIndex(i);
        writeSource();
    });
    auto* sourceBox = new QGroupBox(tr("Source"));
    auto* sl = new QVBoxLayout(sourceBox);
    sl->addWidget(sourceType_);
    sl->addWidget(pages_);

    auto* left = new QWidget;
    auto* ll = new QVBoxLayout(left);
    ll->addWidget(sourceBox);
    ll->addWidget(buildPipeline());
    ll->addStretch(1);
    auto* leftScroll = new QScrollArea;
    leftScroll->setWidgetResizable(true);
    leftScroll->setWidget(left);

    // Preview
    previewStatus_ = new QLabel;
    previewStatus_->setObjectName("previewStatus");
    previewStatus_->setWordWrap(true);
    auto* reloadButton = new QPushButton(tr("Reload preview"));
    connect(reloadButton, &QPushButton::clicked, this, &DataPanel::loadPreview);
    augment_ = new QCheckBox(tr("After augmentation"));
    augment_->setObjectName("augmentPreview");
    nextDraw_ = new QPushButton(tr("Next draw"));
    nextDraw_->setObjectName("augmentNextDraw");
    nextDraw_->setToolTip(
        tr("The random layers' draws of the next training step for the same samples."));
    nextDraw_->setEnabled(false);
    augmentTimer_ = new QTimer(this);
    augmentTimer_->setSingleShot(true);
    augmentTimer_->setInterval(300);
    connect(augmentTimer_, &QTimer::timeout, this, &DataPanel::loadAugmented);
    connect(augment_, &QCheckBox::toggled, this, [this](bool on) {
        nextDraw_->setEnabled(on && augment_->isEnabled());
        if (on) {
            loadAugmented();
            return;
        }
        ++augmentGeneration_;  // a result on its way is not shown
        augmentTimer_->stop();
        if (augmentShown_ && shown_) showSamples(*shown_);
        augmentShown_ = false;
    });
    connect(nextDraw_, &QPushButton::clicked, this, [this] {
        ++draw_;
        loadAugmented();
    });
    // Any edit may change the layers, the map steps or the seed the pictures come from.
    connect(project_, &ProjectController::projectEdited, this, [this] {
        updateAugmentToggle();
        if (augment_->isChecked()) augmentTimer_->start();
    });
    samples_ = new QListWidget;
    samples_->setObjectName("samplePreview");
    samples_->setViewMode(QListView::IconMode);
    samples_->setIconSize(QSize(56, 56));
    samples_->setGridSize(QSize(84, 84));
    samples_->setResizeMode(QListView::Adjust);
    samples_->setMovement(QListView::Static);
    table_ = new QTableWidget;
    table_->setObjectName("tablePreview");
    table_->setVisible(false);
    histogram_ = new QCustomPlot;
    histogram_->setObjectName("classHistogram");
    histogram_->setMinimumHeight(180);
    histogram_->yAxis->setLabel(tr("training samples"));
    auto* previewBox =
        new QGroupBox(tr("Preview (first %1 training samples)").arg(kPreviewSamples));
    auto* pl = new QVBoxLayout(previewBox);
    auto* ph = new QHBoxLayout;
    ph->addWidget(previewStatus_, 1);
    ph->addWidget(augment_);
    ph->addWidget(nextDraw_);
    ph->addWidget(reloadButton);
    pl->addLayout(ph);
    pl->addWidget(samples_, 3);
    pl->addWidget(table_, 3);
    pl->addWidget(new QLabel(tr("<b>Class histogram</b>")));
    pl->addWidget(histogram_, 2);

    auto* split = new QSplitter(Qt::Horizontal);
    split->addWidget(leftScroll);
    split->addWidget(previewBox);
    split->setStretchFactor(0, 2);
    split->setStretchFactor(1, 3);
    rememberSplitter(split, "data");
    auto* layout = new QVBoxLayout(this);
    layout->addWidget(split);

    previewTimer_ = new QTimer(this);
    previewTimer_->setSingleShot(true);
    previewTimer_->setInterval(500);
    connect(previewTimer_, &QTimer::timeout, this, &DataPanel::loadPreview);
    connect(project_, &ProjectController::projectReplaced, this, &DataPanel::reload);
    reload();
}

void DataPanel::buildSourcePages() {
    // Built-in
    auto* fashion = new QWidget;
    auto* fl = new QVBoxLayout(fashion);
    fashionStatus_ = new QLabel;
    fashionStatus_->setWordWrap(true);
    fl->addWidget(fashionStatus_);
    fl->addStretch(1);
    pages_->addWidget(fashion);

    const QString idxFilter = tr("IDX files (*-ubyte *-ubyte.gz *.idx *.gz);;All files (*)");
    const QString npyFilter = tr("NumPy arrays (*.npy);;All files (*)");
    const QString csvFilter = tr("CSV files (*.csv *.txt);;All files (*)");
    auto pickerPage = [this](FilePicker* a, FilePicker* b, FilePicker* c, FilePicker* d,
                             const QStringList& labels) {
        auto* page = new QWidget;
        auto* form = new QFormLayout(page);
        FilePicker* all[] = {a, b, c, d};
        for (int i = 0; i < 4; ++i) {
            form->addRow(labels[i], all[i]);
            connect(all[i], &FilePicker::pathEdited, this, &DataPanel::writeSource);
        }
        return page;
    };
    idxTrainX_ = new FilePicker(idxFilter, false);
    idxTrainY_ = new FilePicker(idxFilter, false);
    idxTestX_ = new FilePicker(idxFilter, true);
    idxTestY_ = new FilePicker(idxFilter, true);
    idxTrainX_->setObjectName("idxTrainImages");
    pages_->addWidget(pickerPage(
        idxTrainX_, idxTrainY_, idxTestX_, idxTestY_,
        {tr("Training images"), tr("Training labels"), tr("Test images"), tr("Test labels")}));

    auto* csv = new QWidget;
    auto* cf = new QFormLayout(csv);
    csvTrain_ = new FilePicker(csvFilter, false);
    csvTest_ = new FilePicker(csvFilter, true);
    csvLabel_ = new QLineEdit;
    csvLabel_->setToolTip(tr("Name of the header column that holds the class id."));
    cf->addRow(tr("Training file"), csvTrain_);
    cf->addRow(tr("Test file"), csvTest_);
    cf->addRow(tr("Label column"), csvLabel_);
    connect(csvTrain_, &FilePicker::pathEdited, this, &DataPanel::writeSource);
    connect(csvTest_, &FilePicker::pathEdited, this, &DataPanel::writeSource);
    connect(csvLabel_, &QLineEdit::textEdited, this, &DataPanel::writeSource);
    pages_->addWidget(csv);

    npyTrainX_ = new FilePicker(npyFilter, false);
    npyTrainY_ = new FilePicker(npyFilter, false);
    npyTestX_ = new FilePicker(npyFilter, true);
    npyTestY_ = new FilePicker(npyFilter, true);
    pages_->addWidget(pickerPage(npyTrainX_, npyTrainY_, npyTestX_, npyTestY_,
                                 {tr("Training x"), tr("Training y"), tr("Test x"), tr("Test y")}));

    auto* syn = new QWidget;
    auto* sf = new QFormLayout(syn);
    synSamples_ = new QSpinBox;
    synSamples_->setObjectName("synSamples");
    synSamples_->setRange(1, 10000000);
    synTestSamples_ = new QSpinBox;
    synTestSamples_->setRange(0, 10000000);
    synShape_ = new QLineEdit;
    synShape_->setObjectName("synShape");
    synShape_->setPlaceholderText(tr("e.g. 16 or 28, 28"));
    synShapeError_ = new QLabel;
    synShapeError_->setStyleSheet("color: #b00020;");
    synClasses_ = new QSpinBox;
    synClasses_->setRange(2, 100000);
    synSeed_ = new QSpinBox;
    synSeed_->setRange(0, INT32_MAX);
    sf->addRow(tr("Training samples"), synSamples_);
    sf->addRow(tr("Test samples"), synTestSamples_);
    sf->addRow(tr("Sample shape"), synShape_);
    sf->addRow(QString(), synShapeError_);
    sf->addRow(tr("Classes"), synClasses_);
    sf->addRow(tr("Seed"), synSeed_);
    for (QSpinBox* s : {synSamples_, synTestSamples_, synClasses_, synSeed_}) {
        connect(s, &QSpinBox::valueChanged, this, &DataPanel::writeSource);
    }
    connect(synShape_, &QLineEdit::textEdited, this, &DataPanel::writeSource);
    pages_->addWidget(syn);

    // Image folder: Keras' image_dataset_from_directory (the other arguments in the project file).
    auto* img = new QWidget;
    auto* imf = new QFormLayout(img);
    imgDir_ = FilePicker::folder(false);
    imgDir_->setObjectName("imageDirectory");
    imgDir_->setToolTip(tr("One sub-folder per class, holding JPEG, PNG, BMP or GIF files."));
    imgTestDir_ = FilePicker::folder(true);
    imgHeight_ = new QSpinBox;
    imgWidth_ = new QSpinBox;
    for (QSpinBox* s : {imgHeight_, imgWidth_}) {
        s->setRange(1, 16384);
        s->setSuffix(tr(" px"));
    }
    imgHeight_->setObjectName("imageHeight");
    auto* size = new QHBoxLayout;
    size->addWidget(imgHeight_);
    size->addWidget(new QLabel(tr("×")));
    size->addWidget(imgWidth_);
    imgColor_ = new QComboBox;
    imgColor_->addItem(tr("grayscale"), "grayscale");
    imgColor_->addItem(tr("RGB"), "rgb");
    imgColor_->addItem(tr("RGBA"), "rgba");
    imgLabels_ = new QComboBox;
    imgLabels_->addItem(tr("class ids (int)"), "int");
    imgLabels_->addItem(tr("one-hot (categorical)"), "categorical");
    imgLabels_->addItem(tr("0/1 (binary, two classes)"), "binary");
    imgValidation_ = new QDoubleSpinBox;
    imgValidation_->setRange(0.0, 0.9);
    imgValidation_->setSingleStep(0.05);
    imgValidation_->setDecimals(3);
    imgValidation_->setToolTip(
        tr("Keras' validation subset: the last share of the shuffled files."));
    imgSeed_ = new QSpinBox;
    imgSeed_->setRange(0, INT32_MAX);
    imgSeed_->setToolTip(tr("Shuffles the file list as Keras does with the same seed."));
    imf->addRow(tr("Folder"), imgDir_);
    imf->addRow(tr("Test folder"), imgTestDir_);
    imf->addRow(tr("Image size (h × w)"), size);
    imf->addRow(tr("Colour"), imgColor_);
    imf->addRow(tr("Labels"), imgLabels_);
    imf->addRow(tr("Validation files"), imgValidation_);
    imf->addRow(tr("Seed"), imgSeed_);
    imgSkipBad_ = new QCheckBox(tr("Skip files that do not decode (counted in the run's log)"));
    imgSkipBad_->setObjectName("imageSkipBadFiles");
    imgSkipBad_->setToolTip(tr("Off: a corrupt or truncated image stops the run, naming the file"));
    imf->addRow(QString(), imgSkipBad_);
    connect(imgSkipBad_, &QCheckBox::toggled, this, &DataPanel::writeSource);
    connect(imgDir_, &FilePicker::pathEdited, this, &DataPanel::writeSource);
    connect(imgTestDir_, &FilePicker::pathEdited, this, &DataPanel::writeSource);
    for (QSpinBox* s : {imgHeight_, imgWidth_, imgSeed_})
        connect(s, &QSpinBox::valueChanged, this, &DataPanel::writeSource);
    connect(imgValidation_, &QDoubleSpinBox::valueChanged, this, &DataPanel::writeSource);
    for (QComboBox* c : {imgColor_, imgLabels_})
        connect(c, &QComboBox::activated, this, &DataPanel::writeSource);
    pages_->addWidget(img);

    // TFRecord shards: which feature is the sample and how it decodes, which is the label (the
    // reading order, cycle_length, block_length and shuffle_files, in the project file).
    auto* rec = new QWidget;
    auto* rf = new QFormLayout(rec);
    recFiles_ = new QLineEdit;
    recFiles_->setObjectName("recordFiles");
    recFiles_->setPlaceholderText(tr("shards/train-*.tfrecord"));
    recFiles_->setToolTip(tr("Glob patterns of the training shards, separated by ';'."));
    recTestFiles_ = new QLineEdit;
    recTestFiles_->setPlaceholderText(tr("optional: shards/test-*.tfrecord"));
    recCompression_ = new QComboBox;
    recCompression_->addItem(tr("none"), "");
    recCompression_->addItem(tr("GZIP"), "GZIP");
    recX_ = new QLineEdit;
    recX_->setObjectName("recordFeature");
    recDecode_ = new QComboBox;
    recDecode_->addItem(tr("encoded image (JPEG, PNG, BMP, GIF)"), "image");
    recDecode_->addItem(tr("raw uint8 bytes"), "raw");
    recDecode_->addItem(tr("float list"), "float");
    recHeight_ = new QSpinBox;
    recWidth_ = new QSpinBox;
    for (QSpinBox* s : {recHeight_, recWidth_}) {
        s->setRange(1, 16384);
        s->setSuffix(tr(" px"));
    }
    auto* recSize = new QHBoxLayout;
    recSize->addWidget(recHeight_);
    recSize->addWidget(new QLabel(tr("×")));
    recSize->addWidget(recWidth_);
    recColor_ = new QComboBox;
    recColor_->addItem(tr("grayscale"), "grayscale");
    recColor_->addItem(tr("RGB"), "rgb");
    recColor_->addItem(tr("RGBA"), "rgba");
    recShape_ = new QLineEdit;
    recShape_->setPlaceholderText(tr("e.g. 28, 28, 1"));
    recY_ = new QLineEdit;
    rf->addRow(tr("Shards"), recFiles_);
    rf->addRow(tr("Test shards"), recTestFiles_);
    rf->addRow(tr("Compression"), recCompression_);
    rf->addRow(tr("Sample feature"), recX_);
    rf->addRow(tr("Decoded as"), recDecode_);
    rf->addRow(tr("Image size (h × w)"), recSize);
    rf->addRow(tr("Colour"), recColor_);
    rf->addRow(tr("Shape (raw, float)"), recShape_);
    rf->addRow(tr("Label feature (int64)"), recY_);
    recSkipBad_ = new QCheckBox(tr("Skip records that do not read (counted in the run's log)"));
    recSkipBad_->setObjectName("recordSkipBadFiles");
    recSkipBad_->setToolTip(
        tr("Off: a bad CRC, a missing feature or an image that does not decode stops the run, "
           "naming the file and offset"));
    rf->addRow(QString(), recSkipBad_);
    connect(recSkipBad_, &QCheckBox::toggled, this, &DataPanel::writeSource);
    for (QLineEdit* e : {recFiles_, recTestFiles_, recX_, recShape_, recY_})
        connect(e, &QLineEdit::editingFinished, this, &DataPanel::writeSource);
    for (QSpinBox* s : {recHeight_, recWidth_})
        connect(s, &QSpinBox::valueChanged, this, &DataPanel::writeSource);
    for (QComboBox* c : {recCompression_, recDecode_, recColor_})
        connect(c, &QComboBox::activated, this, &DataPanel::writeSource);
    pages_->addWidget(rec);
}

QWidget* DataPanel::buildPipeline() {
    auto* box = new QGroupBox(tr("Input pipeline (cache → shuffle → batch → map → prefetch)"));
    auto* form = new QFormLayout(box);
    auto dspin = [](double lo, double hi, int decimals) {
        auto* s = new QDoubleSpinBox;
        s->setRange(lo, hi);
        s->setDecimals(decimals);
        return s;
    };
    scaleOn_ = new QCheckBox(tr("Scale"));
    scale_ = dspin(1e-9, 1e9, 8);
    scale_->setObjectName("scaleFactor");
    scale_->setToolTip(tr("x · factor, e.g. 1/255 = 0.00392157 for 8-bit pixels"));
    auto* scaleRow = new QHBoxLayout;
    scaleRow->addWidget(scaleOn_);
    scaleRow->addWidget(scale_, 1);
    form->addRow(tr("Normalize"), scaleRow);
    normalizeOn_ = new QCheckBox(tr("Standardize"));
    mean_ = dspin(-1e9, 1e9, 5);
    mean_->setPrefix(tr("mean "));
    stddev_ = dspin(1e-9, 1e9, 5);
    stddev_->setPrefix(tr("std "));
    auto* normRow = new QHBoxLayout;
    normRow->addWidget(normalizeOn_);
    normRow->addWidget(mean_, 1);
    normRow->addWidget(stddev_, 1);
    form->addRow(QString(), normRow);
    oneHotOn_ = new QCheckBox(tr("One-hot labels"));
    oneHotDepth_ = new QSpinBox;
    oneHotDepth_->setRange(2, 100000);
    oneHotDepth_->setPrefix(tr("depth "));
    auto* ohRow = new QHBoxLayout;
    ohRow->addWidget(oneHotOn_);
    ohRow->addWidget(oneHotDepth_, 1);
    form->addRow(QString(), ohRow);

    cache_ = new QComboBox;
    cache_->setObjectName("cache");
    cache_->addItem(tr("none"), "none");
    cache_->addItem(tr("in memory"), "memory");
    cache_->addItem(tr("file"), "file");
    cacheFile_ = new QLineEdit;
    cacheFile_->setPlaceholderText(tr("cache file path"));
    auto* cacheRow = new QHBoxLayout;
    cacheRow->addWidget(cache_);
    cacheRow->addWidget(cacheFile_, 1);
    form->addRow(tr("Cache"), cacheRow);
    cacheEncoded_ = new QCheckBox(tr("keep the encoded files (decode every epoch)"));
    cacheEncoded_->setObjectName("cacheEncoded");
    cacheEncoded_->setToolTip(
        tr("The cache before the decode: the image files or records as stored, a fraction of "
           "the decoded size; the map workers decode them every epoch"));
    form->addRow(QString(), cacheEncoded_);
    connect(cacheEncoded_, &QCheckBox::toggled, this, &DataPanel::writePipeline);

    shuffle_ = new QSpinBox;
    shuffle_->setObjectName("shuffleBuffer");
    shuffle_->setRange(0, 100000000);
    shuffle_->setSpecialValueText(tr("off"));
    shuffle_->setToolTip(
        tr("Shuffle buffer size in samples; ≥ the dataset size gives a full "
           "shuffle. 0 = no shuffle."));
    reshuffle_ = new QCheckBox(tr("reshuffle each epoch"));
    auto* shRow = new QHBoxLayout;
    shRow->addWidget(shuffle_, 1);
    shRow->addWidget(reshuffle_);
    form->addRow(tr("Shuffle buffer"), shRow);

    batch_ = new QSpinBox;
    batch_->setObjectName("batchSize");
    batch_->setRange(1, 1 << 20);
    dropRemainder_ = new QCheckBox(tr("drop remainder"));
    auto* bRow = new QHBoxLayout;
    bRow->addWidget(batch_, 1);
    bRow->addWidget(dropRemainder_);
    form->addRow(tr("Batch size"), bRow);

    parallel_ = new AutotuneSpin(1, 256);
    parallel_->setToolTip(tr("Map workers (num_parallel_calls)."));
    form->addRow(tr("Parallel calls"), parallel_);
    prefetch_ = new AutotuneSpin(0, 1024);
    prefetch_->setToolTip(tr("Batches prepared ahead of the step loop; 0 = off."));
    form->addRow(tr("Prefetch"), prefetch_);
    validation_ = dspin(0.0, 0.9, 3);
    validation_->setObjectName("validationSplit");
    validation_->setSingleStep(0.05);
    validation_->setToolTip(
        tr("Last fraction of the training data held out for validation "
           "(taken before shuffling, as Keras' validation_split)."));
    form->addRow(tr("Validation split"), validation_);
    validateOnTest_ = new QCheckBox(tr("Validate on the test split after every epoch"));
    validateOnTest_->setObjectName("validateOnTest");
    validateOnTest_->setToolTip(
        tr("Keras' validation_data=(x_test, y_test); replaces the validation split."));
    form->addRow(QString(), validateOnTest_);
    pipelineText_ = new QLabel;
    pipelineText_->setObjectName("pipelineDescription");
    pipelineText_->setWordWrap(true);
    pipelineText_->setTextInteractionFlags(Qt::TextSelectableByMouse);
    pipelineText_->setToolTip(tr("The stages this pipeline runs, in order."));
    form->addRow(tr("Stages"), pipelineText_);

    for (QCheckBox* c :
         {scaleOn_, normalizeOn_, oneHotOn_, reshuffle_, dropRemainder_, validateOnTest_})
        connect(c, &QCheckBox::toggled, this, &DataPanel::writePipeline);
    for (QDoubleSpinBox* s : {scale_, mean_, stddev_, validation_})
        connect(s, &QDoubleSpinBox::valueChanged, this, &DataPanel::writePipeline);
    for (QSpinBox* s : {oneHotDepth_, shuffle_, batch_})
        connect(s, &QSpinBox::valueChanged, this, &DataPanel::writePipeline);
    connect(cache_, &QComboBox::activated, this, &DataPanel::writePipeline);
    connect(cacheFile_, &QLineEdit::textEdited, this, &DataPanel::writePipeline);
    connect(parallel_, &AutotuneSpin::edited, this, &DataPanel::writePipeline);
    connect(prefetch_, &AutotuneSpin::edited, this, &DataPanel::writePipeline);
    return box;
}

void DataPanel::reload() {
    loading_ = true;
    const td::DataConfig& d = project_->project().data;
    const td::SourceConfig& s = d.source;
    int idx = std::max(0, static_cast<int>(kSourceTypes.indexOf(q(s.type))));
    sourceType_->setCurrentIndex(idx);
    pages_->setCurrentIndex(idx);
    const QString fashionDir = fashionMnistDir();
    const bool haveFashion = QDir(fashionDir).exists();
    fashionStatus_->setText(
        haveFashion ? tr("70,000 grayscale 28×28 images of 10 clothing classes, read from %1.")
                          .arg(fashionDir)
                    : tr("<span style='color:#b00020'>Not installed: %1 is missing. Install the "
                         "Debian package <b>dataset-fashion-mnist</b>.</span>")
                          .arg(fashionDir));
    idxTrainX_->setPath(q(s.trainImages));
    idxTrainY_->setPath(q(s.trainLabels));
    idxTestX_->setPath(q(s.testImages));
    idxTestY_->setPath(q(s.testLabels));
    npyTrainX_->setPath(q(s.trainImages));
    npyTrainY_->setPath(q(s.trainLabels));
    npyTestX_->setPath(q(s.testImages));
    npyTestY_->setPath(q(s.testLabels));
    csvTrain_->setPath(q(s.trainPath));
    csvTest_->setPath(q(s.testPath));
    csvLabel_->setText(q(s.labelColumn));
    synSamples_->setValue(static_cast<int>(s.samples));
    synTestSamples_->setValue(static_cast<int>(s.testSamples));
    QStringList dims;
    for (int64_t v : s.sampleShape) dims << QString::number(v);
    synShape_->setText(dims.join(", "));
    synShapeError_->clear();
    synClasses_->setValue(static_cast<int>(s.classes));
    synSeed_->setValue(static_cast<int>(s.seed));
    const td::ImageDirectoryConfig& im = s.images;
    imgDir_->setPath(q(im.directory));
    imgTestDir_->setPath(q(im.testDirectory));
    imgHeight_->setValue(static_cast<int>(im.height));
    imgWidth_->setValue(static_cast<int>(im.width));
    imgColor_->setCurrentIndex(std::max(0, imgColor_->findData(q(im.colorMode))));
    imgLabels_->setCurrentIndex(std::max(0, imgLabels_->findData(q(im.labelMode))));
    imgValidation_->setValue(im.validationSplit);
    imgSeed_->setValue(static_cast<int>(std::min<uint32_t>(im.seed.value_or(0), INT32_MAX)));
    imgSkipBad_->setChecked(im.skipBadFiles);
    const td::TfRecordConfig& rc = s.records;
    recFiles_->setText(joinPatterns(rc.files));
    recTestFiles_->setText(joinPatterns(rc.testFiles));
    recCompression_->setCurrentIndex(std::max(0, recCompression_->findData(q(rc.compression))));
    recX_->setText(q(rc.xFeature));
    recDecode_->setCurrentIndex(std::max(0, recDecode_->findData(q(rc.xDecode))));
    recHeight_->setValue(static_cast<int>(rc.xDecode == "image" ? rc.image.height : 28));
    recWidth_->setValue(static_cast<int>(rc.xDecode == "image" ? rc.image.width : 28));
    recColor_->setCurrentIndex(std::max(0, recColor_->findData(q(rc.image.colorMode))));
    QStringList recDims;
    for (int64_t v : rc.xShape) recDims << QString::number(v);
    recShape_->setText(recDims.join(", "));
    recSkipBad_->setChecked(rc.skipBadFiles);
    recY_->setText(q(rc.yFeature));

    const td::PipelineConfig& p = d.pipeline;
    const td::MapStep* sc = findStep(p.map, "scale");
    scaleOn_->setChecked(sc != nullptr);
    scale_->setValue(sc ? sc->factor : 1.0 / 255.0);
    const td::MapStep* nm = findStep(p.map, "normalize");
    normalizeOn_->setChecked(nm != nullptr);
    mean_->setValue(nm ? nm->mean : 0.0);
    stddev_->setValue(nm ? nm->stddev : 1.0);
    const td::MapStep* oh = findStep(p.map, "one_hot");
    oneHotOn_->setChecked(oh != nullptr);
    oneHotDepth_->setValue(oh ? static_cast<int>(oh->depth) : 10);
    QString cache = q(p.cache);
    if (cache.startsWith("file:")) {
        cache_->setCurrentIndex(2);
        cacheFile_->setText(cache.mid(5));
    } else {
        cache_->setCurrentIndex(cache == "none" ? 0 : 1);
        cacheFile_->clear();
    }
    cacheFile_->setEnabled(cache_->currentIndex() == 2);
    cacheEncoded_->setChecked(encodedCache(p.map));
    cacheEncoded_->setEnabled(decodesFiles(project_->project().data.source.type) &&
                              cache_->currentIndex() != 0);
    shuffle_->setValue(static_cast<int>(std::min<int64_t>(p.shuffleBuffer, 100000000)));
    reshuffle_->setChecked(p.reshuffleEachIteration);
    batch_->setValue(static_cast<int>(project_->project().training.batchSize));
    dropRemainder_->setChecked(p.dropRemainder);
    parallel_->setValue(p.parallelCalls);
    prefetch_->setValue(p.prefetch);
    validation_->setValue(d.validationSplit);
    validateOnTest_->setChecked(d.validationData == "test");
    validation_->setEnabled(!validateOnTest_->isChecked());
    loading_ = false;
    draw_ = 0;
    updatePipelineText();
    updateAugmentToggle();
    if (augment_->isChecked()) augmentTimer_->start();
    schedulePreview();
}

void DataPanel::updatePipelineText() {
    const td::Project& p = project_->project();
    pipelineText_->setText(
        QString::fromStdString(td::api::describePipeline(p.data, p.training.batchSize)));
}

QString DataPanel::pipelineDescription() const {
    return pipelineText_->text();
}

void DataPanel::writeSource() {
    if (loading_) return;
    const QString type = sourceType_->currentData().toString();
    td::Shape shape;
    QString shapeError;
    const bool shapeOk =
        LayerPropertyEditor::parseShape(synShape_->text(), false, &shape, &shapeError);
    synShapeError_->setText(shapeOk ? QString() : tr("Sample shape: %1.").arg(shapeError));
    project_->edit(
        [&](td::Project& p) {
            td::SourceConfig& s = p.data.source;
            s.type = type.toStdString();
            // Only files and records are decoded by the pipeline; other sources are read whole.
            if (!decodesFiles(s.type)) setEncodedCache(p.data.pipeline.map, false);
            if (type == "idx") {
                s.trainImages = idxTrainX_->path().toStdString();
                s.trainLabels = idxTrainY_->path().toStdString();
                s.testImages = idxTestX_->path().toStdString();
                s.testLabels = idxTestY_->path().toStdString();
            } else if (type == "npy") {
                s.trainImages = npyTrainX_->path().toStdString();
                s.trainLabels = npyTrainY_->path().toStdString();
                s.testImages = npyTestX_->path().toStdString();
                s.testLabels = npyTestY_->path().toStdString();
            } else if (type == "csv") {
                s.trainPath = csvTrain_->path().toStdString();
                s.testPath = csvTest_->path().toStdString();
                s.labelColumn = csvLabel_->text().trimmed().toStdString();
            } else if (type == "synthetic") {
                s.samples = synSamples_->value();
                s.testSamples = synTestSamples_->value();
                if (shapeOk) s.sampleShape = shape;
                s.classes = synClasses_->value();
                s.seed = static_cast<uint64_t>(synSeed_->value());
            } else if (type == "image_directory") {
                td::ImageDirectoryConfig& im = s.images;
                im.directory = imgDir_->path().toStdString();
                im.testDirectory = imgTestDir_->path().toStdString();
                im.height = imgHeight_->value();
                im.width = imgWidth_->value();
                im.colorMode = imgColor_->currentData().toString().toStdString();
                im.labelMode = imgLabels_->currentData().toString().toStdString();
                im.validationSplit = imgValidation_->value();
                // A split needs a seed (as in Keras); the field shows 0 for none.
                if (imgSeed_->value() > 0 || im.validationSplit > 0)
                    im.seed = static_cast<uint32_t>(imgSeed_->value());
                else
                    im.seed.reset();
                im.skipBadFiles = imgSkipBad_->isChecked();
            } else if (type == "tfrecord") {
                td::TfRecordConfig& rc = s.records;
                rc.files = patternsOf(recFiles_->text());
                rc.testFiles = patternsOf(recTestFiles_->text());
                rc.compression = recCompression_->currentData().toString().toStdString();
                rc.xFeature = recX_->text().trimmed().toStdString();
                rc.xDecode = recDecode_->currentData().toString().toStdString();
                rc.image.height = recHeight_->value();
                rc.image.width = recWidth_->value();
                rc.image.colorMode = recColor_->currentData().toString().toStdString();
                td::Shape recShape;
                for (const QString& d : recShape_->text().split(',', Qt::SkipEmptyParts))
                    if (d.trimmed().toLongLong() > 0) recShape.push_back(d.trimmed().toLongLong());
                rc.xShape = recShape;
                rc.yFeature = recY_->text().trimmed().toStdString();
                rc.skipBadFiles = recSkipBad_->isChecked();
            }
        },
        this);
    {
        const QSignalBlocker quiet(cacheEncoded_);
        cacheEncoded_->setChecked(encodedCache(project_->project().data.pipeline.map));
        cacheEncoded_->setEnabled(decodesFiles(project_->project().data.source.type) &&
                                  cache_->currentIndex() != 0);
    }
    updatePipelineText();
    schedulePreview();
}

void DataPanel::writePipeline() {
    if (loading_) return;
    cacheFile_->setEnabled(cache_->currentIndex() == 2);
    cacheEncoded_->setEnabled(decodesFiles(project_->project().data.source.type) &&
                              cache_->currentIndex() != 0);
    project_->edit(
        [&](td::Project& p) {
            td::PipelineConfig& c = p.data.pipeline;
            setEncodedCache(c.map, cacheEncoded_->isEnabled() && cacheEncoded_->isChecked());
            const td::MapStep* sc = findStep(c.map, "scale");
            const td::MapStep* nm = findStep(c.map, "normalize");
            const double factor = sc ? shownValue(scale_, sc->factor) : scale_->value();
            const double mean = nm ? shownValue(mean_, nm->mean) : mean_->value();
            const double stddev = nm ? shownValue(stddev_, nm->stddev) : stddev_->value();
            setMapStep(c.map, "scale", scaleOn_->isChecked(),
                       td::MapStep{.op = "scale", .factor = factor}, true);
            setMapStep(c.map, "normalize", normalizeOn_->isChecked(),
                       td::MapStep{.op = "normalize", .mean = mean, .stddev = stddev}, false);
            setMapStep(c.map, "one_hot", oneHotOn_->isChecked(),
                       td::MapStep{.op = "one_hot", .depth = oneHotDepth_->value()}, false);
            const QString cache = cache_->currentData().toString();
            c.cache = cache == "file" ? "file:" + cacheFile_->text().trimmed().toStdString()
                                      : cache.toStdString();
            c.shuffleBuffer = shuffle_->value();
            c.reshuffleEachIteration = reshuffle_->isChecked();
            c.dropRemainder = dropRemainder_->isChecked();
            c.parallelCalls = parallel_->value();
            c.prefetch = prefetch_->value();
            p.training.batchSize = batch_->value();
            const bool onTest = validateOnTest_->isChecked();
            validation_->setEnabled(!onTest);
            p.data.validationData = onTest ? "test" : "none";
            p.data.validationSplit = onTest ? 0.0 : shownValue(validation_, p.data.validationSplit);
        },
        this);
    updatePipelineText();
}

// Loading a source costs CPU (Fashion-MNIST is 60,000 gzip'd images): only while the panel is
// shown, never competing with a run for nothing.
void DataPanel::schedulePreview() {
    if (isVisible()) {
        previewTimer_->start();
    } else {
        previewStale_ = true;
    }
}

void DataPanel::showEvent(QShowEvent* event) {
    QWidget::showEvent(event);
    if (previewStale_) {
        previewStale_ = false;
        previewTimer_->start();
    }
}

void DataPanel::loadPreview() {
    const td::SourceConfig cfg = project_->project().data.source;
    const QString problem = dataProblem(project_->project().data);
    if (!problem.isEmpty()) {
        previewStatus_->setText(
            tr("<span style='color:#b00020'>%1</span>").arg(problem.toHtmlEscaped()));
        samples_->clear();
        shown_.reset();
        augmentShown_ = false;
        emit previewLoaded(false);
        return;
    }
    const int generation = ++previewGeneration_;
    previewStatus_->setText(tr("Loading…"));
    previewLoading_ = true;
    runAsync(
        this, [cfg] { return td::api::previewData(cfg, kPreviewSamples); },
        [this, generation](td::Result<td::api::DataPreview> r) {
            if (generation != previewGeneration_) return;  // a newer request is on its way
            previewLoading_ = false;
            if (!r) {
                previewStatus_->setText(
                    tr("<span style='color:#b00020'>%1</span>")
                        .arg(QString::fromStdString(r.error()).toHtmlEscaped()));
                samples_->clear();
                shown_.reset();
                augmentShown_ = false;
                emit previewLoaded(false);
                return;
            }
            showPreview(r.value());
            emit previewLoaded(true);
            // The same samples after the layers, when asked for.
            updateAugmentToggle();
            if (augment_->isChecked()) loadAugmented();
        });
}

bool DataPanel::previewPending() const {
    return previewStale_ || previewLoading_ || previewTimer_->isActive();
}

int DataPanel::previewSampleCount() const {
    return samples_->count() > 0 ? samples_->count() : table_->rowCount();
}

void DataPanel::showPreview(const td::api::DataPreview& d) {
    shown_ = d;
    showSamples(d);
    // Class histogram over the whole training split.
    histogram_->clearPlottables();
    auto* bars = new QCPBars(histogram_->xAxis, histogram_->yAxis);
    bars->setBrush(QColor(31, 119, 180, 180));
    bars->setPen(QPen(QColor(31, 119, 180)));
    QSharedPointer<QCPAxisTickerText> ticker(new QCPAxisTickerText);
    QVector<double> keys, values;
    for (const auto& [label, count] : d.classCounts) {
        keys << label;
        values << static_cast<double>(count);
        ticker->addTick(label, q(d.className(label)));
    }
    bars->setData(keys, values);
    histogram_->xAxis->setTicker(ticker);
    histogram_->xAxis->setTickLabelRotation(d.classCounts.size() > 6 ? 45 : 0);
    histogram_->rescaleAxes();
    histogram_->xAxis->setRange(histogram_->xAxis->range().lower - 1,
                                histogram_->xAxis->range().upper + 1);
    histogram_->yAxis->setRangeLower(0);
    histogram_->replot(QCustomPlot::rpQueuedReplot);
}

// The samples as the source holds them: pictures, or a table of their first features.
void DataPanel::showSamples(const td::api::DataPreview& d) {
    auto className = [&](int label) { return q(d.className(label)); };
    augmentShown_ = false;
    previewStatus_->setText(tr("%1 training samples of shape %2 (%3), %4 test samples, %5 classes.")
                                .arg(d.trainSamples)
                                .arg(q(td::shapeToString(d.sampleShape)))
                                .arg(q(d.dtype))
                                .arg(d.testSamples)
                                .arg(d.numClasses));
    samples_->clear();
    table_->clear();
    const int shown = static_cast<int>(d.labels.size());
    samples_->setVisible(d.images());
    table_->setVisible(!d.images());
    if (d.images()) {
        showThumbnails(d.imageHeight, d.imageWidth, d.imageChannels, d.pixels, QString());
    } else if (shown > 0) {
        const int features = static_cast<int>(d.features.front().size());
        table_->setRowCount(shown);
        table_->setColumnCount(features + 1);
        QStringList headers{tr("label")};
        for (int f = 0; f < features; ++f) headers << QString("x[%1]").arg(f);
        table_->setHorizontalHeaderLabels(headers);
        for (int i = 0; i < shown; ++i) {
            const auto& row = d.features[static_cast<size_t>(i)];
            table_->setItem(i, 0,
                            new QTableWidgetItem(className(d.labels[static_cast<size_t>(i)])));
            for (int f = 0; f < features; ++f) {
                table_->setItem(
                    i, f + 1,
                    new QTableWidgetItem(QString::number(row[static_cast<size_t>(f)], 'g', 4)));
            }
        }
    }
}

// One thumbnail per sample (h x w x c, 0..255), labelled with the loaded preview's labels.
void DataPanel::showThumbnails(int h, int w, int c, const std::vector<std::vector<uint8_t>>& pixels,
                               const QString& tooltipSuffix) {
    samples_->clear();
    for (size_t i = 0; i < pixels.size(); ++i) {
        const std::vector<uint8_t>& px = pixels[i];
        QImage img(w, h, QImage::Format_RGB32);
        for (int y = 0; y < h; ++y) {
            for (int x = 0; x < w; ++x) {
                const uint8_t* v = &px[static_cast<size_t>((y * w + x) * c)];
                img.setPixel(x, y, c == 3 ? qRgb(v[0], v[1], v[2]) : qRgb(v[0], v[0], v[0]));
            }
        }
        img = img.scaled(56, 56, Qt::KeepAspectRatio, Qt::FastTransformation);
        const bool labelled = shown_ && i < shown_->labels.size();
        const int label = labelled ? shown_->labels[i] : -1;
        auto* item = new QListWidgetItem(QIcon(QPixmap::fromImage(img)),
                                         labelled ? q(shown_->className(label)) : QString());
        item->setToolTip(
            tr("sample %1, label %2, %3×%4%5").arg(i).arg(label).arg(h).arg(w).arg(tooltipSuffix));
        samples_->addItem(item);
    }
}

// The toggle is there when the model starts with layers to run on pictures.
void DataPanel::updateAugmentToggle() {
    const td::api::AugmentLayers layers = td::api::augmentLayers(project_->project());
    QString why;
    if (!layers.available()) {
        why = q(layers.unavailable);
    } else if (shown_ && !shown_->images()) {
        why = tr("the samples are not pictures");
    }
    const bool available = why.isEmpty();
    QStringList names;
    for (const std::string& n : layers.names) names << q(n);
    augment_->setEnabled(available);
    augment_->setToolTip(
        available ? tr("Show the samples after the model's first layers as a training step runs "
                       "them (random layers draw): %1. Values are shown on one scale for all "
                       "samples, the source's range carried through the map steps and Rescaling, "
                       "clamped.")
                        .arg(names.join(", "))
                  : tr("Not available: %1.").arg(why));
    if (!available && augment_->isChecked()) augment_->setChecked(false);
    nextDraw_->setEnabled(available && augment_->isChecked());
}

// The first samples after the layers, off the GUI thread (the source is read again).
void DataPanel::loadAugmented() {
    augmentTimer_->stop();
    if (!augment_->isChecked() || !augment_->isEnabled()) return;
    const int generation = ++augmentGeneration_;
    const td::Project project = project_->project();
    const uint64_t draw = draw_;
    previewStatus_->setText(tr("Running the model's first layers…"));
    runAsync(
        this, [project, draw] { return td::api::previewAugmented(project, kPreviewSamples, draw); },
        [this, generation](td::Result<td::api::AugmentedPreview> r) {
            if (generation != augmentGeneration_) return;  // untoggled, or a newer request
            if (!r) {
                previewStatus_->setText(
                    tr("<span style='color:#b00020'>After augmentation: %1</span>")
                        .arg(QString::fromStdString(r.error()).toHtmlEscaped()));
                emit augmentedPreviewLoaded(false);
                return;
            }
            showAugmented(r.value());
            emit augmentedPreviewLoaded(true);
        });
}

void DataPanel::showAugmented(const td::api::AugmentedPreview& a) {
    QStringList names;
    for (const std::string& n : a.layers) names << q(n);
    const QString size =
        a.imageChannels == 1
            ? QString("%1×%2").arg(a.imageHeight).arg(a.imageWidth)
            : QString("%1×%2×%3").arg(a.imageHeight).arg(a.imageWidth).arg(a.imageChannels);
    previewStatus_->setText(tr("After %1 (training mode, draw %2: the draws of step %3): %4 "
                               "samples of %5, values %6 to %7 shown black to white.")
                                .arg(names.join(", "))
                                .arg(a.draw)
                                .arg(a.step)
                                .arg(a.pixels.size())
                                .arg(size)
                                .arg(a.displayLow, 0, 'g', 4)
                                .arg(a.displayHigh, 0, 'g', 4));
    table_->setVisible(false);
    samples_->setVisible(true);
    showThumbnails(a.imageHeight, a.imageWidth, a.imageChannels, a.pixels,
                   tr(", after augmentation (draw %1)").arg(a.draw));
    augmentShown_ = true;
}

}  // namespace td::ui
