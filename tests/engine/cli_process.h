// The traindeck binary run as a user runs it, for the CLI suites: exit code, stdout and stderr.
#pragma once

#include <QProcess>
#include <QProcessEnvironment>
#include <QString>
#include <QStringList>

#include "tests/source_dir.h"

namespace td::test {

struct Run {
    int code = -1;  // -1: killed by a signal, or still running after the time limit (a hang)
    QString out, err;
};

// extraEnv: NAME=value entries added to the environment; workDir: the working folder (empty: the
// test's). A run still going after timeoutMs is killed and reported as exit code -1.
inline Run traindeck(const QStringList& args, const QString& home = QString(),
                     const QStringList& extraEnv = {}, int timeoutMs = 300000,
                     const QString& workDir = QString()) {
    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    if (!home.isEmpty()) env.insert("HOME", home);
    env.insert("OMP_NUM_THREADS", "1");
    for (const QString& kv : extraEnv) env.insert(kv.section('=', 0, 0), kv.section('=', 1));
    p.setProcessEnvironment(env);
    if (!workDir.isEmpty()) p.setWorkingDirectory(workDir);
    p.start(td::dev::kBinary, args);
    if (!p.waitForFinished(timeoutMs)) {
        p.kill();
        p.waitForFinished();
        return {-1, QString::fromUtf8(p.readAllStandardOutput()),
                QString::fromUtf8(p.readAllStandardError())};
    }
    return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1,
            QString::fromUtf8(p.readAllStandardOutput()),
            QString::fromUtf8(p.readAllStandardError())};
}

// A started `traindeck train`, read as it goes.
struct LiveRun {
    QProcess p;
    QString out;
    explicit LiveRun(const QStringList& args) {
        QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
        env.insert("OMP_NUM_THREADS", "1");
        p.setProcessEnvironment(env);
        p.start(td::dev::kBinary, args);
    }
    // Until stdout contains `text` (false: the run ended first, or 60 s passed).
    bool waitFor(const QString& text) {
        for (int i = 0; i < 600 && !out.contains(text); ++i) {
            p.waitForReadyRead(100);
            out += QString::fromUtf8(p.readAllStandardOutput());
            if (p.state() == QProcess::NotRunning) break;
        }
        return out.contains(text) && p.state() == QProcess::Running;
    }
};

inline QString project(const char* name) {
    return QString(td::dev::kSourceDir) + "/projects/" + name;
}

}  // namespace td::test
