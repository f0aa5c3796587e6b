#include "ui/config_diff.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QJsonValue>
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

}  // namespace td::ui
