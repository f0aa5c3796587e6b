// Persistent user settings (QSettings): window layout, last project, database path, recent files.
// One place names the keys so panels never spell them.
#pragma once

#include <QByteArray>
#include <QList>
#include <QString>
#include <QStringList>

class QSplitter;

namespace td::ui {

// Restores `splitter`'s sizes saved under `name` (else leaves the given `initial` sizes, when any)
// and saves them whenever the user moves a handle.
void rememberSplitter(QSplitter* splitter, const QString& name, const QList<int>& initial = {});

class Settings {
  public:
    static constexpr int kMaxRecentFiles = 8;

    static QString databasePath();  // stored path, or the default under AppDataLocation
    static void setDatabasePath(const QString& path);
    static QString defaultDatabasePath();  // AppDataLocation/runs.db (creates the folder)

    static QString lastProject();
    static void setLastProject(const QString& path);

    static QStringList recentFiles();
    static void addRecentFile(const QString& path);
    static void clearRecentFiles();

    static QByteArray windowGeometry();
    static QByteArray windowState();
    static void setWindowLayout(const QByteArray& geometry, const QByteArray& state);
    static int currentTab();
    static void setCurrentTab(int index);
    // The Runs table's columns the user chose, by header name; empty list: never chosen.
    // The server File > Connect to Server last connected to (host, port, store, traindeck); the
    // dialog starts with it. Nothing else of the connection is kept (no keys, no passwords).
    static QStringList lastServer();
    static void setLastServer(const QStringList& fields);

    static QStringList runsColumns();
    static void setRunsColumns(const QStringList& shown);
    // Splitter positions by name ("model", "monitor", ...); empty: never set.
    static QByteArray splitterState(const QString& name);
    static void setSplitterState(const QString& name, const QByteArray& state);
};

}  // namespace td::ui
