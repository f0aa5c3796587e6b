// Data panel: the source (built-in Fashion-MNIST, IDX, CSV, NPY, synthetic) with validated file
// pickers, a preview of samples (pictures for image data) with labels and a class histogram, and
// the input pipeline stages with AUTOTUNE where the engine has it. "After augmentation" shows the
// pictures after the model's leading preprocessing and augmentation layers as a training step
// runs them (engine/api/augment_preview.h), one draw at a time.
#pragma once

#include <QWidget>
#include <cstdint>
#include <memory>
#include <optional>

#include "engine/api/augment_preview.h"
#include "engine/api/data_preview.h"

class QCheckBox;
class QComboBox;
class QCustomPlot;
class QDoubleSpinBox;
class QLabel;
class QLineEdit;
class QListWidget;
class QPushButton;
class QSpinBox;
class QStackedWidget;
class QTableWidget;
class QTimer;

namespace td::ui {

class FilePicker;
class ProjectController;

// A count that can also be AUTOTUNE (tf.data.AUTOTUNE).
class AutotuneSpin : public QWidget {
    Q_OBJECT
  public:
    AutotuneSpin(int minimum, int maximum, QWidget* parent = nullptr);
    int64_t value() const;  // td::kAutotune or the count
    void setValue(int64_t v);
    QCheckBox* autotuneBox() const { return auto_; }
    QSpinBox* spin() const { return spin_; }

  signals:
    void edited(int64_t value);

  private:
    QCheckBox* auto_;
    QSpinBox* spin_;
};

class DataPanel : public QWidget {
    Q_OBJECT
  public:
    explicit DataPanel(ProjectController* project, QWidget* parent = nullptr);

    void loadPreview();  // asynchronous; previewLoaded() when done
    // A preview is due (the project changed) or loading: the samples and histogram shown are not
    // yet those of the current project. previewLoaded() follows once it is shown, when visible.
    bool previewPending() const;
    int previewSampleCount() const;
    QComboBox* sourceCombo() const { return sourceType_; }
    // The pipeline's stages in words (engine's describePipeline of the current project).
    QString pipelineDescription() const;
    // "After augmentation": disabled, with the reason as its tooltip, when the model has no
    // leading preprocessing or augmentation layers or the samples are not pictures.
    QCheckBox* augmentToggle() const { return augment_; }
    // The thumbnails are those after the layers (else the samples as the source holds them).
    bool augmentedShown() const { return augmentShown_; }
    uint64_t augmentDraw() const { return draw_; }

  signals:
    void previewLoaded(bool ok);
    // The pictures after augmentation are shown (ok) or their error is.
    void augmentedPreviewLoaded(bool ok);

  protected:
    void showEvent(QShowEvent* event) override;

  private:
    void reload();
    void buildSourcePages();
    QWidget* buildPipeline();
    void writeSource();
    void writePipeline();
    void showPreview(const td::api::DataPreview& preview);
    void showSamples(const td::api::DataPreview& preview);
    void showThumbnails(int height, int width, int channels,
                        const std::vector<std::vector<uint8_t>>& pixels,
                        const QString& tooltipSuffix);
    void updateAugmentToggle();
    void loadAugmented();
    void showAugmented(const td::api::AugmentedPreview& augmented);
    void updatePipelineText();
    void schedulePreview();

    ProjectController* project_;
    bool loading_ = false;
    int previewGeneration_ = 0;
    bool previewStale_ = true;
    bool previewLoading_ = false;

    QComboBox* sourceType_;
    QStackedWidget* pages_;
    QLabel* fashionStatus_;
    FilePicker* idxTrainX_;
    FilePicker* idxTrainY_;
    FilePicker* idxTestX_;
    FilePicker* idxTestY_;
    FilePicker* npyTrainX_;
    FilePicker* npyTrainY_;
    FilePicker* npyTestX_;
    FilePicker* npyTestY_;
    FilePicker* csvTrain_;
    FilePicker* csvTest_;
    QLineEdit* csvLabel_;
    QSpinBox* synSamples_;
    QSpinBox* synTestSamples_;
    QLineEdit* synShape_;
    QLabel* synShapeError_;
    QSpinBox* synClasses_;
    QSpinBox* synSeed_;
    FilePicker* imgDir_;
    FilePicker* imgTestDir_;
    QSpinBox* imgHeight_;
    QSpinBox* imgWidth_;
    QComboBox* imgColor_;
    QComboBox* imgLabels_;
    QDoubleSpinBox* imgValidation_;
    QSpinBox* imgSeed_;
    QCheckBox* imgSkipBad_;
    QLineEdit* recFiles_;
    QLineEdit* recTestFiles_;
    QComboBox* recCompression_;
    QLineEdit* recX_;
    QComboBox* recDecode_;
    QSpinBox* recHeight_;
    QSpinBox* recWidth_;
    QComboBox* recColor_;
    QLineEdit* recShape_;
    QLineEdit* recY_;
    QCheckBox* recSkipBad_;

    QCheckBox* scaleOn_;
    QDoubleSpinBox* scale_;
    QCheckBox* normalizeOn_;
    QDoubleSpinBox* mean_;
    QDoubleSpinBox* stddev_;
    QCheckBox* oneHotOn_;
    QSpinBox* oneHotDepth_;
    QComboBox* cache_;
    QLineEdit* cacheFile_;
    QCheckBox* cacheEncoded_;
    QSpinBox* shuffle_;
    QCheckBox* reshuffle_;
    QSpinBox* batch_;
    QCheckBox* dropRemainder_;
    AutotuneSpin* prefetch_;
    AutotuneSpin* parallel_;
    QDoubleSpinBox* validation_;
    QCheckBox* validateOnTest_;
    QLabel* pipelineText_;

    std::optional<td::api::DataPreview> shown_;  // the preview last loaded
    QCheckBox* augment_;
    QPushButton* nextDraw_;
    QTimer* augmentTimer_;
    uint64_t draw_ = 0;
    int augmentGeneration_ = 0;
    bool augmentShown_ = false;

    QLabel* previewStatus_;
    QListWidget* samples_;
    QTableWidget* table_;
    QCustomPlot* histogram_;
    QTimer* previewTimer_;
};

}  // namespace td::ui
