// Whether a project can start on this machine, and if not, the first reason a user can act on.
// Pure functions over the engine's structs, shared by the Start action and the panels.
#pragma once

#include <QString>

#include "engine/io/project.h"

namespace td::ui {

QString modelProblem(const td::ModelSpec& model);    // empty when the model is valid
QString dataProblem(const td::DataConfig& data);     // missing or unreadable files
QString runtimeProblem(const td::Project& project);  // precision / strategy not available here
QString startBlocker(const td::Project& project);    // the first of the above, or empty

// Folder of the built-in Fashion-MNIST files (Debian package dataset-fashion-mnist).
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

}  // namespace td::ui
