#include "ui/runs_panel.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDialog>
#include <QDialogButtonBox>
#include <QFile>
#include <QFileDialog>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QInputDialog>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QPushButton>
#include <QRegularExpression>
#include <QSortFilterProxyModel>
#include <QSplitter>
#include <QTableView>
#include <QTableWidget>
#include <QTimer>
#include <QVBoxLayout>

#include "ui/chart_widget.h"
#include "ui/config_diff.h"
#include "ui/runs_table_model.h"

namespace td::ui {

namespace {

// Filters on any column's text plus an exact status.
class RunsFilterProxy : public QSortFilterProxyModel {
  public:
    using QSortFilterProxyModel::QSortFilterProxyModel;
    void setStatus(const QString& s) {
        status_ = s;
        invalidateFilter();
    }

  protected:
    bool filterAcceptsRow(int row, const QModelIndex& parent) const override {
        if (!status_.isEmpty()) {
            QString st =
                sourceModel()->index(row, RunsTableModel::ColStatus, parent).data().toString();
            if (st != status_) return false;
        }
        return QSortFilterProxyModel::filterAcceptsRow(row, parent);
    }

  private:
    QString status_;
};

std::optional<double> metricOf(const td::MetricMap& m, const std::string& key) {
    auto it = m.find(key);
    if (it == m.end()) return std::nullopt;
    return it->second;
}

}  // namespace

RunsPanel::RunsPanel(QWidget* parent) : QWidget(parent), model_(new RunsTableModel(this)) {
    auto* proxy = new RunsFilterProxy(this);
    proxy_ = proxy;
    proxy_->setSourceModel(model_);
    proxy_->setSortRole(RunsTableModel::kSortRole);
    proxy_->setFilterKeyColumn(-1);
    proxy_->setFilterCaseSensitivity(Qt::CaseInsensitive);

    dbLabel_ = new QLabel;
    dbLabel_->setObjectName("databaseLabel");
    dbLabel_->setTextInteractionFlags(Qt::TextSelectableByMouse);
    filter_ = new QLineEdit;
    filter_->setObjectName("runFilter");
    filter_->setPlaceholderText(tr("Filter runs (name, model, devices, notes…)"));
    filter_->setClearButtonEnabled(true);
    connect(filter_, &QLineEdit::textChanged, proxy_, &QSortFilterProxyModel::setFilterFixedString);
    statusFilter_ = new QComboBox;
    statusFilter_->addItem(tr("all statuses"), QString());
    for (const char* s : {"running", "completed", "stopped", "failed", "interrupted"})
        statusFilter_->addItem(s, s);
    connect(statusFilter_, &QComboBox::activated, this,
            [this, proxy] { proxy->setStatus(statusFilter_->currentData().toString()); });
    auto* top = new QHBoxLayout;
    top->addWidget(dbLabel_, 1);
    top->addWidget(filter_, 1);
    top->addWidget(statusFilter_);

    view_ = new QTableView;
    view_->setObjectName("runsTable");
    view_->setModel(proxy_);
    view_->setSortingEnabled(true);
    view_->sortByColumn(RunsTableModel::ColId, Qt::DescendingOrder);
    view_->setSelectionBehavior(QAbstractItemView::SelectRows);
    view_->setSelectionMode(QAbstractItemView::ExtendedSelection);
    view_->verticalHeader()->hide();
    view_->horizontalHeader()->setStretchLastSection(true);
    view_->setAlternatingRowColors(true);
    connect(view_->selectionModel(), &QItemSelectionModel::selectionChanged, this,
            &RunsPanel::onSelectionChanged);
    connect(view_, &QTableView::doubleClicked, this, [this] { notesSelected(); });

    rename_ = new QPushButton(tr("Rename…"));
    notes_ = new QPushButton(tr("Notes…"));
    delete_ = new QPushButton(tr("Delete…"));
    export_ = new QPushButton(tr("Export CSV…"));
    diff_ = new QPushButton(tr("Compare configs…"));
    diff_->setToolTip(tr("Select exactly two runs to compare their configurations."));
    connect(rename_, &QPushButton::clicked, this, &RunsPanel::renameSelected);
    connect(notes_, &QPushButton::clicked, this, &RunsPanel::notesSelected);
    connect(delete_, &QPushButton::clicked, this, &RunsPanel::deleteSelected);
    connect(export_, &QPushButton::clicked, this, &RunsPanel::exportSelected);
    connect(diff_, &QPushButton::clicked, this, &RunsPanel::diffSelected);
    auto* buttons = new QHBoxLayout;
    for (QPushButton* b : {rename_, notes_, delete_, export_, diff_}) buttons->addWidget(b);
    buttons->addStretch(1);
    buttons->addWidget(new QLabel(tr("Overlay metric:")));
    metric_ = new QComboBox;
    metric_->addItems({"loss", "accuracy", "val_loss", "val_accuracy"});
    connect(metric_, &QComboBox::activated, this, &RunsPanel::rebuildOverlays);
    buttons->addWidget(metric_);

    stepChart_ = new ChartWidget(tr("Selected runs per step"), tr("global step"), tr("value"));
    epochChart_ = new ChartWidget(tr("Selected runs per epoch"), tr("epoch"), tr("value"));
    auto* charts = new QWidget;
    auto* ch = new QHBoxLayout(charts);
    ch->setContentsMargins(0, 0, 0, 0);
    ch->addWidget(stepChart_);
    ch->addWidget(epochChart_);

    auto* tableHost = new QWidget;
    auto* tl = new QVBoxLayout(tableHost);
    tl->setContentsMargins(0, 0, 0, 0);
    tl->addLayout(top);
    tl->addWidget(view_, 1);
    tl->addLayout(buttons);
    auto* split = new QSplitter(Qt::Vertical);
    split->addWidget(tableHost);
    split->addWidget(charts);
    auto* layout = new QVBoxLayout(this);
    layout->addWidget(split);

    poll_ = new QTimer(this);
    poll_->setInterval(kPollIntervalMs);
    connect(poll_, &QTimer::timeout, this, &RunsPanel::refresh);
    poll_->start();
    updateButtons();
}

RunsPanel::~RunsPanel() = default;

bool RunsPanel::setDatabasePath(const QString& path, QString* error) {
    auto opened = td::RunStore::open(path.toStdString());
    if (!opened) {
        if (error) *error = QString::fromStdString(opened.error());
        dbLabel_->setText(tr("<span style='color:#b00020'>%1</span>")
                              .arg(QString::fromStdString(opened.error()).toHtmlEscaped()));
        return false;
    }
    store_ = std::move(opened).value();
    dbPath_ = path;
    dbLabel_->setText(tr("Database: %1").arg(path));
    overlays_.clear();
    model_->setRuns({});
    refresh();
    emit databaseChanged(path);
    return true;
}

void RunsPanel::refresh() {
    if (!store_) return;
    auto runs = store_->listRuns();
    if (!runs) {
        dbLabel_->setText(tr("<span style='color:#b00020'>%1</span>")
                              .arg(QString::fromStdString(runs.error()).toHtmlEscaped()));
        return;
    }
    auto selected = selectedRunIds();
    const int before = model_->rowCount();
    model_->setRuns(std::move(runs).value());
    selectRuns(selected);
    if (model_->rowCount() != before) view_->resizeColumnsToContents();
    bool grew = false;
    for (auto& [id, o] : overlays_) {
        const td::RunRecord* r = model_->runById(id);
        if (r && (r->status == "running" || o.lastGlobalStep == 0)) {
            pollOverlay(id, o);
            grew = true;
        }
    }
    if (grew) {
        stepChart_->replotIfDirty();
        epochChart_->replotIfDirty();
    }
}

std::vector<int64_t> RunsPanel::selectedRunIds() const {
    std::vector<int64_t> ids;
    for (const QModelIndex& i : view_->selectionModel()->selectedRows())
        ids.push_back(i.data(RunsTableModel::kIdRole).toLongLong());
    return ids;
}

void RunsPanel::selectRuns(const std::vector<int64_t>& ids) {
    QItemSelection sel;
    for (int64_t id : ids) {
        int row = model_->rowOf(id);
        if (row < 0) continue;
        QModelIndex p = proxy_->mapFromSource(model_->index(row, 0));
        if (p.isValid()) sel.select(p, p);
    }
    QSignalBlocker block(view_->selectionModel());
    view_->selectionModel()->select(
        sel, QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
    view_->viewport()->update();
}

void RunsPanel::onSelectionChanged() {
    updateButtons();
    rebuildOverlays();
}

void RunsPanel::updateButtons() {
    const size_t n = selectedRunIds().size();
    rename_->setEnabled(n == 1);
    notes_->setEnabled(n == 1);
    export_->setEnabled(n == 1);
    delete_->setEnabled(n >= 1);
    diff_->setEnabled(n == 2);
}

void RunsPanel::rebuildOverlays() {
    overlays_.clear();
    stepChart_->clearSeries();
    epochChart_->clearSeries();
    int i = 0;
    for (int64_t id : selectedRunIds()) {
        const td::RunRecord* r = model_->runById(id);
        if (!r) continue;
        const QString name = QString("#%1 %2").arg(id).arg(QString::fromStdString(r->name));
        Overlay o;
        o.stepSeries = stepChart_->addSeries(name, seriesColor(i));
        o.epochSeries =
            epochChart_->addSeries(name, seriesColor(i), ChartWidget::Style::LineAndDots);
        pollOverlay(id, o);
        overlays_[id] = o;
        ++i;
    }
    stepChart_->replotIfDirty();
    epochChart_->replotIfDirty();
}

void RunsPanel::pollOverlay(int64_t id, Overlay& o) {
    std::string key = metric_->currentText().toStdString();
    // Step rows carry training metrics only: val_x overlays x per step.
    std::string stepKey = key.rfind("val_", 0) == 0 ? key.substr(4) : key;
    if (auto steps = store_->steps(id, o.lastGlobalStep)) {
        QVector<double> xs, ys;
        for (const td::StepRow& s : steps.value()) {
            if (auto v = metricOf(s.metrics, stepKey)) {
                xs << static_cast<double>(s.globalStep);
                ys << *v;
            }
            o.lastGlobalStep = std::max(o.lastGlobalStep, s.globalStep);
        }
        stepChart_->append(o.stepSeries, xs, ys);
    }
    if (auto epochs = store_->epochs(id)) {
        QVector<double> xs, ys;
        const auto& rows = epochs.value();
        for (size_t k = static_cast<size_t>(o.epochsShown); k < rows.size(); ++k) {
            if (auto v = metricOf(rows[k].metrics, key)) {
                xs << rows[k].epoch + 1.0;
                ys << *v;
            }
        }
        o.epochsShown = static_cast<int>(rows.size());
        epochChart_->append(o.epochSeries, xs, ys);
    }
}

bool RunsPanel::renameRun(int64_t id, const QString& name) {
    if (!store_) return false;
    td::Status st = store_->renameRun(id, name.toStdString());
    if (!st) showError(tr("Rename run"), QString::fromStdString(st.error()));
    refresh();
    return st.ok();
}

bool RunsPanel::setNotes(int64_t id, const QString& notes) {
    if (!store_) return false;
    td::Status st = store_->setNotes(id, notes.toStdString());
    if (!st) showError(tr("Run notes"), QString::fromStdString(st.error()));
    refresh();
    return st.ok();
}

bool RunsPanel::deleteRun(int64_t id) {
    if (!store_) return false;
    td::Status st = store_->deleteRun(id);
    if (!st) showError(tr("Delete run"), QString::fromStdString(st.error()));
    refresh();
    return st.ok();
}

bool RunsPanel::exportCsv(int64_t id, const QString& path, QString* error) {
    if (!store_) return false;
    auto csv = store_->exportCsv(id);
    if (!csv) {
        if (error) *error = QString::fromStdString(csv.error());
        return false;
    }
    QFile f(path);
    if (!f.open(QIODevice::WriteOnly | QIODevice::Truncate) ||
        f.write(QByteArray::fromStdString(csv.value())) < 0) {
        if (error) *error = tr("Cannot write %1: %2").arg(path, f.errorString());
        return false;
    }
    return true;
}

void RunsPanel::renameSelected() {
    auto ids = selectedRunIds();
    if (ids.size() != 1) return;
    const td::RunRecord* r = model_->runById(ids[0]);
    bool ok = false;
    QString name = QInputDialog::getText(this, tr("Rename run"), tr("New name:"), QLineEdit::Normal,
                                         r ? QString::fromStdString(r->name) : QString(), &ok);
    if (!ok) return;
    if (name.trimmed().isEmpty()) {
        showError(tr("Rename run"), tr("A run name cannot be empty."));
        return;
    }
    renameRun(ids[0], name.trimmed());
}

void RunsPanel::notesSelected() {
    auto ids = selectedRunIds();
    if (ids.size() != 1) return;
    const td::RunRecord* r = model_->runById(ids[0]);
    bool ok = false;
    QString notes =
        QInputDialog::getMultiLineText(this, tr("Run notes"), tr("Notes for run #%1:").arg(ids[0]),
                                       r ? QString::fromStdString(r->notes) : QString(), &ok);
    if (ok) setNotes(ids[0], notes);
}

void RunsPanel::deleteSelected() {
    auto ids = selectedRunIds();
    if (ids.empty()) return;
    QStringList names;
    for (int64_t id : ids) {
        const td::RunRecord* r = model_->runById(id);
        names << QString("#%1 %2").arg(id).arg(r ? QString::fromStdString(r->name) : QString());
        if (r && r->status == "running") {
            showError(tr("Delete runs"), tr("Run #%1 is still running; stop it first.").arg(id));
            return;
        }
    }
    auto answer = QMessageBox::question(
        this, tr("Delete runs"),
        tr("Delete %n run(s) and all their metrics? This cannot be undone.\n\n%1", nullptr,
           static_cast<int>(ids.size()))
            .arg(names.join('\n')),
        QMessageBox::Yes | QMessageBox::Cancel, QMessageBox::Cancel);
    if (answer != QMessageBox::Yes) return;
    for (int64_t id : ids) deleteRun(id);
}

void RunsPanel::exportSelected() {
    auto ids = selectedRunIds();
    if (ids.size() != 1) return;
    const td::RunRecord* r = model_->runById(ids[0]);
    QString suggested =
        QString("run_%1_%2.csv").arg(ids[0]).arg(r ? QString::fromStdString(r->name) : QString());
    suggested.replace(QRegularExpression("[^A-Za-z0-9_.-]"), "_");
    QString path = QFileDialog::getSaveFileName(this, tr("Export run metrics"), suggested,
                                                tr("CSV files (*.csv)"));
    if (path.isEmpty()) return;
    QString error;
    if (!exportCsv(ids[0], path, &error)) showError(tr("Export CSV"), error);
}

void RunsPanel::diffSelected() {
    auto ids = selectedRunIds();
    if (ids.size() != 2) return;
    std::sort(ids.begin(), ids.end());
    auto a = store_->getRun(ids[0]), b = store_->getRun(ids[1]);
    if (!a || !b) {
        showError(tr("Compare configs"), QString::fromStdString(!a ? a.error() : b.error()));
        return;
    }
    auto doc = [](const td::RunRecord& r) {
        auto orNull = [](const std::string& s) { return s.empty() ? std::string("null") : s; };
        return QString::fromStdString("{\"project\":" + orNull(r.projectJson) +
                                      ",\"effective\":" + orNull(r.configJson) + "}");
    };
    const auto rows = diffJsonConfigs(doc(a.value()), doc(b.value()));
    QDialog dialog(this);
    dialog.setWindowTitle(tr("Compare run #%1 and run #%2").arg(ids[0]).arg(ids[1]));
    dialog.resize(1000, 640);
    auto* table = new QTableWidget(static_cast<int>(rows.size()), 3);
    table->setHorizontalHeaderLabels(
        {tr("Setting"), QString("#%1 %2").arg(ids[0]).arg(QString::fromStdString(a->name)),
         QString("#%1 %2").arg(ids[1]).arg(QString::fromStdString(b->name))});
    table->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
    table->verticalHeader()->hide();
    table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    int differing = 0;
    for (int i = 0; i < static_cast<int>(rows.size()); ++i) {
        const ConfigDiffRow& r = rows[static_cast<size_t>(i)];
        QString cells[] = {r.path, r.left.isEmpty() ? tr("(absent)") : r.left,
                           r.right.isEmpty() ? tr("(absent)") : r.right};
        for (int c = 0; c < 3; ++c) {
            auto* item = new QTableWidgetItem(cells[c]);
            if (r.differs) item->setBackground(QColor(255, 240, 200));
            table->setItem(i, c, item);
        }
        differing += r.differs;
    }
    auto* onlyDiff =
        new QCheckBox(tr("Only differences (%1 of %2 settings)").arg(differing).arg(rows.size()));
    connect(onlyDiff, &QCheckBox::toggled, table, [table, rows](bool on) {
        for (int i = 0; i < static_cast<int>(rows.size()); ++i)
            table->setRowHidden(i, on && !rows[static_cast<size_t>(i)].differs);
    });
    onlyDiff->setChecked(true);
    auto* box = new QDialogButtonBox(QDialogButtonBox::Close);
    connect(box, &QDialogButtonBox::rejected, &dialog, &QDialog::reject);
    auto* layout = new QVBoxLayout(&dialog);
    layout->addWidget(onlyDiff);
    layout->addWidget(table);
    layout->addWidget(box);
    dialog.exec();
}

void RunsPanel::showError(const QString& what, const QString& message) {
    QMessageBox::warning(this, what, message);
}

}  // namespace td::ui
