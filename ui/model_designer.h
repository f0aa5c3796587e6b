// Model designer panel: palette of layer types, the reorderable layer stack, a property editor for
// the selected layer and the live Keras-style summary. Edits go to the ProjectController.
#pragma once

#include <QWidget>

class QAction;
class QLabel;
class QListWidget;
class QPlainTextEdit;
class QTableView;

namespace td::ui {

class LayerPropertyEditor;
class LayerStackModel;
class ProjectController;

class ModelDesigner : public QWidget {
    Q_OBJECT
  public:
    explicit ModelDesigner(ProjectController* project, QWidget* parent = nullptr);

    LayerStackModel* stackModel() const { return model_; }
    QTableView* stackView() const { return stack_; }
    QListWidget* palette() const { return palette_; }
    LayerPropertyEditor* propertyEditor() const { return editor_; }
    QPlainTextEdit* summaryView() const { return summary_; }
    QPlainTextEdit* reportView() const { return report_; }

    int currentRow() const;
    void selectRow(int row);
    // Adds a layer of the palette's current type after the selected layer (or at the end).
    void addSelectedPaletteLayer();
    void moveSelected(int delta);
    void duplicateSelected();
    void deleteSelected();
    // While a run is in progress, a note above the designer says that the run trains a snapshot.
    void setRunInProgress(bool running);

  protected:
    bool eventFilter(QObject* watched, QEvent* event) override;

  private:
    void reloadFromProject();
    void onSpecEdited();
    void onSelectionChanged();
    void refreshSummary();
    void refreshReport();
    void updateActions();

    ProjectController* project_;
    LayerStackModel* model_;
    QListWidget* palette_;
    QTableView* stack_;
    LayerPropertyEditor* editor_;
    QPlainTextEdit* summary_;
    QPlainTextEdit* report_;
    QLabel* status_;
    QLabel* runNote_;
    QAction* upAction_;
    QAction* downAction_;
    QAction* duplicateAction_;
    QAction* deleteAction_;
};

}  // namespace td::ui
