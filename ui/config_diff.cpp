#include "ui/config_diff.h"

#include <QCheckBox>
#include <QDialog>
#include <QDialogButtonBox>
#include <QHeaderView>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QJsonValue>
#include <QTableWidget>
#include <QVBoxLayout>
#include <map>

namespace td::ui {

namespace {

void flatten(const QJsonValue& v, const QString& path, std::map<QString, QString>& out) {
    if (v.isObject()) {
        const QJsonObject o = v.toObject();
        if (o.isEmpty()) out[path] = "{}";
        for (auto it = o.begin(); it != o.end(); ++it)
            flatten(it.value(), path.isEmpty() ? it.key() : path + "." + it.key(), out);
    } else if (v.isArray()) {
        const QJsonArray a = v.toArray();
        if (a.isEmpty()) out[path] = "[]";
        for (int i = 0; i < a.size(); ++i) flatten(a[i], QString("%1[%2]").arg(path).arg(i), out);
    } else if (v.isString()) {
        out[path] = '"' + v.toString() + '"';
    } else if (v.isBool()) {
        out[path] = v.toBool() ? "true" : "false";
    } else if (v.isDouble()) {
        out[path] = QString::number(v.toDouble(), 'g', 12);
    } else {
        out[path] = "null";
    }
}

std::map<QString, QString> flattenText(const QString& text) {
    std::map<QString, QString> out;
    if (text.trimmed().isEmpty()) return out;
    QJsonParseError error;
    QJsonDocument doc = QJsonDocument::fromJson(text.toUtf8(), &error);
    if (doc.isNull()) {
        out["(invalid JSON)"] = error.errorString();
        return out;
    }
    flatten(doc.isObject() ? QJsonValue(doc.object()) : QJsonValue(doc.array()), QString(), out);
    return out;
}

}  // namespace

std::vector<ConfigDiffRow> diffJsonConfigs(const QString& leftJson, const QString& rightJson) {
    auto a = flattenText(leftJson), b = flattenText(rightJson);
    std::map<QString, ConfigDiffRow> rows;
    for (const auto& [k, v] : a) rows[k].left = v;
    for (const auto& [k, v] : b) rows[k].right = v;
    std::vector<ConfigDiffRow> out;
    for (auto& [k, row] : rows) {
        row.path = k;
        row.differs = !a.count(k) || !b.count(k) || row.left != row.right;
        out.push_back(row);
    }
    return out;
}

// The Compare dialog (modal): one row per setting, the differing ones tinted, "only differences"
// on by default.
void showRunComparison(QWidget* parent, const td::RunRecord& a, const QString& aLabel,
                       const td::RunRecord& b, const QString& bLabel) {
    auto doc = [](const td::RunRecord& r) {
        auto orNull = [](const std::string& s) { return s.empty() ? std::string("null") : s; };
        return QString::fromStdString("{\"project\":" + orNull(r.projectJson) +
                                      ",\"effective\":" + orNull(r.configJson) + "}");
    };
    const auto rows = diffJsonConfigs(doc(a), doc(b));
    QDialog dialog(parent);
    dialog.setObjectName("compareRunsDialog");
    dialog.setWindowTitle(QObject::tr("Compare %1 and %2").arg(aLabel, bLabel));
    dialog.resize(1000, 640);
    auto* table = new QTableWidget(static_cast<int>(rows.size()), 3);
    table->setObjectName("compareTable");
    table->setHorizontalHeaderLabels({QObject::tr("Setting"), aLabel, bLabel});
    table->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
    table->verticalHeader()->hide();
    table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    int differing = 0;
    for (int i = 0; i < static_cast<int>(rows.size()); ++i) {
        const ConfigDiffRow& r = rows[static_cast<size_t>(i)];
        QString cells[] = {r.path, r.left.isEmpty() ? QObject::tr("(absent)") : r.left,
                           r.right.isEmpty() ? QObject::tr("(absent)") : r.right};
        for (int c = 0; c < 3; ++c) {
            auto* item = new QTableWidgetItem(cells[c]);
            if (r.differs) item->setBackground(QColor(255, 240, 200));
            table->setItem(i, c, item);
        }
        differing += r.differs;
    }
    auto* onlyDiff = new QCheckBox(
        QObject::tr("Only differences (%1 of %2 settings)").arg(differing).arg(rows.size()));
    QObject::connect(onlyDiff, &QCheckBox::toggled, table, [table, rows](bool on) {
        for (int i = 0; i < static_cast<int>(rows.size()); ++i)
            table->setRowHidden(i, on && !rows[static_cast<size_t>(i)].differs);
    });
    onlyDiff->setChecked(true);
    auto* box = new QDialogButtonBox(QDialogButtonBox::Close);
    QObject::connect(box, &QDialogButtonBox::rejected, &dialog, &QDialog::reject);
    auto* layout = new QVBoxLayout(&dialog);
    layout->addWidget(onlyDiff);
    layout->addWidget(table);
    layout->addWidget(box);
    dialog.exec();
}

}  // namespace td::ui
