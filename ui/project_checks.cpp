#include "ui/project_checks.h"

#include <QDir>
#include <QFileInfo>
#include <QObject>

#include "engine/api/data_preview.h"
#include "engine/api/session.h"

namespace td::ui {

namespace {

QString fileProblem(const std::string& path, const QString& what, bool required) {
    if (path.empty()) return required ? QObject::tr("%1: no file chosen").arg(what) : QString();
    QFileInfo fi(QString::fromStdString(path));
    if (!fi.isFile()) return QObject::tr("%1: file not found: %2").arg(what, fi.filePath());
    if (!fi.isReadable()) return QObject::tr("%1: not readable: %2").arg(what, fi.filePath());
    return {};
}

}  // namespace

QString modelProblem(const td::ModelSpec& model) {
    auto r = td::api::summarizeModel(model);
    return r ? QString() : QObject::tr("model: %1").arg(QString::fromStdString(r.error()));
}

QString dataProblem(const td::DataConfig& data) {
    const td::SourceConfig& s = data.source;
    QStringList problems;
    if (s.type == "fashion_mnist") {
        const QString dir = fashionMnistDir();
        if (!QDir(dir).exists()) {
            problems << QObject::tr(
                            "Fashion-MNIST is not installed in %1 (install the Debian "
                            "package dataset-fashion-mnist)")
                            .arg(dir);
        }
    } else if (s.type == "idx" || s.type == "npy") {
        const QString kind = s.type == "idx" ? "IDX" : "NPY";
        problems << fileProblem(s.trainImages, QObject::tr("%1 training samples").arg(kind), true)
                 << fileProblem(s.trainLabels, QObject::tr("%1 training labels").arg(kind), true)
                 << fileProblem(s.testImages, QObject::tr("%1 test samples").arg(kind), false)
                 << fileProblem(s.testLabels, QObject::tr("%1 test labels").arg(kind), false);
    } else if (s.type == "csv") {
        problems << fileProblem(s.trainPath, QObject::tr("CSV training file"), true)
                 << fileProblem(s.testPath, QObject::tr("CSV test file"), false);
    } else if (s.type == "tfrecord") {
        if (s.records.files.empty()) problems << QObject::tr("choose the TFRecord shards");
        if (s.records.xFeature.empty() || s.records.yFeature.empty())
            problems << QObject::tr("name the sample and label features of the TFRecord shards");
        if (s.records.xDecode != "image" && s.records.xShape.empty())
            problems << QObject::tr("give the shape of the TFRecord samples");
    } else if (s.type == "image_directory") {
        auto folder = [&](const std::string& path, const QString& what, bool required) {
            if (path.empty()) return required ? QObject::tr("choose the %1").arg(what) : QString();
            return QFileInfo(QString::fromStdString(path)).isDir()
                       ? QString()
                       : QObject::tr("the %1 %2 is not a folder")
                             .arg(what, QString::fromStdString(path));
        };
        problems << folder(s.images.directory, QObject::tr("image folder"), true)
                 << folder(s.images.testDirectory, QObject::tr("test image folder"), false);
        if (s.images.validationSplit > 0 && s.images.shuffle && !s.images.seed)
            problems << QObject::tr("an image folder's validation files need a seed");
    } else if (s.type != "synthetic") {
        problems << QObject::tr("unknown data source \"%1\"").arg(QString::fromStdString(s.type));
    }
    problems.removeAll(QString());
    return problems.isEmpty() ? QString() : QObject::tr("data: %1").arg(problems.first());
}

QString runtimeProblem(const td::Project& project) {
    td::Capability p = td::precisionCapability(project.precision, project.strategy.devices);
    if (!p.available) {
        return QObject::tr("precision %1 is not available here: %2")
            .arg(td::precisionName(project.precision), QString::fromStdString(p.reason));
    }
    td::Capability s = td::strategyCapability(project.strategy.type);
    if (!s.available) {
        return QObject::tr("strategy %1 is not available here: %2")
            .arg(QString::fromStdString(project.strategy.type), QString::fromStdString(s.reason));
    }
    if (project.strategy.type == "multi_worker_mirrored") {
        return QObject::tr(
            "MultiWorkerMirrored runs as several processes: launch it headless "
            "with the command shown on the Training tab");
    }
    return {};
}

QString projectProblem(const td::Project& project) {
    td::Status st = td::api::validateProject(project);
    return st.ok() ? QString() : QString::fromStdString(st.error());
}

QString startBlocker(const td::Project& project) {
    for (QString why :
         {modelProblem(project.model), dataProblem(project.data), runtimeProblem(project)}) {
        if (!why.isEmpty()) return why;
    }
    return projectProblem(project);
}

QString fashionMnistDir() {
    return QString::fromStdString(td::api::fashionMnistDirectory());
}

}  // namespace td::ui
