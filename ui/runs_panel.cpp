#include "ui/runs_panel.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDialog>
#include <QDialogButtonBox>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QInputDialog>
#include <QLabel>
#include <QLineEdit>
#include <QMenu>
#include <QMessageBox>
#include <QPushButton>
#include <QRegularExpression>
#include <QSortFilterProxyModel>
#include <QSplitter>
#include <QTableView>
#include <QTableWidget>
#include <QTimer>
#include <QVBoxLayout>

#include "engine/api/export.h"
#include "ui/async.h"
#include "ui/chart_widget.h"
#include "ui/config_diff.h"
#include "ui/runs_feed.h"
#include "ui/runs_table_model.h"
#include "ui/settings.h"

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

// The overlay metric that draws every replica of a run (from its per-replica rows).
constexpr const char* kReplicaThroughput = "replicas:samples_per_s";

// What one look reads for one overlaid run, and the new points it found.
struct OverlayRead {
    struct ReplicaPoints {
        std::string device;
        QVector<double> xs, ys;
    };
    int64_t id = 0;
    int64_t afterGlobalStep = 0;  // in: steps already shown; out: the last step read
    int epochsShown = 0;          // in: epochs already shown; out: epochs read
    QVector<double> stepXs, stepYs, epochXs, epochYs;
    std::map<int, ReplicaPoints> replicas;  // by replica index (kReplicaThroughput)
    std::string error;
};

// Worker thread: the run's rows after what is shown, as points of `key` (step rows carry training
// metrics only, so val_x overlays x per step).
void readOverlay(td::api::RunCatalog& store, const std::string& key, OverlayRead& o) {
    if (key == kReplicaThroughput) {
        auto rows = store.replicaStats(o.id, o.afterGlobalStep);
        if (!rows) {
            o.error = rows.error();
            return;
        }
        for (const td::ReplicaRow& r : rows.value()) {
            OverlayRead::ReplicaPoints& p = o.replicas[r.stats.replica];
            p.device = r.stats.device;
            p.xs << static_cast<double>(r.globalStep);
            p.ys << r.stats.samplesPerSecond;
            o.afterGlobalStep = std::max(o.afterGlobalStep, r.globalStep);
        }
        return;
    }
    const std::string stepKey = key.rfind("val_", 0) == 0 ? key.substr(4) : key;
    auto steps = store.steps(o.id, o.afterGlobalStep);
    if (!steps) {
        o.error = steps.error();
        return;
    }
    for (const td::StepRow& s : steps.value()) {
        if (auto v = metricOf(s.metrics, stepKey)) {
            o.stepXs << static_cast<double>(s.globalStep);
            o.stepYs << *v;
        }
        o.afterGlobalStep = std::max(o.afterGlobalStep, s.globalStep);
    }
    auto epochs = store.epochs(o.id);
    if (!epochs) {
        o.error = epochs.error();
        return;
    }
    const auto& rows = epochs.value();
    for (size_t k = static_cast<size_t>(o.epochsShown); k < rows.size(); ++k) {
        if (auto v = metricOf(rows[k].metrics, key)) {
            o.epochXs << rows[k].epoch + 1.0;
            o.epochYs << *v;
        }
    }
    o.epochsShown = static_cast<int>(rows.size());
}

}  // namespace

struct RunsPanel::Poll {
    int dbGeneration = 0;
    int overlayGeneration = 0;
    RunsDelta delta;
    std::vector<OverlayRead> overlays;
};

RunsPanel::RunsPanel(QWidget* parent)
    : QWidget(parent), model_(new RunsTableModel(this)), worker_(new SerialWorker(this)) {
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
    QHeaderView* header = view_->horizontalHeader();
    header->setStretchLastSection(true);
    header->setSectionResizeMode(RunsTableModel::ColId, QHeaderView::ResizeToContents);
    header->setSectionResizeMode(RunsTableModel::ColStatus, QHeaderView::ResizeToContents);
    // Names are what a user reads first: room for "Fashion-MNIST MLP #12" and more.
    header->resizeSection(RunsTableModel::ColName, 240);
    view_->setWordWrap(false);
    // Which columns show: the header's context menu, remembered across sessions.
    header->setContextMenuPolicy(Qt::CustomContextMenu);
    connect(header, &QWidget::customContextMenuRequested, this, [this, header](const QPoint& at) {
        QMenu menu;
        for (int c = 0; c < RunsTableModel::ColCount; ++c) {
            if (c == RunsTableModel::ColId || c == RunsTableModel::ColName) continue;
            QAction* a =
                menu.addAction(model_->headerData(c, Qt::Horizontal, Qt::DisplayRole).toString());
            a->setCheckable(true);
            a->setChecked(!view_->isColumnHidden(c));
            connect(a, &QAction::toggled, this, [this, c](bool on) { setColumnShown(c, on); });
        }
        menu.exec(header->mapToGlobal(at));
    });
    const QStringList chosen = Settings::runsColumns();
    for (int c = 0; c < RunsTableModel::ColCount; ++c) {
        const QString name = model_->headerData(c, Qt::Horizontal, Qt::DisplayRole).toString();
        const bool shown =
            c == RunsTableModel::ColId || c == RunsTableModel::ColName ||
            (chosen.isEmpty() ? RunsTableModel::shownByDefault(c) : chosen.contains(name));
        view_->setColumnHidden(c, !shown);
    }
    view_->setAlternatingRowColors(true);
    connect(view_->selectionModel(), &QItemSelectionModel::selectionChanged, this,
            &RunsPanel::onSelectionChanged);
    connect(view_, &QTableView::doubleClicked, this, [this] { notesSelected(); });

    rename_ = new QPushButton(tr("Rename…"));
    notes_ = new QPushButton(tr("Notes…"));
    delete_ = new QPushButton(tr("Delete…"));
    resume_ = new QPushButton(tr("Resume"));
    resume_->setToolTip(
        tr("Continue the selected stopped, interrupted or failed run from its last good "
           "checkpoint."));
    export_ = new QPushButton(tr("Export CSV…"));
    exportModel_ = new QPushButton(tr("Export model…"));
    exportModel_->setObjectName("exportModel");
    diff_ = new QPushButton(tr("Compare configs…"));
    diff_->setToolTip(tr("Select exactly two runs to compare their configurations."));
    connect(rename_, &QPushButton::clicked, this, &RunsPanel::renameSelected);
    connect(notes_, &QPushButton::clicked, this, &RunsPanel::notesSelected);
    connect(delete_, &QPushButton::clicked, this, &RunsPanel::deleteSelected);
    connect(resume_, &QPushButton::clicked, this, &RunsPanel::resumeSelected);
    connect(export_, &QPushButton::clicked, this, &RunsPanel::exportSelected);
    connect(exportModel_, &QPushButton::clicked, this, &RunsPanel::exportModelSelected);
    connect(diff_, &QPushButton::clicked, this, &RunsPanel::diffSelected);
    auto* buttons = new QHBoxLayout;
    for (QPushButton* b : {rename_, notes_, delete_, resume_, export_, exportModel_, diff_})
        buttons->addWidget(b);
    buttons->addStretch(1);
    buttons->addWidget(new QLabel(tr("Overlay metric:")));
    metric_ = new QComboBox;
    for (const char* key : {"loss", "accuracy", "val_loss", "val_accuracy", "samples_per_s"})
        metric_->addItem(key, QString(key));
    metric_->addItem(tr("samples_per_s of each replica"), QString(kReplicaThroughput));
    metric_->setToolTip(
        tr("What the charts overlay for the selected runs; \"of each replica\" "
           "draws one line per replica of a run (Mirrored, MultiWorkerMirrored)."));
    connect(metric_, &QComboBox::activated, this, &RunsPanel::rebuildOverlays);
    buttons->addWidget(metric_);

    stepChart_ =
        new ChartWidget(tr("Selected runs per step"), tr("global step"), metric_->currentText());
    epochChart_ =
        new ChartWidget(tr("Selected runs per epoch"), tr("epoch"), metric_->currentText());
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
    rememberSplitter(split, "runs");
    auto* layout = new QVBoxLayout(this);
    layout->addWidget(split);

    poll_ = new QTimer(this);
    poll_->setInterval(kPollIntervalMs);
    connect(poll_, &QTimer::timeout, this, &RunsPanel::poll);
    poll_->start();
    updateButtons();
}

RunsPanel::~RunsPanel() {
    worker_.reset();  // waits for a look in progress; no result arrives after this
}

bool RunsPanel::setDatabasePath(const QString& path, QString* error) {
    // Opening creates and migrates the store and reports a bad file at once, to the caller.
    auto opened = td::api::RunCatalog::open(path.toStdString());
    if (!opened) {
        if (error) *error = QString::fromStdString(opened.error());
        dbLabel_->setText(tr("<span style='color:#b00020'>%1</span>")
                              .arg(QString::fromStdString(opened.error()).toHtmlEscaped()));
        return false;
    }
    catalog_ = std::shared_ptr<td::api::RunCatalog>(std::move(opened).value());
    feed_ = std::make_shared<RunsFeed>(path.toStdString());
    ++dbGeneration_;
    dbPath_ = path;
    dbLabel_->setText(tr("Database: %1").arg(path));
    overlays_.clear();
    stepChart_->clearSeries();
    epochChart_->clearSeries();
    model_->setRuns({});
    resizedColumns_ = false;
    refresh();
    emit databaseChanged(path);
    return true;
}

void RunsPanel::refresh() {
    if (!catalog_) {
        emit refreshed();  // nothing to read: current as it is
        return;
    }
    if (polling_) {
        pollAgain_ = true;
        return;
    }
    poll();
}

void RunsPanel::poll() {
    if (!catalog_ || polling_) return;
    polling_ = true;
    std::vector<OverlayRead> reads;
    for (const auto& [id, o] : overlays_) {
        const td::RunRecord* r = model_->runById(id);
        if (!o.loaded || (r && r->status == "running"))
            reads.push_back(OverlayRead{id, o.lastGlobalStep, o.epochsShown});
    }
    const int dbGeneration = dbGeneration_, overlayGeneration = overlayGeneration_;
    worker_->post(
        [feed = feed_, store = catalog_, key = metric_->currentData().toString().toStdString(),
         reads = std::move(reads), dbGeneration, overlayGeneration,
         watch = std::exchange(watchNext_, {})]() mutable {
            Poll p;
            feed->watch(watch);
            p.dbGeneration = dbGeneration;
            p.overlayGeneration = overlayGeneration;
            // The run list first: overlay rows read afterwards are at least as new, so a run seen
            // finished here has all its rows read below.
            p.delta = feed->poll();
            for (OverlayRead& o : reads) readOverlay(*store, key, o);
            p.overlays = std::move(reads);
            return p;
        },
        [this](Poll p) { applyPoll(p); });
}

void RunsPanel::applyPoll(Poll& p) {
    polling_ = false;
    if (p.dbGeneration == dbGeneration_) {
        if (!p.delta.error.empty()) {
            dbLabel_->setText(tr("<span style='color:#b00020'>%1</span>")
                                  .arg(QString::fromStdString(p.delta.error).toHtmlEscaped()));
        } else {
            dbLabel_->setText(tr("Database: %1").arg(dbPath_));
            const auto selected = selectedRunIds();
            model_->applyChanges(std::move(p.delta.runs), std::move(p.delta.removed), p.delta.full);
            if (selectedRunIds() != selected) selectRuns(selected);
            if (!resizedColumns_ && model_->rowCount() > 0) {
                view_->resizeColumnsToContents();
                resizedColumns_ = true;
            }
        }
        if (p.overlayGeneration == overlayGeneration_) {
            bool grew = false;
            for (OverlayRead& r : p.overlays) {
                auto it = overlays_.find(r.id);
                if (it == overlays_.end()) continue;
                Overlay& o = it->second;
                if (!r.error.empty()) {
                    dbLabel_->setText(tr("<span style='color:#b00020'>%1</span>")
                                          .arg(QString::fromStdString(r.error).toHtmlEscaped()));
                    continue;
                }
                stepChart_->append(o.stepSeries, r.stepXs, r.stepYs);
                epochChart_->append(o.epochSeries, r.epochXs, r.epochYs);
                for (auto& [replica, points] : r.replicas) {
                    auto [slot, added] = o.replicaSeries.try_emplace(replica, -1);
                    if (added) {
                        slot->second = stepChart_->addSeries(
                            QString("%1 %2").arg(o.label, QString::fromStdString(points.device)),
                            seriesColor(o.color),
                            replica == 0 ? ChartWidget::Style::Line : ChartWidget::Style::Dashed);
                    }
                    stepChart_->append(slot->second, points.xs, points.ys);
                    grew = grew || !points.xs.isEmpty();
                }
                o.lastGlobalStep = r.afterGlobalStep;
                o.epochsShown = r.epochsShown;
                o.loaded = true;
                grew = grew || !r.stepXs.isEmpty() || !r.epochXs.isEmpty();
            }
            if (grew) {
                stepChart_->replotIfDirty();
                epochChart_->replotIfDirty();
            }
        }
        updateButtons();  // a run's status may have changed (Resume depends on it)
        emit refreshed();
    }
    if (pollAgain_) {
        pollAgain_ = false;
        poll();
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
    updateButtons();
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
    const td::RunRecord* one = n == 1 ? model_->runById(selectedRunIds()[0]) : nullptr;
    resume_->setEnabled(one && (one->status == "stopped" || one->status == "interrupted" ||
                                one->status == "failed"));
    diff_->setEnabled(n == 2);

    // Export model: offered when the store knows a checkpoint file of the run. The store is asked
    // on the worker when the selection, the run's status or its last write changes.
    if (!one || !catalog_) {
        exportModel_->setEnabled(false);
        exportModel_->setToolTip(
            tr("Select one run to export its model (ONNX or Keras 3) with the weights of its "
               "latest good checkpoint."));
        return;
    }
    const std::string run = std::to_string(dbGeneration_) + ":" + std::to_string(one->id);
    const std::string key = run + ":" + one->status + ":" + std::to_string(one->updatedAtMs);
    if (key != modelCheckedKey_ && key != modelPendingKey_) checkModelAvailable(one->id, key);
    if (modelCheckedRun_ != run) {
        exportModel_->setEnabled(false);
        exportModel_->setToolTip(tr("Looking for run #%1's checkpoints…").arg(one->id));
    } else if (!modelUnavailable_.isEmpty()) {
        exportModel_->setEnabled(false);
        exportModel_->setToolTip(modelUnavailable_);
    } else {
        exportModel_->setEnabled(true);
        exportModel_->setToolTip(
            tr("Export run #%1's model with the weights of its latest good checkpoint, as ONNX "
               "(.onnx) or Keras 3 (.keras) by the file's extension.")
                .arg(one->id));
    }
}

void RunsPanel::checkModelAvailable(int64_t id, const std::string& key) {
    modelPendingKey_ = key;
    const int generation = dbGeneration_;
    worker_->post([store = catalog_, id] { return td::runModelUnavailable(*store, id); },
                  [this, id, key, generation](td::Result<std::string> why) {
                      if (modelPendingKey_ == key) modelPendingKey_.clear();
                      if (generation != dbGeneration_) return;
                      modelCheckedKey_ = key;
                      modelCheckedRun_ = std::to_string(generation) + ":" + std::to_string(id);
                      modelUnavailable_ = why ? QString::fromStdString(why.value())
                                              : tr("Cannot look for run #%1's checkpoints: %2")
                                                    .arg(id)
                                                    .arg(QString::fromStdString(why.error()));
                      updateButtons();
                  });
}

void RunsPanel::rebuildOverlays() {
    ++overlayGeneration_;
    overlays_.clear();
    stepChart_->clearSeries();
    epochChart_->clearSeries();
    // The y axes name what they show.
    const QString metric = metric_->currentData().toString() == kReplicaThroughput
                               ? tr("samples/s")
                               : metric_->currentText();
    stepChart_->setYLabel(metric);
    epochChart_->setYLabel(metric);
    int i = 0;
    for (int64_t id : selectedRunIds()) {
        const td::RunRecord* r = model_->runById(id);
        if (!r) continue;
        const QString name = QString("#%1 %2").arg(id).arg(QString::fromStdString(r->name));
        Overlay o;
        o.label = name;
        o.color = i;
        // Per-replica overlays add their series as the replicas' rows arrive.
        if (metric_->currentData().toString() != kReplicaThroughput) {
            o.stepSeries = stepChart_->addSeries(name, seriesColor(i));
            o.epochSeries =
                epochChart_->addSeries(name, seriesColor(i), ChartWidget::Style::LineAndDots);
        }
        overlays_[id] = o;
        ++i;
    }
    stepChart_->replotIfDirty();
    epochChart_->replotIfDirty();
    if (!overlays_.empty()) refresh();  // the points come with the next look
}

// Edits are written here and shown at once: a rename or a note moves no watermark that the feed
// follows (its periodic full reload would find them only later).
bool RunsPanel::renameRun(int64_t id, const QString& name) {
    if (!catalog_) return false;
    td::Status st = catalog_->rename(id, name.toStdString());
    if (!st) {
        showError(tr("Rename run"), QString::fromStdString(st.error()));
    } else if (const td::RunRecord* r = model_->runById(id)) {
        td::RunRecord edited = *r;
        edited.name = name.toStdString();
        model_->replaceRun(edited);
    }
    refresh();
    return st.ok();
}

bool RunsPanel::setNotes(int64_t id, const QString& notes) {
    if (!catalog_) return false;
    td::Status st = catalog_->setNotes(id, notes.toStdString());
    if (!st) {
        showError(tr("Run notes"), QString::fromStdString(st.error()));
    } else if (const td::RunRecord* r = model_->runById(id)) {
        td::RunRecord edited = *r;
        edited.notes = notes.toStdString();
        model_->replaceRun(edited);
    }
    refresh();
    return st.ok();
}

bool RunsPanel::deleteRun(int64_t id, bool deleteCheckpoints) {
    if (!catalog_) return false;
    td::Status st = catalog_->remove(id, deleteCheckpoints);
    if (!st)
        showError(tr("Delete run"), QString::fromStdString(st.error()));
    else
        model_->applyChanges({}, {id}, false);
    refresh();
    return st.ok();
}

bool RunsPanel::exportCsv(int64_t id, const QString& path, QString* error) {
    if (!catalog_) return false;
    auto csv = catalog_->exportCsv(id);
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
    QMessageBox box(QMessageBox::Question, tr("Delete runs"),
                    tr("Delete %n run(s) and all their metrics? This cannot be undone.\n\n%1",
                       nullptr, static_cast<int>(ids.size()))
                        .arg(names.join('\n')),
                    QMessageBox::Yes | QMessageBox::Cancel, this);
    box.setDefaultButton(QMessageBox::Cancel);
    auto* files = new QCheckBox(tr("Also delete their checkpoint files"));
    files->setToolTip(tr("Without checkpoints a run can no longer be resumed or exported."));
    box.setCheckBox(files);
    if (box.exec() != QMessageBox::Yes) return;
    for (int64_t id : ids) deleteRun(id, files->isChecked());
}

void RunsPanel::resumeSelected() {
    auto ids = selectedRunIds();
    if (ids.size() != 1) return;
    watchNext_.push_back(ids[0]);
    emit resumeRequested(ids[0]);
}

void RunsPanel::exportSelected() {
    auto ids = selectedRunIds();
    if (ids.size() != 1) return;
    const td::RunRecord* r = model_->runById(ids[0]);
    QString suggested =
        QString("run_%1_%2.csv").arg(ids[0]).arg(r ? QString::fromStdString(r->name) : QString());
    suggested.replace(QRegularExpression("[^A-Za-z0-9_.-]"), "_");
    QString path = saveFileName(tr("Export run metrics"), suggested, tr("CSV files (*.csv)"));
    if (path.isEmpty()) return;
    QString error;
    if (!exportCsv(ids[0], path, &error)) showError(tr("Export CSV"), error);
}

void RunsPanel::exportModel(int64_t id, const QString& path) {
    auto fail = [this, id, path](const QString& error) {
        showError(tr("Export model"), error);
        emit modelExported(id, path, QString(), error);
    };
    if (!catalog_) return fail(tr("No run database is open."));
    const bool onnx = path.endsWith(".onnx", Qt::CaseInsensitive);
    if (!onnx && !path.endsWith(".keras", Qt::CaseInsensitive))
        return fail(tr("%1: expected a .onnx or .keras file").arg(path));
    const td::ExportFormat format = onnx ? td::ExportFormat::Onnx : td::ExportFormat::Keras;
    // The checkpoint is read and the file written on the worker, like every read of the store.
    worker_->post(
        [store = catalog_, id, format, out = path.toStdString()] {
            return td::exportRunModel(*store, id, format, out);
        },
        [id, path, fail, this](td::Result<td::RunModel> done) {
            if (!done) return fail(QString::fromStdString(done.error()));
            emit modelExported(id, path, QString::fromStdString(done->checkpointPath), QString());
        });
}

void RunsPanel::exportModelSelected() {
    auto ids = selectedRunIds();
    if (ids.size() != 1) return;
    const td::RunRecord* r = model_->runById(ids[0]);
    QString suggested =
        QString("run_%1_%2.keras").arg(ids[0]).arg(r ? QString::fromStdString(r->name) : QString());
    suggested.replace(QRegularExpression("[^A-Za-z0-9_.-]"), "_");
    const QString path = saveFileName(tr("Export the model of run #%1").arg(ids[0]), suggested,
                                      tr("Keras 3 (*.keras);;ONNX (*.onnx)"));
    if (!path.isEmpty()) exportModel(ids[0], path);
}

QString RunsPanel::saveFileName(const QString& title, const QString& suggested,
                                const QString& filter) {
    if (chooseSaveFile_) return chooseSaveFile_(title, suggested, filter);
    QString chosenFilter;
    QString path = QFileDialog::getSaveFileName(this, title, suggested, filter, &chosenFilter);
    // A name typed without an extension takes the chosen filter's ("Keras 3 (*.keras)").
    static const QRegularExpression extension(R"(\*(\.[A-Za-z0-9]+))");
    const auto m = extension.match(chosenFilter);
    if (!path.isEmpty() && QFileInfo(path).suffix().isEmpty() && m.hasMatch())
        path += m.captured(1);
    return path;
}

void RunsPanel::diffSelected() {
    auto ids = selectedRunIds();
    if (ids.size() != 2 || !catalog_) return;
    std::sort(ids.begin(), ids.end());
    // The two project documents are read only now, for these two runs, on the worker.
    using Pair = std::pair<td::Result<td::RunRecord>, td::Result<td::RunRecord>>;
    worker_->post([store = catalog_, ids] { return Pair(store->run(ids[0]), store->run(ids[1])); },
                  [this](Pair runs) {
                      if (!runs.first || !runs.second) {
                          const std::string& e =
                              !runs.first ? runs.first.error() : runs.second.error();
                          showError(tr("Compare configs"), QString::fromStdString(e));
                          return;
                      }
                      showDiff(runs.first.value(), runs.second.value());
                  });
}

void RunsPanel::showDiff(const td::RunRecord& a, const td::RunRecord& b) {
    showRunComparison(this, a, QString("#%1 %2").arg(a.id).arg(QString::fromStdString(a.name)), b,
                      QString("#%1 %2").arg(b.id).arg(QString::fromStdString(b.name)));
}

void RunsPanel::showError(const QString& what, const QString& message) {
    if (interactive_) QMessageBox::warning(this, what, message);
}

void RunsPanel::setColumnShown(int column, bool shown) {
    view_->setColumnHidden(column, !shown);
    QStringList names;
    for (int c = 0; c < RunsTableModel::ColCount; ++c)
        if (!view_->isColumnHidden(c))
            names << model_->headerData(c, Qt::Horizontal, Qt::DisplayRole).toString();
    Settings::setRunsColumns(names);
}

}  // namespace td::ui
