// Whether a project can start on this machine, and if not, the first reason a user can act on.
// Pure functions over the engine's structs, shared by the Start action and the panels.
#pragma once

#include <QString>

#include "engine/api/projects.h"

namespace td::ui {

QString modelProblem(const td::ModelSpec& model);    // empty when the model is valid
QString dataProblem(const td::DataConfig& data);     // missing or unreadable files
QString runtimeProblem(const td::Project& project);  // precision / strategy not available here
// Any field the project file rules refuse, or a run too large for this host (field path first).
QString projectProblem(const td::Project& project);
QString startBlocker(const td::Project& project);  // the first of the above, or empty

// Folder of the built-in Fashion-MNIST files (Debian package dataset-fashion-mnist), as the
// engine reads it.
QString fashionMnistDir();

}  // namespace td::ui
