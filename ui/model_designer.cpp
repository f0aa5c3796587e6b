#include "ui/model_designer.h"

#include "engine/api/projects.h"

#include <QAction>
#include <QFontDatabase>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QKeyEvent>
#include <QLabel>
#include <QListWidget>
#include <QMimeData>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QScrollArea>
#include <QSplitter>
#include <QTableView>
#include <QToolButton>
#include <QVBoxLayout>

#include "ui/layer_property_editor.h"
#include "ui/layer_stack_model.h"
#include "ui/project_controller.h"
#include "ui/settings.h"

namespace td::ui {

namespace {

// Palette items drag out as "new layer of this type".
class PaletteList : public QListWidget {
  public:
    using QListWidget::QListWidget;

  protected:
    QStringList mimeTypes() const override { return {kLayerTypeMime}; }
    QMimeData* mimeData(const QList<QListWidgetItem*>& items) const override {
        if (items.isEmpty()) return nullptr;
        auto* mime = new QMimeData;
        mime->setData(kLayerTypeMime,
                      QByteArray::number(items.first()->data(Qt::UserRole).toInt()));
        return mime;
    }
};

QToolButton* toolButton(QAction* a) {
    auto* b = new QToolButton;
    b->setDefaultAction(a);
    b->setToolButtonStyle(Qt::ToolButtonTextOnly);
    return b;
}

}  // namespace

ModelDesigner::ModelDesigner(ProjectController* project, QWidget* parent)
    : QWidget(parent), project_(project), model_(new LayerStackModel(this)) {
    // Palette
    palette_ = new PaletteList;
    palette_->setObjectName("layerPalette");
    palette_->setDragEnabled(true);
    palette_->setDragDropMode(QAbstractItemView::DragOnly);
    for (td::LayerType t : supportedLayerTypes()) {
        auto* item = new QListWidgetItem(td::layerTypeName(t));
        item->setData(Qt::UserRole, static_cast<int>(t));
        item->setToolTip(layerTypeDescription(t) +
                         tr("\nDouble-click or drag onto the stack to add."));
        palette_->addItem(item);
    }
    palette_->setCurrentRow(0);
    connect(palette_, &QListWidget::itemDoubleClicked, this, [this] { addSelectedPaletteLayer(); });
    auto* addButton = new QPushButton(tr("Add ▸"));
    addButton->setObjectName("addLayerButton");
    addButton->setToolTip(tr("Add the chosen layer type after the selected layer."));
    connect(addButton, &QPushButton::clicked, this, [this] { addSelectedPaletteLayer(); });
    auto* paletteBox = new QGroupBox(tr("Layers"));
    auto* pl = new QVBoxLayout(paletteBox);
    pl->addWidget(palette_);
    pl->addWidget(addButton);

    // Stack
    stack_ = new QTableView;
    stack_->setObjectName("layerStack");
    stack_->setModel(model_);
    stack_->setSelectionBehavior(QAbstractItemView::SelectRows);
    stack_->setSelectionMode(QAbstractItemView::SingleSelection);
    stack_->setDragEnabled(true);
    stack_->setAcceptDrops(true);
    stack_->setDropIndicatorShown(true);
    stack_->setDragDropMode(QAbstractItemView::DragDrop);
    stack_->setDefaultDropAction(Qt::CopyAction);
    stack_->setDragDropOverwriteMode(false);
    stack_->verticalHeader()->hide();
    stack_->horizontalHeader()->setSectionResizeMode(LayerStackModel::ColOutputShape,
                                                     QHeaderView::Stretch);
    stack_->horizontalHeader()->setSectionResizeMode(LayerStackModel::ColLayer,
                                                     QHeaderView::ResizeToContents);
    stack_->setWordWrap(false);

    auto makeAction = [this](const QString& text, const QKeySequence& key, const QString& tip,
                             auto slot) {
        auto* a = new QAction(text, this);
        a->setShortcut(key);
        a->setShortcutContext(Qt::WidgetWithChildrenShortcut);
        a->setToolTip(QString("%1 (%2)").arg(tip, key.toString(QKeySequence::NativeText)));
        connect(a, &QAction::triggered, this, slot);
        stack_->addAction(a);
        return a;
    };
    upAction_ = makeAction(tr("Up"), QKeySequence(Qt::CTRL | Qt::Key_Up), tr("Move layer up"),
                           [this] { moveSelected(-1); });
    downAction_ = makeAction(tr("Down"), QKeySequence(Qt::CTRL | Qt::Key_Down),
                             tr("Move layer down"), [this] { moveSelected(1); });
    duplicateAction_ = makeAction(tr("Duplicate"), QKeySequence(Qt::CTRL | Qt::Key_D),
                                  tr("Duplicate layer"), [this] { duplicateSelected(); });
    deleteAction_ = makeAction(tr("Delete"), QKeySequence(Qt::Key_Delete), tr("Delete layer"),
                               [this] { deleteSelected(); });
    stack_->setContextMenuPolicy(Qt::ActionsContextMenu);
    // The keys also work without an active window (shortcuts need one); see eventFilter().
    stack_->installEventFilter(this);

    auto* stackButtons = new QHBoxLayout;
    for (QAction* a : {upAction_, downAction_, duplicateAction_, deleteAction_}) {
        stackButtons->addWidget(toolButton(a));
    }
    stackButtons->addStretch(1);
    auto* stackBox = new QGroupBox(tr("Model (drag to reorder; Ctrl+Up/Down, Ctrl+D, Del)"));
    auto* sl = new QVBoxLayout(stackBox);
    sl->addWidget(stack_);
    sl->addLayout(stackButtons);
    status_ = new QLabel;
    status_->setObjectName("modelStatus");
    status_->setWordWrap(true);
    sl->addWidget(status_);

    // Properties
    editor_ = new LayerPropertyEditor(
        [this](const QString& name) { return model_->nameTaken(name, currentRow()); });
    auto* editorScroll = new QScrollArea;
    editorScroll->setWidgetResizable(true);
    editorScroll->setWidget(editor_);
    auto* propBox = new QGroupBox(tr("Properties"));
    auto* ppl = new QVBoxLayout(propBox);
    ppl->addWidget(editorScroll);

    // Summary
    summary_ = new QPlainTextEdit;
    summary_->setObjectName("modelSummary");
    summary_->setReadOnly(true);
    summary_->setLineWrapMode(QPlainTextEdit::NoWrap);
    summary_->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
    auto* summaryBox = new QGroupBox(tr("Summary"));
    auto* sml = new QVBoxLayout(summaryBox);
    sml->addWidget(summary_);

    // The compiler's view of the training step: fusions, kernels and bytes per step
    // (api::compileReport), beside the summary.
    report_ = new QPlainTextEdit;
    report_->setObjectName("compileReport");
    report_->setReadOnly(true);
    report_->setLineWrapMode(QPlainTextEdit::NoWrap);
    report_->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
    auto* reportBox = new QGroupBox(tr("Compiler (fusion report)"));
    auto* rl = new QVBoxLayout(reportBox);
    rl->addWidget(report_);

    auto* right = new QSplitter(Qt::Vertical);
    right->addWidget(propBox);
    right->addWidget(summaryBox);
    right->addWidget(reportBox);
    auto* split = new QSplitter(Qt::Horizontal);
    split->addWidget(paletteBox);
    split->addWidget(stackBox);
    split->addWidget(right);
    split->setStretchFactor(0, 0);
    split->setStretchFactor(1, 3);
    split->setStretchFactor(2, 2);
    // At the default window size the properties get most of the right column; the summary and
    // the report scroll. Positions the user drags are kept across sessions.
    rememberSplitter(right, "modelRight", {420, 220, 180});
    rememberSplitter(split, "modelColumns", {170, 560, 640});
    // A run trains a snapshot of the project: edits here apply to the next run.
    runNote_ =
        new QLabel(tr("A run is in progress: it trains the project as it was when it "
                      "started. Edits here apply to the next run."));
    runNote_->setObjectName("runSnapshotNote");
    runNote_->setWordWrap(true);
    runNote_->setStyleSheet("background: #fff6d5; padding: 4px;");
    runNote_->hide();
    auto* layout = new QVBoxLayout(this);
    runNote_->setSizePolicy(QSizePolicy::Preferred, QSizePolicy::Maximum);
    layout->addWidget(runNote_, 0);
    layout->addWidget(split, 1);

    connect(model_, &LayerStackModel::specEdited, this, &ModelDesigner::onSpecEdited);
    connect(model_, &LayerStackModel::validationChanged, this, &ModelDesigner::refreshSummary);
    connect(stack_->selectionModel(), &QItemSelectionModel::selectionChanged, this,
            &ModelDesigner::onSelectionChanged);
    connect(editor_, &LayerPropertyEditor::layerEdited, this,
            [this](const td::LayerSpec& spec) { model_->updateLayer(currentRow(), spec); });
    connect(project_, &ProjectController::projectReplaced, this, &ModelDesigner::reloadFromProject);
    connect(project_, &ProjectController::projectReplaced, this, &ModelDesigner::refreshReport);
    connect(project_, &ProjectController::projectEdited, this, &ModelDesigner::refreshReport);
    reloadFromProject();
    refreshReport();
}

void ModelDesigner::setRunInProgress(bool running) {
    runNote_->setVisible(running);
}

void ModelDesigner::refreshReport() {
    auto r = td::api::compileReport(project_->project());
    report_->setPlainText(
        r.ok()
            ? QString::fromStdString(r->text)
            : tr("The training step does not compile: %1").arg(QString::fromStdString(r.error())));
}

bool ModelDesigner::eventFilter(QObject* watched, QEvent* event) {
    if (watched == stack_ && event->type() == QEvent::KeyPress) {
        auto* key = static_cast<QKeyEvent*>(event);
        const bool ctrl = key->modifiers() & Qt::ControlModifier;
        QAction* act = nullptr;
        if (key->key() == Qt::Key_Delete && !ctrl) act = deleteAction_;
        if (ctrl && key->key() == Qt::Key_Up) act = upAction_;
        if (ctrl && key->key() == Qt::Key_Down) act = downAction_;
        if (ctrl && key->key() == Qt::Key_D) act = duplicateAction_;
        if (act) {
            if (act->isEnabled()) act->trigger();
            return true;
        }
    }
    return QWidget::eventFilter(watched, event);
}

int ModelDesigner::currentRow() const {
    auto rows = stack_->selectionModel()->selectedRows();
    return rows.isEmpty() ? -1 : rows.first().row();
}

void ModelDesigner::selectRow(int row) {
    if (row < 0 || row >= model_->layerCount()) {
        stack_->clearSelection();
        return;
    }
    stack_->selectionModel()->setCurrentIndex(
        model_->index(row, 0), QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
    stack_->scrollTo(model_->index(row, 0));
}

void ModelDesigner::addSelectedPaletteLayer() {
    QListWidgetItem* item = palette_->currentItem();
    if (!item) return;
    int row = currentRow() < 0 ? model_->layerCount() : currentRow() + 1;
    selectRow(
        model_->insertLayer(row, static_cast<td::LayerType>(item->data(Qt::UserRole).toInt())));
}

void ModelDesigner::moveSelected(int delta) {
    int row = currentRow();
    if (row < 0) return;
    if (model_->moveLayer(row, row + delta)) selectRow(row + delta);
    updateActions();
}

void ModelDesigner::duplicateSelected() {
    selectRow(model_->duplicateLayer(currentRow()));
}

void ModelDesigner::deleteSelected() {
    int row = currentRow();
    if (row < 0) return;
    model_->removeLayer(row);
    selectRow(std::min(row, model_->layerCount() - 1));
}

void ModelDesigner::reloadFromProject() {
    model_->setSpec(project_->project().model);
    selectRow(model_->layerCount() > 0 ? 0 : -1);
    onSelectionChanged();
}

void ModelDesigner::onSpecEdited() {
    td::ModelSpec spec = model_->spec();
    project_->edit([&](td::Project& p) { p.model = std::move(spec); }, this);
    // Row moves and inserts change which layer is selected: keep the editor in step.
    int row = currentRow();
    if (row >= 0 && model_->layer(row).name != editor_->layer().name) onSelectionChanged();
    updateActions();
}

void ModelDesigner::onSelectionChanged() {
    int row = currentRow();
    if (row < 0) {
        editor_->clear();
    } else {
        editor_->setLayer(model_->layer(row));
    }
    updateActions();
}

void ModelDesigner::updateActions() {
    const int row = currentRow();
    const int n = model_->layerCount();
    upAction_->setEnabled(row > 0);
    downAction_->setEnabled(row >= 0 && row + 1 < n);
    duplicateAction_->setEnabled(row >= 0);
    deleteAction_->setEnabled(row >= 0);
}

void ModelDesigner::refreshSummary() {
    summary_->setPlainText(model_->summaryText());
    if (model_->valid()) {
        status_->setStyleSheet({});
        status_->setText(
            tr("%1 layers, %2 parameters. Output shape %3.")
                .arg(model_->layerCount())
                .arg(model_->info().totalParams)
                .arg(QString::fromStdString(td::shapeToString(model_->info().outputShape))));
    } else {
        status_->setStyleSheet("color: #b00020;");
        status_->setText(tr("⚠ %1").arg(model_->errorText()));
    }
}

}  // namespace td::ui
