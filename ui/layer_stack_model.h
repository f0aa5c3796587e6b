// The designer's layer stack: a table model over a ModelSpec that validates itself after every
// change with the engine's shape inference, so each row shows its output shape and parameter
// count, and the first invalid layer is marked with the engine's message.
#pragma once

#include <QAbstractTableModel>
#include <QString>
#include <optional>
#include <string>

#include "engine/api/projects.h"

namespace td::ui {

// MIME types for drag and drop: rows inside the stack, and new layers from the palette.
inline constexpr const char* kLayerRowsMime = "application/x-traindeck-layer-rows";
inline constexpr const char* kLayerTypeMime = "application/x-traindeck-layer-type";

// Every layer type the engine supports, in palette order.
const std::vector<td::LayerType>& supportedLayerTypes();
QString layerTypeDescription(td::LayerType t);

class LayerStackModel : public QAbstractTableModel {
    Q_OBJECT
  public:
    enum Column { ColIndex, ColLayer, ColOutputShape, ColParams, ColCount };

    explicit LayerStackModel(QObject* parent = nullptr);

    void setSpec(const td::ModelSpec& spec);  // replaces everything (a project was opened)
    const td::ModelSpec& spec() const { return spec_; }
    int layerCount() const { return static_cast<int>(spec_.layers.size()); }
    const td::LayerSpec& layer(int row) const { return spec_.layers.at(row); }

    // Edits. Each one revalidates and emits specEdited().
    int insertLayer(int row, td::LayerType type);  // returns the new row
    void updateLayer(int row, const td::LayerSpec& spec);
    bool moveLayer(int from, int to);  // to = destination index after removal
    int duplicateLayer(int row);
    void removeLayer(int row);

    // A default layer of this type with a unique name.
    td::LayerSpec makeLayer(td::LayerType type) const;
    QString uniqueName(const QString& base, int ignoreRow = -1) const;
    bool nameTaken(const QString& name, int ignoreRow) const;

    // Validation state.
    bool valid() const { return !errorText_.has_value(); }
    QString errorText() const { return errorText_.value_or(QString()); }
    int errorRow() const { return errorRow_; }           // -1 when valid or when no row is to blame
    const td::ModelInfo& info() const { return info_; }  // meaningful when valid()
    QString summaryText() const;  // Keras summary + memory estimate, or the error

    // QAbstractTableModel
    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role) const override;
    QVariant headerData(int section, Qt::Orientation o, int role) const override;
    Qt::ItemFlags flags(const QModelIndex& index) const override;
    Qt::DropActions supportedDropActions() const override;
    Qt::DropActions supportedDragActions() const override;
    QStringList mimeTypes() const override;
    QMimeData* mimeData(const QModelIndexList& indexes) const override;
    bool canDropMimeData(const QMimeData* data, Qt::DropAction action, int row, int column,
                         const QModelIndex& parent) const override;
    bool dropMimeData(const QMimeData* data, Qt::DropAction action, int row, int column,
                      const QModelIndex& parent) override;

  signals:
    void specEdited();
    void validationChanged();

  private:
    void revalidate();
    void edited();

    td::ModelSpec spec_;
    td::ModelInfo info_;
    std::string summaryTable_;  // model.summary() of the valid model
    std::optional<QString> errorText_;
    int errorRow_ = -1;
    // Per spec row, from the last successful inference (of the whole model or its valid prefix).
    std::vector<std::optional<td::LayerInfo>> rowInfo_;
};

}  // namespace td::ui
