// Property editor for one layer: a form rebuilt for the layer's type. Every field is validated as
// it is typed; only valid values reach the model, and the reason for a rejected value is shown
// under the form.
#pragma once

#include <QWidget>
#include <functional>

#include "engine/api/projects.h"

class QFormLayout;
class QLabel;
class QLineEdit;

namespace td::ui {

class LayerPropertyEditor : public QWidget {
    Q_OBJECT
  public:
    // `nameTaken(name)` says whether another layer already uses a name.
    explicit LayerPropertyEditor(std::function<bool(const QString&)> nameTaken,
                                 QWidget* parent = nullptr);

    void setLayer(const td::LayerSpec& spec);  // rebuilds the form
    void clear();
    const td::LayerSpec& layer() const { return spec_; }
    QString validationMessage() const;

    // "28, 28" -> {28, 28}; allowInfer accepts a single -1. Errors say what was expected.
    static bool parseShape(const QString& text, bool allowInfer, td::Shape* out, QString* error);

  signals:
    void layerEdited(const td::LayerSpec& spec);

  private:
    void rebuild();
    // Emits layerEdited, except while a text field is only being checked (checkOnly_).
    void commit();
    // The reason a field's value is refused, in a note right under the field, in its tooltip and
    // in the list under the form; an empty message clears them.
    void setFieldError(QWidget* field, const QString& message);
    // Text fields: checked as they are typed (a refused value says why at once), applied when
    // finished (Enter, or leaving the field) and valid.
    template <class Handler>
    void connectText(QLineEdit* edit, Handler handler);
    void addActivationFields(QFormLayout* form);
    // Conv2D, pooling, normalization, padding and rescaling fields.
    void addImageLayerFields(QFormLayout* form);
    // Resizing, CenterCrop and the Random* augmentation layers' fields.
    void addPreprocessingFields(QFormLayout* form);
    // The layer's seed (Dropout, the Random* layers): empty = from the training seed.
    void addSeedRow(QFormLayout* form);
    QLineEdit* addSizesRow(QFormLayout* form, const QString& label, const char* objectName,
                           td::Shape* field, int count, int64_t min,
                           const QString& emptyMeans = {});
    void addInitializerRow(QFormLayout* form, const QString& label, td::InitializerSpec* init);
    void addRegularizerRow(QFormLayout* form, const QString& label, td::RegularizerSpec* reg);

    std::function<bool(const QString&)> nameTaken_;
    td::LayerSpec spec_;
    bool hasLayer_ = false;
    QWidget* formHost_ = nullptr;
    QLabel* title_ = nullptr;
    QLabel* message_ = nullptr;
    std::map<QWidget*, QString> fieldErrors_;
    std::map<QWidget*, QString> fieldTips_;  // a field's own tooltip, restored when it is valid
    bool checkOnly_ = false;
};

}  // namespace td::ui
