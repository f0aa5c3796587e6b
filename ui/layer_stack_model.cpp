#include "ui/layer_stack_model.h"

#include <algorithm>

#include <QBrush>
#include <QColor>
#include <QDataStream>
#include <QFont>
#include <QIODevice>
#include <QLocale>
#include <QMimeData>
#include <QRegularExpression>

namespace td::ui {

namespace {

QString shapeText(const td::Shape& s) {
    // Keras prints the batch dimension as None.
    QStringList parts{"None"};
    for (int64_t d : s) parts << QString::number(d);
    return "(" + parts.join(", ") + ")";
}

QString baseName(td::LayerType t) {
    return QString::fromLatin1(td::defaultLayerNamePrefix(t));  // Keras' prefixes
}

}  // namespace

const std::vector<td::LayerType>& supportedLayerTypes() {
    static const std::vector<td::LayerType> types{td::LayerType::Input,
                                                  td::LayerType::Flatten,
                                                  td::LayerType::Reshape,
                                                  td::LayerType::Dense,
                                                  td::LayerType::Dropout,
                                                  td::LayerType::Activation,
                                                  td::LayerType::Conv2D,
                                                  td::LayerType::MaxPooling2D,
                                                  td::LayerType::AveragePooling2D,
                                                  td::LayerType::GlobalAveragePooling2D,
                                                  td::LayerType::BatchNormalization,
                                                  td::LayerType::LayerNormalization,
                                                  td::LayerType::ZeroPadding2D,
                                                  td::LayerType::Rescaling,
                                                  td::LayerType::Resizing,
                                                  td::LayerType::CenterCrop,
                                                  td::LayerType::RandomCrop,
                                                  td::LayerType::RandomFlip,
                                                  td::LayerType::RandomRotation,
                                                  td::LayerType::RandomZoom,
                                                  td::LayerType::RandomTranslation,
                                                  td::LayerType::RandomContrast,
                                                  td::LayerType::RandomBrightness};
    return types;
}

QString layerTypeDescription(td::LayerType t) {
    switch (t) {
        case td::LayerType::Input:
            return QObject::tr("Declares the shape of one sample (without the batch dimension).");
        case td::LayerType::Flatten:
            return QObject::tr("Flattens each sample to one dimension.");
        case td::LayerType::Reshape:
            return QObject::tr("Reshapes each sample; one dimension may be -1 (inferred).");
        case td::LayerType::Dense:
            return QObject::tr("Fully connected layer: activation(x · W + b).");
        case td::LayerType::Dropout:
            return QObject::tr("Randomly zeroes a fraction of inputs while training.");
        case td::LayerType::Activation:
            return QObject::tr("Applies an activation function element-wise.");
        case td::LayerType::Conv2D:
            return QObject::tr(
                "2-D convolution over an image [height, width, channels]: "
                "activation(conv(x, kernel) + b).");
        case td::LayerType::MaxPooling2D:
            return QObject::tr("The maximum of each pooling window of an image.");
        case td::LayerType::AveragePooling2D:
            return QObject::tr("The mean of each pooling window of an image.");
        case td::LayerType::GlobalAveragePooling2D:
            return QObject::tr("The mean over height and width: one value per channel.");
        case td::LayerType::BatchNormalization:
            return QObject::tr(
                "Normalizes each channel with the batch's statistics while "
                "training and the moving statistics at inference.");
        case td::LayerType::LayerNormalization:
            return QObject::tr("Normalizes each sample over its last axis.");
        case td::LayerType::ZeroPadding2D:
            return QObject::tr("Adds rows and columns of zeros around an image.");
        case td::LayerType::Rescaling:
            return QObject::tr("x * scale + offset, e.g. pixels 0..255 to 0..1.");
        case td::LayerType::Resizing:
            return QObject::tr("Resizes images to a height and width (bilinear or nearest).");
        case td::LayerType::CenterCrop:
            return QObject::tr("Crops the centre of each image to a height and width.");
        case td::LayerType::RandomCrop:
            return QObject::tr(
                "Crops a random window of each image while training; the centre at "
                "inference.");
        case td::LayerType::RandomFlip:
            return QObject::tr("Mirrors images at random while training.");
        case td::LayerType::RandomRotation:
            return QObject::tr("Rotates images by a random angle while training.");
        case td::LayerType::RandomZoom:
            return QObject::tr("Zooms images in or out at random while training.");
        case td::LayerType::RandomTranslation:
            return QObject::tr("Shifts images by a random offset while training.");
        case td::LayerType::RandomContrast:
            return QObject::tr("Scales each image's contrast at random while training.");
        case td::LayerType::RandomBrightness:
            return QObject::tr("Shifts each image's brightness at random while training.");
    }
    return {};
}

LayerStackModel::LayerStackModel(QObject* parent) : QAbstractTableModel(parent) {
    revalidate();
}

void LayerStackModel::setSpec(const td::ModelSpec& spec) {
    beginResetModel();
    spec_ = spec;
    revalidate();
    endResetModel();
}

td::LayerSpec LayerStackModel::makeLayer(td::LayerType type) const {
    td::LayerSpec l;
    l.type = type;
    l.name = uniqueName(baseName(type)).toStdString();
    switch (type) {
        case td::LayerType::Input:
            l.inputShape = {28, 28};
            break;
        case td::LayerType::Reshape:
            l.targetShape = {-1};
            break;
        case td::LayerType::Dense:
            l.units = 64;
            l.activation = td::ActivationKind::Relu;
            break;
        case td::LayerType::Dropout:
            l.rate = 0.2;
            break;
        case td::LayerType::Activation:
            l.activation = td::ActivationKind::Relu;
            break;
        case td::LayerType::Conv2D:
            l.filters = 32;
            l.activation = td::ActivationKind::Relu;
            break;
        case td::LayerType::Rescaling:
            l.rescale = 1.0 / 255.0;
            break;
        // Augmentation and resizing with Keras' defaults and the arguments its guides use.
        case td::LayerType::Resizing:
            l.targetHeight = l.targetWidth = 32;
            break;
        case td::LayerType::CenterCrop:
        case td::LayerType::RandomCrop:
            l.targetHeight = l.targetWidth = 24;
            break;
        case td::LayerType::RandomRotation:
            l.factor = td::FactorRange{-0.1, 0.1};
            break;
        case td::LayerType::RandomZoom:
            l.heightFactor = td::FactorRange{-0.1, 0.1};
            break;
        case td::LayerType::RandomTranslation:
            l.heightFactor = td::FactorRange{-0.1, 0.1};
            l.widthFactor = td::FactorRange{-0.1, 0.1};
            break;
        case td::LayerType::RandomContrast:
            l.factor = td::FactorRange{0.0, 0.2};
            break;
        case td::LayerType::RandomBrightness:
            l.factor = td::FactorRange{-0.2, 0.2};
            break;
        case td::LayerType::RandomFlip:  // horizontal_and_vertical
        case td::LayerType::Flatten:
        case td::LayerType::MaxPooling2D:
        case td::LayerType::AveragePooling2D:
        case td::LayerType::GlobalAveragePooling2D:
        case td::LayerType::BatchNormalization:
        case td::LayerType::LayerNormalization:
        case td::LayerType::ZeroPadding2D:
            break;  // the Keras defaults of LayerSpec
    }
    return l;
}

bool LayerStackModel::nameTaken(const QString& name, int ignoreRow) const {
    for (int i = 0; i < layerCount(); ++i) {
        if (i != ignoreRow && QString::fromStdString(spec_.layers[i].name) == name) return true;
    }
    return false;
}

QString LayerStackModel::uniqueName(const QString& base, int ignoreRow) const {
    if (!nameTaken(base, ignoreRow)) return base;
    for (int n = 1;; ++n) {
        QString candidate = QString("%1_%2").arg(base).arg(n);
        if (!nameTaken(candidate, ignoreRow)) return candidate;
    }
}

int LayerStackModel::insertLayer(int row, td::LayerType type) {
    row = std::clamp(row, 0, layerCount());
    beginInsertRows({}, row, row);
    spec_.layers.insert(spec_.layers.begin() + row, makeLayer(type));
    endInsertRows();
    edited();
    return row;
}

void LayerStackModel::updateLayer(int row, const td::LayerSpec& spec) {
    if (row < 0 || row >= layerCount()) return;
    spec_.layers[row] = spec;
    edited();
}

bool LayerStackModel::moveLayer(int from, int to) {
    int n = layerCount();
    if (from < 0 || from >= n || to < 0 || to >= n || from == to) return false;
    // beginMoveRows wants the destination in pre-removal coordinates.
    int dest = to > from ? to + 1 : to;
    beginMoveRows({}, from, from, {}, dest);
    td::LayerSpec l = std::move(spec_.layers[from]);
    spec_.layers.erase(spec_.layers.begin() + from);
    spec_.layers.insert(spec_.layers.begin() + to, std::move(l));
    endMoveRows();
    edited();
    return true;
}

int LayerStackModel::duplicateLayer(int row) {
    if (row < 0 || row >= layerCount()) return -1;
    td::LayerSpec copy = spec_.layers[row];
    QString base = QString::fromStdString(copy.name);
    base.remove(QRegularExpression("_\\d+$"));
    copy.name = uniqueName(base).toStdString();
    beginInsertRows({}, row + 1, row + 1);
    spec_.layers.insert(spec_.layers.begin() + row + 1, std::move(copy));
    endInsertRows();
    edited();
    return row + 1;
}

void LayerStackModel::removeLayer(int row) {
    if (row < 0 || row >= layerCount()) return;
    beginRemoveRows({}, row, row);
    spec_.layers.erase(spec_.layers.begin() + row);
    endRemoveRows();
    edited();
}

void LayerStackModel::edited() {
    revalidate();
    emit specEdited();
}

void LayerStackModel::revalidate() {
    const int n = layerCount();
    rowInfo_.assign(n, std::nullopt);
    errorRow_ = -1;
    errorText_.reset();
    info_ = {};
    summaryTable_.clear();

    // Maps inference results back to spec rows: ModelInfo::layers excludes Input layers.
    auto assign = [&](const td::ModelSpec& m, const td::ModelInfo& info) {
        size_t k = 0;
        for (size_t i = 0; i < m.layers.size(); ++i) {
            if (m.layers[i].type == td::LayerType::Input) {
                td::LayerInfo li;
                li.name = m.layers[i].name;
                li.typeName = "InputLayer";
                li.outputShape = m.layers[i].inputShape;
                rowInfo_[i] = li;
            } else if (k < info.layers.size()) {
                rowInfo_[i] = info.layers[k++];
            }
        }
    };

    auto result = td::api::summarizeModel(spec_);
    if (result) {
        info_ = result->info;
        summaryTable_ = result->table;
        assign(result->model, info_);
    } else {
        QString msg = QString::fromStdString(result.error());
        errorText_ = msg;
        // Blame the layer the engine names; otherwise the shortest prefix that fails the same way.
        static const QRegularExpression quoted("'([^']+)'");
        auto m = quoted.match(msg);
        if (m.hasMatch()) {
            for (int i = 0; i < n; ++i) {
                if (QString::fromStdString(spec_.layers[i].name) == m.captured(1)) errorRow_ = i;
            }
        }
        auto prefixOf = [&](int k) {
            td::ModelSpec prefix;
            prefix.name = spec_.name;
            prefix.layers.assign(spec_.layers.begin(), spec_.layers.begin() + k);
            return prefix;
        };
        if (errorRow_ < 0) {
            for (int k = 1; k <= n && errorRow_ < 0; ++k) {
                auto r = td::api::summarizeModel(prefixOf(k));
                if (!r && r.error() == result.error()) errorRow_ = k - 1;
            }
        }
        if (errorRow_ > 0) {
            auto r = td::api::summarizeModel(prefixOf(errorRow_));
            if (r) assign(r->model, r->info);
        }
    }
    if (n > 0) emit dataChanged(index(0, 0), index(n - 1, ColCount - 1));
    emit validationChanged();
}

QString LayerStackModel::summaryText() const {
    if (errorText_) return tr("Model is invalid:\n%1").arg(*errorText_);
    QString table = QString::fromStdString(summaryTable_);
    QLocale loc = QLocale::c();
    const double kib = 1024.0;
    double actKiB = static_cast<double>(info_.activationBytesPerSample) / kib;
    double keptKiB = static_cast<double>(info_.keptForBackwardBytesPerSample) / kib;
    double paramMiB = static_cast<double>(info_.totalParams) * 4.0 / (kib * kib);
    table += tr("\nEstimated memory per sample: %1 KiB of f32 activations (forward pass), of "
                "which training keeps %2 KiB until the backward pass reads them (inputs of "
                "Dense and Conv2D, normalization and max-pooling inputs, activations)\n"
                "Parameters: %3 MiB as f32 (Adam adds two slots of the same size)")
                 .arg(loc.toString(actKiB, 'f', 1))
                 .arg(loc.toString(keptKiB, 'f', 1))
                 .arg(loc.toString(paramMiB, 'f', 2));
    return table;
}

int LayerStackModel::rowCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : layerCount();
}

int LayerStackModel::columnCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : ColCount;
}

QVariant LayerStackModel::data(const QModelIndex& index, int role) const {
    if (!index.isValid() || index.row() >= layerCount()) return {};
    const int row = index.row();
    const td::LayerSpec& l = spec_.layers[row];
    const auto& info = rowInfo_[row];
    const bool bad = row == errorRow_;
    if (role == Qt::DisplayRole) {
        switch (index.column()) {
            case ColIndex:
                return row;
            case ColLayer:
                return QString("%1 (%2)").arg(QString::fromStdString(l.name),
                                              td::layerTypeName(l.type));
            case ColOutputShape:
                if (bad) return tr("⚠ %1").arg(errorText());
                return info ? shapeText(info->outputShape) : QString("?");
            case ColParams:
                return info ? QLocale::c().toString(static_cast<qlonglong>(info->params))
                            : QString("?");
        }
    } else if (role == Qt::ToolTipRole) {
        if (bad) return errorText();
        return layerTypeDescription(l.type);
    } else if (role == Qt::ForegroundRole) {
        if (bad) return QBrush(QColor(0xb0, 0x00, 0x20));
        if (!info) return QBrush(Qt::gray);
    } else if (role == Qt::BackgroundRole) {
        if (bad) return QBrush(QColor(0xff, 0xe4, 0xe4));
    } else if (role == Qt::TextAlignmentRole) {
        if (index.column() == ColParams || index.column() == ColIndex)
            return int(Qt::AlignRight | Qt::AlignVCenter);
    } else if (role == Qt::UserRole) {
        return static_cast<int>(l.type);
    }
    return {};
}

QVariant LayerStackModel::headerData(int section, Qt::Orientation o, int role) const {
    if (o != Qt::Horizontal || role != Qt::DisplayRole) return {};
    switch (section) {
        case ColIndex:
            return "#";
        case ColLayer:
            return tr("Layer (type)");
        case ColOutputShape:
            return tr("Output shape");
        case ColParams:
            return tr("Param #");
    }
    return {};
}

Qt::ItemFlags LayerStackModel::flags(const QModelIndex& index) const {
    Qt::ItemFlags f = Qt::ItemIsDropEnabled;
    if (index.isValid()) f |= Qt::ItemIsEnabled | Qt::ItemIsSelectable | Qt::ItemIsDragEnabled;
    return f;
}

// Reorders are applied by dropMimeData itself and announced as copies, so the view never removes
// the source row after a drop.
Qt::DropActions LayerStackModel::supportedDropActions() const {
    return Qt::CopyAction | Qt::MoveAction;
}

Qt::DropActions LayerStackModel::supportedDragActions() const {
    return Qt::CopyAction;
}

QStringList LayerStackModel::mimeTypes() const {
    return {kLayerRowsMime, kLayerTypeMime};
}

QMimeData* LayerStackModel::mimeData(const QModelIndexList& indexes) const {
    if (indexes.isEmpty()) return nullptr;
    auto* mime = new QMimeData;
    mime->setData(kLayerRowsMime, QByteArray::number(indexes.first().row()));
    return mime;
}

bool LayerStackModel::canDropMimeData(const QMimeData* data, Qt::DropAction, int, int,
                                      const QModelIndex&) const {
    return data && (data->hasFormat(kLayerRowsMime) || data->hasFormat(kLayerTypeMime));
}

bool LayerStackModel::dropMimeData(const QMimeData* data, Qt::DropAction, int row, int,
                                   const QModelIndex& parent) {
    if (!data) return false;
    if (row < 0) row = parent.isValid() ? parent.row() : layerCount();
    if (data->hasFormat(kLayerTypeMime)) {
        bool ok = false;
        int t = data->data(kLayerTypeMime).toInt(&ok);
        if (!ok) return false;
        insertLayer(row, static_cast<td::LayerType>(t));
        return true;
    }
    if (data->hasFormat(kLayerRowsMime)) {
        bool ok = false;
        int from = data->data(kLayerRowsMime).toInt(&ok);
        if (!ok) return false;
        int to = from < row ? row - 1 : row;
        moveLayer(from, std::clamp(to, 0, layerCount() - 1));
        return true;
    }
    return false;
}

}  // namespace td::ui
