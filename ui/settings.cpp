#include "ui/settings.h"

#include <QSplitter>

#include <QDir>
#include <QFileInfo>
#include <QSettings>
#include <QStandardPaths>

namespace td::ui {

QString Settings::defaultDatabasePath() {
    QString dir = QStandardPaths::writableLocation(QStandardPaths::AppDataLocation);
    if (dir.isEmpty()) dir = QDir::homePath() + "/.local/share/traindeck";
    QDir().mkpath(dir);
    return dir + "/runs.db";
}

QString Settings::databasePath() {
    QString p = QSettings().value("store/databasePath").toString();
    return p.isEmpty() ? defaultDatabasePath() : p;
}

void Settings::setDatabasePath(const QString& path) {
    QSettings().setValue("store/databasePath", path);
}

QString Settings::lastProject() {
    return QSettings().value("project/last").toString();
}

void Settings::setLastProject(const QString& path) {
    QSettings().setValue("project/last", path);
}

QStringList Settings::recentFiles() {
    return QSettings().value("project/recent").toStringList();
}

void Settings::addRecentFile(const QString& path) {
    QString abs = QFileInfo(path).absoluteFilePath();
    QStringList list = recentFiles();
    list.removeAll(abs);
    list.prepend(abs);
    while (list.size() > kMaxRecentFiles) list.removeLast();
    QSettings().setValue("project/recent", list);
}

void Settings::clearRecentFiles() {
    QSettings().remove("project/recent");
}

QByteArray Settings::windowGeometry() {
    return QSettings().value("window/geometry").toByteArray();
}

QByteArray Settings::windowState() {
    return QSettings().value("window/state").toByteArray();
}

void Settings::setWindowLayout(const QByteArray& geometry, const QByteArray& state) {
    QSettings s;
    s.setValue("window/geometry", geometry);
    s.setValue("window/state", state);
}

int Settings::currentTab() {
    return QSettings().value("window/tab", 0).toInt();
}

void Settings::setCurrentTab(int index) {
    QSettings().setValue("window/tab", index);
}

QStringList Settings::lastServer() {
    return QSettings().value("servers/last").toStringList();
}

void Settings::setLastServer(const QStringList& fields) {
    QSettings().setValue("servers/last", fields);
}

QStringList Settings::runsColumns() {
    return QSettings().value("runs/columns").toStringList();
}

void Settings::setRunsColumns(const QStringList& shown) {
    QSettings().setValue("runs/columns", shown);
}

QByteArray Settings::splitterState(const QString& name) {
    return QSettings().value("splitters/" + name).toByteArray();
}

void Settings::setSplitterState(const QString& name, const QByteArray& state) {
    QSettings().setValue("splitters/" + name, state);
}

void rememberSplitter(QSplitter* splitter, const QString& name, const QList<int>& initial) {
    splitter->setObjectName(name + "Splitter");
    const QByteArray saved = Settings::splitterState(name);
    if (saved.isEmpty() || !splitter->restoreState(saved)) {
        if (!initial.isEmpty()) splitter->setSizes(initial);
    }
    QObject::connect(splitter, &QSplitter::splitterMoved, splitter,
                     [splitter, name] { Settings::setSplitterState(name, splitter->saveState()); });
}

}  // namespace td::ui
