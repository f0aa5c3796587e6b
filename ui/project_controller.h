// Owns the open project: its file path, its edits and whether they are saved. Panels edit through
// edit() and reload their widgets on projectReplaced(); nothing else holds a second copy.
#pragma once

#include <QElapsedTimer>
#include <QObject>
#include <QString>
#include <functional>
#include <string>
#include <vector>

#include "engine/api/projects.h"

namespace td::ui {

class ProjectController : public QObject {
    Q_OBJECT
  public:
    explicit ProjectController(QObject* parent = nullptr);

    const td::Project& project() const { return project_; }
    QString path() const { return path_; }  // empty for a new or example project
    bool isDirty() const { return dirty_; }
    QString displayName() const;

    // Applies an edit; `source` is the panel that made it (it does not need to reload). An edit
    // that changes the project can be undone; edits from one source less than kMergeMs apart
    // (the keystrokes of one value) are one step.
    void edit(const std::function<void(td::Project&)>& change, QObject* source = nullptr);

    // Undo and redo of edits (not of opening or replacing a project, which starts afresh). The
    // panels reload on projectReplaced.
    bool canUndo() const { return !undo_.empty(); }
    bool canRedo() const { return !redo_.empty(); }
    void undo();
    void redo();
    static constexpr int kMergeMs = 500;
    static constexpr size_t kMaxUndo = 200;

    void newProject();
    // Loads a file. Errors are the engine's message naming the file and field.
    bool open(const QString& path, QString* error);
    // Loads a project from JSON text (an example or the embedded default); it has no path, so the
    // next save asks for one.
    bool openFromText(const QString& jsonText, const QString& name, QString* error);
    // A project made elsewhere (an imported Keras model) replaces the current one, unsaved.
    void adoptUnsaved(td::Project p);
    bool save(QString* error);  // requires path()
    bool saveAs(const QString& path, QString* error);

    // The embedded default example (resource :/projects/fashion_mnist_mlp.json).
    static QString defaultProjectText();

  signals:
    void projectReplaced();
    void projectEdited(QObject* source);
    void dirtyChanged(bool dirty);
    void pathChanged(const QString& path);
    void undoStateChanged();

  private:
    void replace(td::Project p, const QString& path, bool dirty);
    void updateDirty();

    td::Project project_;
    QString path_;
    std::string savedJson_;  // projectText of the last saved/loaded state
    bool dirty_ = false;
    std::vector<td::Project> undo_, redo_;  // the states before each step, oldest first
    QObject* lastSource_ = nullptr;
    QElapsedTimer lastEdit_;
};

}  // namespace td::ui
