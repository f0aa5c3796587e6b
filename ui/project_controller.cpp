#include "ui/project_controller.h"

#include <QFile>
#include <QFileInfo>

namespace td::ui {

ProjectController::ProjectController(QObject* parent) : QObject(parent) {}

QString ProjectController::displayName() const {
    if (!path_.isEmpty()) return QFileInfo(path_).fileName();
    return QString::fromStdString(project_.name);
}

void ProjectController::edit(const std::function<void(td::Project&)>& change, QObject* source) {
    td::Project before = project_;
    const std::string beforeText = td::api::projectText(project_);
    change(project_);
    if (td::api::projectText(project_) != beforeText) {
        const bool merge = !undo_.empty() && source && source == lastSource_ &&
                           lastEdit_.isValid() && lastEdit_.elapsed() < kMergeMs;
        if (!merge) {
            undo_.push_back(std::move(before));
            if (undo_.size() > kMaxUndo) undo_.erase(undo_.begin());
        }
        redo_.clear();
        lastSource_ = source;
        lastEdit_.start();
        emit undoStateChanged();
    }
    emit projectEdited(source);
    updateDirty();
}

void ProjectController::undo() {
    if (undo_.empty()) return;
    redo_.push_back(std::move(project_));
    project_ = std::move(undo_.back());
    undo_.pop_back();
    lastSource_ = nullptr;
    emit projectReplaced();
    emit undoStateChanged();
    updateDirty();
}

void ProjectController::redo() {
    if (redo_.empty()) return;
    undo_.push_back(std::move(project_));
    project_ = std::move(redo_.back());
    redo_.pop_back();
    lastSource_ = nullptr;
    emit projectReplaced();
    emit undoStateChanged();
    updateDirty();
}

void ProjectController::newProject() {
    td::Project p;
    p.name = "untitled";
    td::LayerSpec input;
    input.type = td::LayerType::Input;
    input.name = "input";
    input.inputShape = {28, 28};
    td::LayerSpec flatten;
    flatten.type = td::LayerType::Flatten;
    flatten.name = "flatten";
    td::LayerSpec dense;
    dense.type = td::LayerType::Dense;
    dense.name = "dense";
    dense.units = 10;
    dense.activation = td::ActivationKind::Softmax;
    p.model.layers = {input, flatten, dense};
    p.data.pipeline.map = {td::MapStep{.op = "scale", .factor = 1.0 / 255.0}};
    replace(std::move(p), QString(), false);
}

bool ProjectController::open(const QString& path, QString* error) {
    auto loaded = td::api::loadProjectFile(path.toStdString());
    if (!loaded) {
        if (error) *error = QString::fromStdString(loaded.error());
        return false;
    }
    replace(std::move(loaded).value(), QFileInfo(path).absoluteFilePath(), false);
    return true;
}

bool ProjectController::openFromText(const QString& jsonText, const QString& name, QString* error) {
    auto parsed = td::api::parseProjectText(jsonText.toStdString(), name.toStdString());
    if (!parsed) {
        if (error) *error = QString::fromStdString(parsed.error());
        return false;
    }
    replace(std::move(parsed).value(), QString(), false);
    return true;
}

void ProjectController::adoptUnsaved(td::Project p) {
    replace(std::move(p), QString(), true);
}

bool ProjectController::save(QString* error) {
    if (path_.isEmpty()) {
        if (error) *error = tr("The project has no file yet; use Save As.");
        return false;
    }
    return saveAs(path_, error);
}

bool ProjectController::saveAs(const QString& path, QString* error) {
    td::Status st = td::api::saveProjectFile(project_, path.toStdString());
    if (!st) {
        if (error) *error = QString::fromStdString(st.error());
        return false;
    }
    QString abs = QFileInfo(path).absoluteFilePath();
    if (abs != path_) {
        path_ = abs;
        emit pathChanged(path_);
    }
    savedJson_ = td::api::projectText(project_);
    updateDirty();
    return true;
}

QString ProjectController::defaultProjectText() {
    QFile f(":/projects/fashion_mnist_mlp.json");
    if (!f.open(QIODevice::ReadOnly)) return {};
    return QString::fromUtf8(f.readAll());
}

void ProjectController::replace(td::Project p, const QString& path, bool dirty) {
    project_ = std::move(p);
    undo_.clear();
    redo_.clear();
    lastSource_ = nullptr;
    emit undoStateChanged();
    savedJson_ = dirty ? std::string() : td::api::projectText(project_);
    bool pathChangedNow = path != path_;
    path_ = path;
    emit projectReplaced();
    if (pathChangedNow) emit pathChanged(path_);
    updateDirty();
}

void ProjectController::updateDirty() {
    bool d = td::api::projectText(project_) != savedJson_;
    if (d != dirty_) {
        dirty_ = d;
        emit dirtyChanged(dirty_);
    }
}

}  // namespace td::ui
