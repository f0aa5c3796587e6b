#include "ui/layer_property_editor.h"

#include <algorithm>

#include <QAbstractSpinBox>
#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QRegularExpression>
#include <QSpinBox>
#include <QVBoxLayout>

namespace td::ui {

namespace {

const std::vector<td::ActivationKind>& activations() {
    static const std::vector<td::ActivationKind> a{
        td::ActivationKind::Linear, td::ActivationKind::Relu,   td::ActivationKind::LeakyRelu,
        td::ActivationKind::Elu,    td::ActivationKind::Gelu,   td::ActivationKind::Sigmoid,
        td::ActivationKind::Tanh,   td::ActivationKind::Softmax};
    return a;
}

const QStringList& initializerNames() {
    static const QStringList names{"glorot_uniform", "glorot_normal", "he_uniform",
                                   "he_normal",      "lecun_uniform", "lecun_normal",
                                   "zeros",          "ones",          "constant",
                                   "random_uniform", "random_normal", "truncated_normal"};
    return names;
}

QString shapeToText(const td::Shape& s) {
    QStringList parts;
    for (int64_t d : s) parts << QString::number(d);
    return parts.join(", ");
}

QDoubleSpinBox* makeDoubleSpin(double lo, double hi, double step, int decimals, double value) {
    auto* s = new QDoubleSpinBox;
    s->setRange(lo, hi);
    s->setSingleStep(step);
    s->setDecimals(decimals);
    s->setValue(value);
    return s;
}

}  // namespace

LayerPropertyEditor::LayerPropertyEditor(std::function<bool(const QString&)> nameTaken,
                                         QWidget* parent)
    : QWidget(parent), nameTaken_(std::move(nameTaken)) {
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    title_ = new QLabel(tr("Select a layer to edit its properties."));
    title_->setWordWrap(true);
    QFont f = title_->font();
    f.setBold(true);
    title_->setFont(f);
    layout->addWidget(title_);
    formHost_ = new QWidget;
    layout->addWidget(formHost_);
    message_ = new QLabel;
    message_->setObjectName("propertyMessage");
    message_->setWordWrap(true);
    message_->setStyleSheet("color: #b00020;");
    layout->addWidget(message_);
    layout->addStretch(1);
}

void LayerPropertyEditor::clear() {
    hasLayer_ = false;
    spec_ = {};
    rebuild();
}

void LayerPropertyEditor::setLayer(const td::LayerSpec& spec) {
    hasLayer_ = true;
    spec_ = spec;
    rebuild();
}

QString LayerPropertyEditor::validationMessage() const {
    return message_->text();
}

bool LayerPropertyEditor::parseShape(const QString& text, bool allowInfer, td::Shape* out,
                                     QString* error) {
    td::Shape shape;
    QString t = text.trimmed();
    t.remove('(').remove(')').remove('[').remove(']');
    const QStringList parts = t.split(QRegularExpression("[,\\sx]+"), Qt::SkipEmptyParts);
    if (parts.isEmpty()) {
        *error = QObject::tr("expected dimensions such as \"28, 28\"");
        return false;
    }
    int inferred = 0;
    for (const QString& p : parts) {
        bool ok = false;
        qlonglong d = p.toLongLong(&ok);
        if (!ok) {
            *error = QObject::tr("\"%1\" is not a whole number").arg(p);
            return false;
        }
        if (d == -1 && allowInfer) {
            if (++inferred > 1) {
                *error = QObject::tr("only one dimension may be -1");
                return false;
            }
        } else if (d <= 0) {
            *error = allowInfer
                         ? QObject::tr("dimensions must be positive (or one -1), got %1").arg(d)
                         : QObject::tr("dimensions must be positive, got %1").arg(d);
            return false;
        }
        shape.push_back(d);
    }
    *out = shape;
    return true;
}

template <class Handler>
void LayerPropertyEditor::connectText(QLineEdit* edit, Handler handler) {
    connect(edit, &QLineEdit::textEdited, this, [this, handler](const QString& text) {
        checkOnly_ = true;
        handler(text);
        checkOnly_ = false;
    });
    connect(edit, &QLineEdit::editingFinished, this, [edit, handler] {
        if (!edit->isModified()) return;
        edit->setModified(false);
        handler(edit->text());
    });
}

void LayerPropertyEditor::setFieldError(QWidget* field, const QString& message) {
    if (!fieldTips_.count(field)) fieldTips_[field] = field->toolTip();
    const QString noteName = "fieldNote_" + field->objectName();
    auto* note = formHost_->findChild<QLabel*>(noteName);
    if (message.isEmpty()) {
        fieldErrors_.erase(field);
        field->setStyleSheet({});
        field->setToolTip(fieldTips_[field]);
        if (note) note->hide();
    } else {
        fieldErrors_[field] = message;
        field->setStyleSheet("border: 1px solid #b00020;");
        field->setToolTip(message);
        auto* form = qobject_cast<QFormLayout*>(formHost_->layout());
        int row = -1;
        QFormLayout::ItemRole role;
        if (form) form->getWidgetPosition(field, &row, &role);
        if (!note && row >= 0) {
            note = new QLabel;
            note->setObjectName(noteName);
            note->setWordWrap(true);
            note->setStyleSheet("color: #b00020;");
            form->insertRow(row + 1, QString(), note);
        }
        if (note) {
            note->setText(message);
            note->show();
        }
    }
    QStringList all;
    for (const auto& [w, m] : fieldErrors_) all << m;
    message_->setText(all.join('\n'));
}

void LayerPropertyEditor::commit() {
    if (checkOnly_) return;
    emit layerEdited(spec_);
}

void LayerPropertyEditor::rebuild() {
    fieldErrors_.clear();
    fieldTips_.clear();
    message_->clear();
    auto* layout = static_cast<QVBoxLayout*>(this->layout());
    auto* fresh = new QWidget;
    delete layout->replaceWidget(formHost_, fresh);  // the returned item is ours to delete
    formHost_->hide();  // deleteLater may run only after the next paint
    formHost_->deleteLater();
    formHost_ = fresh;
    if (!hasLayer_) {
        title_->setText(tr("Select a layer to edit its properties."));
        return;
    }
    title_->setText(tr("%1 layer").arg(td::layerTypeName(spec_.type)));
    auto* form = new QFormLayout(formHost_);
    form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);

    auto* name = new QLineEdit(QString::fromStdString(spec_.name));
    name->setObjectName("nameEdit");
    name->setToolTip(tr("Unique within the model: letters, digits, '_', '.', '-'."));
    connectText(name, [this, name](const QString& text) {
        static const QRegularExpression valid("^[A-Za-z_][A-Za-z0-9_.\\-]*$");
        if (!valid.match(text).hasMatch()) {
            setFieldError(name, tr("Name: use letters, digits, '_', '.' or '-', starting with a "
                                   "letter or '_'."));
        } else if (nameTaken_ && nameTaken_(text)) {
            setFieldError(name, tr("Name: another layer is already called \"%1\".").arg(text));
        } else {
            setFieldError(name, {});
            spec_.name = text.toStdString();
            commit();
        }
    });
    form->addRow(tr("Name"), name);

    auto* trainable = new QCheckBox;
    trainable->setObjectName("trainableCheck");
    trainable->setChecked(spec_.trainable);
    connect(trainable, &QCheckBox::toggled, this, [this](bool on) {
        spec_.trainable = on;
        commit();
    });
    form->addRow(tr("Trainable"), trainable);

    // Input shape: required on an Input layer, optional on a first non-Input layer.
    const bool isInput = spec_.type == td::LayerType::Input;
    auto* shape = new QLineEdit(shapeToText(spec_.inputShape));
    shape->setObjectName(isInput ? "shapeEdit" : "inputShapeEdit");
    shape->setPlaceholderText(isInput ? tr("e.g. 28, 28") : tr("only on a first layer"));
    shape->setToolTip(tr("Shape of one sample without the batch dimension."));
    connectText(shape, [this, shape, isInput](const QString& text) {
        if (!isInput && text.trimmed().isEmpty()) {
            setFieldError(shape, {});
            spec_.inputShape.clear();
            commit();
            return;
        }
        td::Shape s;
        QString error;
        if (!parseShape(text, false, &s, &error)) {
            setFieldError(shape, tr("Input shape: %1.").arg(error));
            return;
        }
        setFieldError(shape, {});
        spec_.inputShape = s;
        commit();
    });
    form->addRow(isInput ? tr("Shape") : tr("Input shape"), shape);

    switch (spec_.type) {
        case td::LayerType::Input:
        case td::LayerType::Flatten:
            break;
        case td::LayerType::Reshape: {
            auto* target = new QLineEdit(shapeToText(spec_.targetShape));
            target->setObjectName("targetShapeEdit");
            target->setPlaceholderText(tr("e.g. 28, 28 or -1"));
            connectText(target, [this, target](const QString& text) {
                td::Shape s;
                QString error;
                if (!parseShape(text, true, &s, &error)) {
                    setFieldError(target, tr("Target shape: %1.").arg(error));
                    return;
                }
                setFieldError(target, {});
                spec_.targetShape = s;
                commit();
            });
            form->addRow(tr("Target shape"), target);
            break;
        }
        case td::LayerType::Dense: {
            auto* units = new QSpinBox;
            units->setObjectName("unitsSpin");
            // 0 is accepted by the box so that it can be refused with a reason, not reverted.
            units->setRange(0, 1000000);
            units->setValue(static_cast<int>(std::max<int64_t>(1, spec_.units)));
            units->setToolTip(tr("Number of output features (1 to 1,000,000)."));
            connect(units, &QSpinBox::valueChanged, this, [this, units](int v) {
                if (v < 1) {
                    setFieldError(units, tr("Units: a Dense layer needs at least 1 unit."));
                    return;
                }
                setFieldError(units, {});
                spec_.units = v;
                commit();
            });
            form->addRow(tr("Units"), units);
            addActivationFields(form);
            auto* bias = new QCheckBox;
            bias->setObjectName("useBiasCheck");
            bias->setChecked(spec_.useBias);
            connect(bias, &QCheckBox::toggled, this, [this](bool on) {
                spec_.useBias = on;
                commit();
            });
            form->addRow(tr("Use bias"), bias);
            addInitializerRow(form, tr("Kernel initializer"), &spec_.kernelInitializer);
            addInitializerRow(form, tr("Bias initializer"), &spec_.biasInitializer);
            addRegularizerRow(form, tr("Kernel regularizer"), &spec_.kernelRegularizer);
            addRegularizerRow(form, tr("Bias regularizer"), &spec_.biasRegularizer);
            break;
        }
        case td::LayerType::Dropout: {
            auto* rate = makeDoubleSpin(0.0, 1.0, 0.05, 3, spec_.rate);
            rate->setObjectName("rateSpin");
            rate->setToolTip(tr("Fraction of inputs to drop, in [0, 1)."));
            connect(rate, &QDoubleSpinBox::valueChanged, this, [this, rate](double v) {
                if (v >= 1.0) {
                    setFieldError(rate, tr("Rate: below 1 (a rate of 1 would drop every input)."));
                    return;
                }
                setFieldError(rate, {});
                spec_.rate = v;
                commit();
            });
            form->addRow(tr("Rate"), rate);
            addSeedRow(form);
            break;
        }
        case td::LayerType::Activation:
            addActivationFields(form);
            break;
        case td::LayerType::Conv2D:
        case td::LayerType::MaxPooling2D:
        case td::LayerType::AveragePooling2D:
        case td::LayerType::GlobalAveragePooling2D:
        case td::LayerType::BatchNormalization:
        case td::LayerType::LayerNormalization:
        case td::LayerType::ZeroPadding2D:
        case td::LayerType::Rescaling:
            addImageLayerFields(form);
            break;
        case td::LayerType::Resizing:
        case td::LayerType::CenterCrop:
        case td::LayerType::RandomCrop:
        case td::LayerType::RandomFlip:
        case td::LayerType::RandomRotation:
        case td::LayerType::RandomZoom:
        case td::LayerType::RandomTranslation:
        case td::LayerType::RandomContrast:
        case td::LayerType::RandomBrightness:
            addPreprocessingFields(form);
            break;
    }
    // Numbers apply when typed in full (Enter, or leaving the box), not digit by digit.
    for (QAbstractSpinBox* box : formHost_->findChildren<QAbstractSpinBox*>())
        box->setKeyboardTracking(false);
}

// A line edit of sizes ("3, 3"): `count` whole numbers >= `min`; `emptyMeans` (when not empty)
// is what an empty field stands for (strides: the layer's default).
QLineEdit* LayerPropertyEditor::addSizesRow(QFormLayout* form, const QString& label,
                                            const char* objectName, td::Shape* field, int count,
                                            int64_t min, const QString& emptyMeans) {
    auto* edit = new QLineEdit(shapeToText(*field));
    edit->setObjectName(objectName);
    edit->setPlaceholderText(emptyMeans.isEmpty() ? tr("e.g. 3, 3") : emptyMeans);
    connectText(edit, [this, edit, field, count, min, label, emptyMeans](const QString& text) {
        QString t = text.trimmed();
        t.remove('(').remove(')').remove('[').remove(']');
        const QStringList parts = t.split(QRegularExpression("[,\\sx]+"), Qt::SkipEmptyParts);
        if (parts.isEmpty() && !emptyMeans.isEmpty()) {
            setFieldError(edit, {});
            field->clear();
            commit();
            return;
        }
        td::Shape sizes;
        for (const QString& p : parts) {
            bool ok = false;
            const qlonglong v = p.toLongLong(&ok);
            if (!ok || v < min) {
                setFieldError(edit,
                              tr("%1: \"%2\" is not a whole number >= %3.").arg(label, p).arg(min));
                return;
            }
            sizes.push_back(v);
        }
        if (sizes.size() != static_cast<size_t>(count)) {
            setFieldError(
                edit, tr("%1: expected %2 sizes, got %3.").arg(label).arg(count).arg(sizes.size()));
            return;
        }
        setFieldError(edit, {});
        *field = sizes;
        commit();
    });
    form->addRow(label, edit);
    return edit;
}

void LayerPropertyEditor::addImageLayerFields(QFormLayout* form) {
    auto paddingCombo = [&] {
        auto* padding = new QComboBox;
        padding->setObjectName("paddingCombo");
        padding->addItems({"valid", "same"});
        padding->setCurrentIndex(spec_.samePadding ? 1 : 0);
        padding->setToolTip(
            tr("valid: no padding; same: pad so that the output has "
               "ceil(input / stride) positions."));
        connect(padding, &QComboBox::activated, this, [this](int i) {
            spec_.samePadding = i == 1;
            commit();
        });
        form->addRow(tr("Padding"), padding);
    };
    auto checkRow = [&](const QString& label, const char* objectName, bool* field) {
        auto* box = new QCheckBox;
        box->setObjectName(objectName);
        box->setChecked(*field);
        connect(box, &QCheckBox::toggled, this, [this, field](bool on) {
            *field = on;
            commit();
        });
        form->addRow(label, box);
    };
    auto numberRow = [&](const QString& label, const char* objectName, double* field, double lo,
                         double hi, double step, int decimals) {
        auto* spin = makeDoubleSpin(lo, hi, step, decimals, *field);
        spin->setObjectName(objectName);
        connect(spin, &QDoubleSpinBox::valueChanged, this, [this, field](double v) {
            *field = v;
            commit();
        });
        form->addRow(label, spin);
    };
    switch (spec_.type) {
        case td::LayerType::Conv2D: {
            auto* filters = new QSpinBox;
            filters->setObjectName("filtersSpin");
            filters->setRange(0, 65536);
            filters->setValue(static_cast<int>(std::clamp<int64_t>(spec_.filters, 1, 65536)));
            connect(filters, &QSpinBox::valueChanged, this, [this, filters](int v) {
                if (v < 1) {
                    setFieldError(filters, tr("Filters: a Conv2D layer needs at least 1 filter."));
                    return;
                }
                setFieldError(filters, {});
                spec_.filters = v;
                commit();
            });
            form->addRow(tr("Filters"), filters);
            addSizesRow(form, tr("Kernel size"), "kernelSizeEdit", &spec_.kernelSize, 2, 1);
            addSizesRow(form, tr("Strides"), "stridesEdit", &spec_.strides, 2, 1,
                        tr("1, 1 when empty"));
            paddingCombo();
            addSizesRow(form, tr("Dilation rate"), "dilationEdit", &spec_.dilationRate, 2, 1);
            auto* groups = new QSpinBox;
            groups->setObjectName("groupsSpin");
            groups->setRange(1, 65536);
            groups->setValue(static_cast<int>(std::clamp<int64_t>(spec_.groups, 1, 65536)));
            groups->setToolTip(tr("Must divide the input channels and the filters."));
            connect(groups, &QSpinBox::valueChanged, this, [this](int v) {
                spec_.groups = v;
                commit();
            });
            form->addRow(tr("Groups"), groups);
            addActivationFields(form);
            checkRow(tr("Use bias"), "useBiasCheck", &spec_.useBias);
            addInitializerRow(form, tr("Kernel initializer"), &spec_.kernelInitializer);
            addInitializerRow(form, tr("Bias initializer"), &spec_.biasInitializer);
            addRegularizerRow(form, tr("Kernel regularizer"), &spec_.kernelRegularizer);
            addRegularizerRow(form, tr("Bias regularizer"), &spec_.biasRegularizer);
            break;
        }
        case td::LayerType::MaxPooling2D:
        case td::LayerType::AveragePooling2D:
            addSizesRow(form, tr("Pool size"), "poolSizeEdit", &spec_.poolSize, 2, 1);
            addSizesRow(form, tr("Strides"), "stridesEdit", &spec_.strides, 2, 1,
                        tr("the pool size when empty"));
            paddingCombo();
            break;
        case td::LayerType::BatchNormalization:
            numberRow(tr("Momentum"), "momentumSpin", &spec_.momentum, 0.0, 1.0, 0.01, 4);
            [[fallthrough]];
        case td::LayerType::LayerNormalization:
            numberRow(tr("Epsilon"), "epsilonSpin", &spec_.epsilon, 1e-9, 1.0, 1e-3, 9);
            checkRow(tr("Center (beta)"), "centerCheck", &spec_.center);
            checkRow(tr("Scale (gamma)"), "scaleCheck", &spec_.scale);
            break;
        case td::LayerType::ZeroPadding2D:
            addSizesRow(form, tr("Padding"), "zeroPaddingEdit", &spec_.zeroPadding, 4, 0)
                ->setToolTip(tr("Rows and columns of zeros: top, bottom, left, right."));
            break;
        case td::LayerType::Rescaling:
            numberRow(tr("Scale"), "rescaleSpin", &spec_.rescale, -1e6, 1e6, 0.001, 8);
            numberRow(tr("Offset"), "offsetSpin", &spec_.offset, -1e6, 1e6, 0.1, 6);
            break;
        default:
            break;
    }
}

void LayerPropertyEditor::addSeedRow(QFormLayout* form) {
    auto* seed = new QLineEdit(spec_.seed ? QString::number(*spec_.seed) : QString());
    seed->setObjectName("seedEdit");
    seed->setPlaceholderText(tr("empty = from the training seed"));
    connectText(seed, [this, seed](const QString& text) {
        if (text.trimmed().isEmpty()) {
            setFieldError(seed, {});
            spec_.seed.reset();
            commit();
            return;
        }
        bool ok = false;
        qulonglong v = text.trimmed().toULongLong(&ok);
        if (!ok) {
            setFieldError(seed, tr("Seed: expected a non-negative whole number."));
            return;
        }
        setFieldError(seed, {});
        spec_.seed = v;
        commit();
    });
    form->addRow(tr("Seed"), seed);
}

void LayerPropertyEditor::addPreprocessingFields(QFormLayout* form) {
    const td::LayerType type = spec_.type;
    auto sizeRow = [&](const QString& label, const char* objectName, int64_t* field) {
        auto* spin = new QSpinBox;
        spin->setObjectName(objectName);
        // 0 is accepted by the box so that it can be refused with a reason, not reverted.
        spin->setRange(0, 65536);
        spin->setValue(static_cast<int>(std::clamp<int64_t>(*field, 1, 65536)));
        connect(spin, &QSpinBox::valueChanged, this, [this, spin, field, label](int v) {
            if (v < 1) {
                setFieldError(spin, tr("%1: at least 1 pixel.").arg(label));
                return;
            }
            setFieldError(spin, {});
            *field = v;
            commit();
        });
        form->addRow(label, spin);
    };
    auto comboRow = [&](const QString& label, const char* objectName, const QStringList& items,
                        int current, std::function<void(int)> apply) {
        auto* combo = new QComboBox;
        combo->setObjectName(objectName);
        combo->addItems(items);
        combo->setCurrentIndex(current);
        connect(combo, &QComboBox::activated, this, [this, apply](int i) {
            apply(i);
            commit();
        });
        form->addRow(label, combo);
    };
    auto numberRow = [&](const QString& label, const char* objectName, double* field, double lo,
                         double hi, double step) {
        auto* spin = makeDoubleSpin(lo, hi, step, 4, *field);
        spin->setObjectName(objectName);
        connect(spin, &QDoubleSpinBox::valueChanged, this, [this, field](double v) {
            *field = v;
            commit();
        });
        form->addRow(label, spin);
    };
    // A factor's lower and upper values (Keras: `factor` as [lower, upper]), in [lo, hi].
    auto rangeRow = [&](const QString& label, const char* objectName, td::FactorRange* range,
                        double lo, double hi) {
        auto* lower = makeDoubleSpin(lo, hi, 0.05, 4, range->lower);
        auto* upper = makeDoubleSpin(lo, hi, 0.05, 4, range->upper);
        lower->setObjectName(QString(objectName) + "Lower");
        upper->setObjectName(QString(objectName) + "Upper");
        lower->setPrefix(tr("from "));
        upper->setPrefix(tr("to "));
        auto apply = [this, lower, upper, range, label] {
            if (lower->value() > upper->value()) {
                setFieldError(lower, tr("%1: the lower value is above the upper one.").arg(label));
                return;
            }
            setFieldError(lower, {});
            range->lower = lower->value();
            range->upper = upper->value();
            commit();
        };
        connect(lower, &QDoubleSpinBox::valueChanged, this, apply);
        connect(upper, &QDoubleSpinBox::valueChanged, this, apply);
        auto* row = new QWidget;
        auto* h = new QHBoxLayout(row);
        h->setContentsMargins(0, 0, 0, 0);
        h->addWidget(lower);
        h->addWidget(upper);
        form->addRow(label, row);
    };
    auto interpolationRow = [&] {
        comboRow(tr("Interpolation"), "interpolationCombo", {"bilinear", "nearest"},
                 spec_.interpolation == td::InterpolationKind::Nearest ? 1 : 0, [this](int i) {
                     spec_.interpolation =
                         i == 1 ? td::InterpolationKind::Nearest : td::InterpolationKind::Bilinear;
                 });
    };
    auto fillRows = [&] {
        const QStringList modes{"reflect", "wrap", "constant", "nearest"};
        comboRow(tr("Fill mode"), "fillModeCombo", modes,
                 static_cast<int>(modes.indexOf(td::fillModeName(spec_.fillMode))),
                 [this, modes](int i) {
                     spec_.fillMode = *td::parseFillMode(modes.at(i).toStdString());
                 });
        numberRow(tr("Fill value"), "fillValueSpin", &spec_.fillValue, -1e6, 1e6, 1.0);
    };
    switch (type) {
        case td::LayerType::Resizing:
            sizeRow(tr("Height"), "heightSpin", &spec_.targetHeight);
            sizeRow(tr("Width"), "widthSpin", &spec_.targetWidth);
            interpolationRow();
            comboRow(tr("Aspect ratio"), "aspectRatioCombo",
                     {tr("stretch"), tr("crop to it"), tr("pad to it")},
                     spec_.cropToAspectRatio  ? 1
                     : spec_.padToAspectRatio ? 2
                                              : 0,
                     [this](int i) {
                         spec_.cropToAspectRatio = i == 1;
                         spec_.padToAspectRatio = i == 2;
                     });
            numberRow(tr("Pad value"), "fillValueSpin", &spec_.fillValue, -1e6, 1e6, 1.0);
            break;
        case td::LayerType::CenterCrop:
        case td::LayerType::RandomCrop:
            sizeRow(tr("Height"), "heightSpin", &spec_.targetHeight);
            sizeRow(tr("Width"), "widthSpin", &spec_.targetWidth);
            if (type == td::LayerType::RandomCrop) addSeedRow(form);
            break;
        case td::LayerType::RandomFlip: {
            const QStringList modes{"horizontal_and_vertical", "horizontal", "vertical"};
            comboRow(tr("Mode"), "flipModeCombo", modes,
                     static_cast<int>(modes.indexOf(td::flipModeName(spec_.flipMode))),
                     [this, modes](int i) {
                         spec_.flipMode = *td::parseFlipMode(modes.at(i).toStdString());
                     });
            addSeedRow(form);
            break;
        }
        case td::LayerType::RandomRotation:
            rangeRow(tr("Factor (turns)"), "factor", &spec_.factor, -1.0, 1.0);
            fillRows();
            interpolationRow();
            addSeedRow(form);
            break;
        case td::LayerType::RandomZoom:
        case td::LayerType::RandomTranslation: {
            const bool zoom = type == td::LayerType::RandomZoom;
            const double lo = zoom ? -0.9999 : -1.0;
            rangeRow(tr("Height factor"), "heightFactor", &spec_.heightFactor, lo, 1.0);
            if (zoom) {
                auto* own = new QCheckBox;
                own->setObjectName("ownWidthCheck");
                own->setChecked(spec_.widthFactor.has_value());
                own->setToolTip(tr("Off: the width is zoomed as the height."));
                connect(own, &QCheckBox::toggled, this, [this](bool on) {
                    if (on)
                        spec_.widthFactor = spec_.heightFactor;
                    else
                        spec_.widthFactor.reset();
                    commit();
                    rebuild();  // the width factor's row comes and goes
                });
                form->addRow(tr("Own width factor"), own);
            } else if (!spec_.widthFactor) {
                spec_.widthFactor = td::FactorRange{};
            }
            if (spec_.widthFactor)
                rangeRow(tr("Width factor"), "widthFactor", &*spec_.widthFactor, lo, 1.0);
            fillRows();
            interpolationRow();
            addSeedRow(form);
            break;
        }
        case td::LayerType::RandomContrast:
        case td::LayerType::RandomBrightness:
            rangeRow(tr("Factor"), "factor", &spec_.factor,
                     type == td::LayerType::RandomContrast ? 0.0 : -1.0, 1.0);
            numberRow(tr("Values from"), "valueLowSpin", &spec_.valueLow, -1e6, 1e6, 1.0);
            numberRow(tr("Values to"), "valueHighSpin", &spec_.valueHigh, -1e6, 1e6, 1.0);
            addSeedRow(form);
            break;
        default:
            break;
    }
}

void LayerPropertyEditor::addActivationFields(QFormLayout* form) {
    auto* combo = new QComboBox;
    combo->setObjectName("activationCombo");
    for (td::ActivationKind a : activations()) {
        combo->addItem(td::activationName(a), static_cast<int>(a));
    }
    combo->setCurrentIndex(combo->findData(static_cast<int>(spec_.activation)));
    connect(combo, &QComboBox::activated, this, [this, combo](int) {
        spec_.activation = static_cast<td::ActivationKind>(combo->currentData().toInt());
        commit();
        rebuild();  // slope / alpha fields depend on the activation
    });
    form->addRow(tr("Activation"), combo);
    if (spec_.activation == td::ActivationKind::LeakyRelu) {
        auto* slope = makeDoubleSpin(0.0, 10.0, 0.05, 3, spec_.negativeSlope);
        slope->setObjectName("negativeSlopeSpin");
        connect(slope, &QDoubleSpinBox::valueChanged, this, [this](double v) {
            spec_.negativeSlope = v;
            commit();
        });
        form->addRow(tr("Negative slope"), slope);
    } else if (spec_.activation == td::ActivationKind::Elu) {
        auto* alpha = makeDoubleSpin(0.0, 10.0, 0.1, 3, spec_.eluAlpha);
        alpha->setObjectName("eluAlphaSpin");
        connect(alpha, &QDoubleSpinBox::valueChanged, this, [this](double v) {
            spec_.eluAlpha = v;
            commit();
        });
        form->addRow(tr("ELU alpha"), alpha);
    }
}

void LayerPropertyEditor::addInitializerRow(QFormLayout* form, const QString& label,
                                            td::InitializerSpec* init) {
    auto* combo = new QComboBox;
    combo->addItems(initializerNames());
    QString current = QString::fromStdString(init->name);
    if (combo->findText(current) < 0) combo->addItem(current);
    combo->setCurrentText(current);
    auto* value = makeDoubleSpin(-1e6, 1e6, 0.01, 4, init->value);
    value->setToolTip(tr("Value of the constant initializer."));
    value->setVisible(current == "constant");
    connect(combo, &QComboBox::activated, this, [this, combo, value, init](int) {
        init->name = combo->currentText().toStdString();
        value->setVisible(init->name == "constant");
        commit();
    });
    connect(value, &QDoubleSpinBox::valueChanged, this, [this, init](double v) {
        init->value = v;
        commit();
    });
    auto* row = new QWidget;
    auto* h = new QHBoxLayout(row);
    h->setContentsMargins(0, 0, 0, 0);
    h->addWidget(combo, 1);
    h->addWidget(value);
    form->addRow(label, row);
}

void LayerPropertyEditor::addRegularizerRow(QFormLayout* form, const QString& label,
                                            td::RegularizerSpec* reg) {
    auto* l1 = makeDoubleSpin(0.0, 10.0, 1e-4, 6, reg->l1);
    auto* l2 = makeDoubleSpin(0.0, 10.0, 1e-4, 6, reg->l2);
    l1->setPrefix("L1 ");
    l2->setPrefix("L2 ");
    connect(l1, &QDoubleSpinBox::valueChanged, this, [this, reg](double v) {
        reg->l1 = v;
        commit();
    });
    connect(l2, &QDoubleSpinBox::valueChanged, this, [this, reg](double v) {
        reg->l2 = v;
        commit();
    });
    auto* row = new QWidget;
    auto* h = new QHBoxLayout(row);
    h->setContentsMargins(0, 0, 0, 0);
    h->addWidget(l1);
    h->addWidget(l2);
    form->addRow(label, row);
}

}  // namespace td::ui
