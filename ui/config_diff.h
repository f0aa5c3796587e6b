// Side-by-side comparison of two runs' configurations: both JSON documents are flattened to
// "path = value" rows ("training.optimizer.config.learning_rate") and paired by path.
#pragma once

#include <QString>
#include <vector>

#include "engine/core/run_records.h"

class QWidget;

namespace td::ui {

struct ConfigDiffRow {
    QString path;
    QString left;  // empty when the path is missing on that side
    QString right;
    bool differs = false;
};

// Rows for every path in either document, sorted by path. Invalid JSON becomes one row that says
// so.
std::vector<ConfigDiffRow> diffJsonConfigs(const QString& leftJson, const QString& rightJson);

// The Compare dialog of two runs' project and effective settings (documents in `a` and `b`), each
// side under its label ("#3 name", "gpu-box: #3 name"); modal.
void showRunComparison(QWidget* parent, const td::RunRecord& a, const QString& aLabel,
                       const td::RunRecord& b, const QString& bLabel);

}  // namespace td::ui
