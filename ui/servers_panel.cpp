#include "ui/servers_panel.h"

#include <QDialogButtonBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QPushButton>
#include <QRegularExpression>
#include <QSortFilterProxyModel>
#include <QSpinBox>
#include <QTableView>
#include <QTimer>
#include <QVBoxLayout>

#include "ui/config_diff.h"
#include "ui/remote_link.h"
#include "ui/runs_table_model.h"

namespace td::ui {

ConnectDialog::ConnectDialog(QWidget* parent) : QDialog(parent) {
    setObjectName("connectDialog");
    setWindowTitle(tr("Connect to Server"));
    host_ = new QLineEdit;
    host_->setObjectName("serverHost");
    host_->setPlaceholderText(tr("an alias of ~/.ssh/config, host or user@host"));
    port_ = new QSpinBox;
    port_->setObjectName("serverPort");
    port_->setRange(0, 65535);
    port_->setSpecialValueText(tr("as ssh is configured (22)"));
    store_ = new QLineEdit;
    store_->setObjectName("serverStore");
    store_->setPlaceholderText(tr("TrainDeck's default store there"));
    traindeck_ = new QLineEdit("traindeck");
    traindeck_->setObjectName("serverTraindeck");
    auto* form = new QFormLayout;
    form->addRow(tr("&Host:"), host_);
    form->addRow(tr("&Port:"), port_);
    form->addRow(tr("&Run store there:"), store_);
    form->addRow(tr("&traindeck there:"), traindeck_);
    auto* note = new QLabel(
        tr("TrainDeck runs your ssh client with your keys and SSH agent only: no password is "
           "asked or stored, and a host key ssh does not know yet is refused (connect once with "
           "ssh in a terminal to check and accept it)."));
    note->setWordWrap(true);
    auto* box = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
    connect(box, &QDialogButtonBox::accepted, this, [this] {
        if (td::Status st = td::api::checkRemoteServer(server()); !st.ok()) {
            QMessageBox::warning(this, windowTitle(), QString::fromStdString(st.error()));
            return;
        }
        accept();
    });
    connect(box, &QDialogButtonBox::rejected, this, &QDialog::reject);
    auto* layout = new QVBoxLayout(this);
    layout->addLayout(form);
    layout->addWidget(note);
    layout->addWidget(box);
}

td::api::RemoteServer ConnectDialog::server() const {
    td::api::RemoteServer s;
    s.host = host_->text().trimmed().toStdString();
    s.port = port_->value();
    s.store = store_->text().trimmed().toStdString();
    const QString t = traindeck_->text().trimmed();
    s.traindeck = t.isEmpty() ? "traindeck" : t.toStdString();
    return s;
}

void ConnectDialog::setServer(const td::api::RemoteServer& s) {
    host_->setText(QString::fromStdString(s.host));
    port_->setValue(s.port);
    store_->setText(QString::fromStdString(s.store));
    traindeck_->setText(QString::fromStdString(s.traindeck));
}

RemoteRunsPage::RemoteRunsPage(RemoteLink* link, QWidget* parent)
    : QWidget(parent), link_(link), model_(new RunsTableModel(this)) {
    setObjectName("remoteRunsPage");
    proxy_ = new QSortFilterProxyModel(this);
    proxy_->setSourceModel(model_);
    proxy_->setSortRole(RunsTableModel::kSortRole);
    view_ = new QTableView;
    view_->setObjectName("remoteRunsView");
    view_->setModel(proxy_);
    view_->setSelectionBehavior(QAbstractItemView::SelectRows);
    view_->setSortingEnabled(true);
    view_->sortByColumn(RunsTableModel::ColId, Qt::DescendingOrder);
    view_->verticalHeader()->hide();
    for (int c = 0; c < RunsTableModel::ColCount; ++c)
        view_->setColumnHidden(c, !RunsTableModel::shownByDefault(c));
    state_ = new QLabel;
    state_->setObjectName("remoteState");
    state_->setWordWrap(true);
    state_->setTextInteractionFlags(Qt::TextSelectableByMouse);

    auto button = [this](const QString& text, const char* name, const QString& tip) {
        auto* b = new QPushButton(text);
        b->setObjectName(name);
        b->setToolTip(tip);
        return b;
    };
    watch_ = button(tr("&Watch"), "remoteWatch", tr("Follow the run live in the Monitor"));
    stop_ = button(tr("S&top"), "remoteStop", tr("Stop the run on the server at its next step"));
    pause_ = button(tr("&Pause"), "remotePause", tr("Pause the run on the server"));
    continue_ = button(tr("C&ontinue"), "remoteContinue", tr("Continue a paused run"));
    export_ = button(tr("&Export model…"), "remoteExportModel",
                     tr("Bring the run's model here as ONNX or .keras"));
    compare_ = button(tr("&Compare…"), "remoteCompare",
                      tr("Compare two runs of the server, or one with the run selected in the "
                         "local store"));
    auto* refreshButton = button(tr("&Refresh"), "remoteRefresh", tr("List the runs again now"));
    auto* disconnectButton =
        button(tr("&Disconnect"), "remoteDisconnect", tr("Close this server's connection"));
    auto* buttons = new QHBoxLayout;
    for (QPushButton* b : {watch_, stop_, pause_, continue_, export_, compare_})
        buttons->addWidget(b);
    buttons->addStretch();
    buttons->addWidget(refreshButton);
    buttons->addWidget(disconnectButton);

    auto* layout = new QVBoxLayout(this);
    auto* title = new QLabel(tr("<b>%1</b> over SSH").arg(link_->label().toHtmlEscaped()));
    layout->addWidget(title);
    layout->addWidget(state_);
    layout->addLayout(buttons);
    layout->addWidget(view_, 1);

    connect(watch_, &QPushButton::clicked, this, [this] {
        const auto ids = selectedRunIds();
        if (ids.size() == 1) emit watchRequested(ids.front());
    });
    connect(view_, &QTableView::doubleClicked, this, [this] {
        const auto ids = selectedRunIds();
        if (ids.size() == 1) emit watchRequested(ids.front());
    });
    connect(stop_, &QPushButton::clicked, this, &RemoteRunsPage::stopSelected);
    connect(pause_, &QPushButton::clicked, this, [this] { pauseSelected(true); });
    connect(continue_, &QPushButton::clicked, this, [this] { pauseSelected(false); });
    connect(export_, &QPushButton::clicked, this, &RemoteRunsPage::exportSelected);
    connect(compare_, &QPushButton::clicked, this, &RemoteRunsPage::compareSelected);
    connect(refreshButton, &QPushButton::clicked, this, &RemoteRunsPage::refresh);
    connect(disconnectButton, &QPushButton::clicked, this, &RemoteRunsPage::disconnectRequested);
    connect(view_->selectionModel(), &QItemSelectionModel::selectionChanged, this,
            &RemoteRunsPage::updateButtons);
    connect(link_, &RemoteLink::runsListed, this, &RemoteRunsPage::applyRuns);
    connect(link_, &RemoteLink::failed, this, [this](const QString& e) {
        state_->setText(tr("<span style='color:#b00'>%1</span><br>Trying again every %2 s.")
                            .arg(e.toHtmlEscaped())
                            .arg(kRefreshMs / 1000));
    });
    timer_ = new QTimer(this);
    timer_->setInterval(kRefreshMs);
    connect(timer_, &QTimer::timeout, this, &RemoteRunsPage::refresh);
    timer_->start();
    state_->setText(tr("Connecting…"));
    updateButtons();
    refresh();
}

void RemoteRunsPage::refresh() {
    link_->refreshRuns();
}

void RemoteRunsPage::applyRuns() {
    const auto keep = selectedRunIds();
    model_->setRuns(link_->runs());
    if (!keep.empty()) selectRun(keep.front());
    int running = 0;
    for (const td::RunRecord& r : link_->runs()) running += r.status == "running";
    state_->setText(tr("Connected: %n run(s)", "", static_cast<int>(link_->runs().size())) +
                    (running > 0 ? tr(", %1 running").arg(running) : QString()));
    updateButtons();
}

std::vector<int64_t> RemoteRunsPage::selectedRunIds() const {
    std::vector<int64_t> ids;
    for (const QModelIndex& i : view_->selectionModel()->selectedRows())
        ids.push_back(proxy_->data(i, RunsTableModel::kIdRole).toLongLong());
    return ids;
}

void RemoteRunsPage::selectRun(int64_t id) {
    const int row = model_->rowOf(id);
    if (row < 0) return;
    const QModelIndex i = proxy_->mapFromSource(model_->index(row, 0));
    view_->selectionModel()->select(
        i, QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
    view_->scrollTo(i);
}

void RemoteRunsPage::updateButtons() {
    const auto ids = selectedRunIds();
    const td::RunRecord* r = ids.size() == 1 ? link_->run(ids.front()) : nullptr;
    const bool running = r && r->status == "running";
    watch_->setEnabled(r != nullptr);
    stop_->setEnabled(running);
    pause_->setEnabled(running);
    continue_->setEnabled(running);
    export_->setEnabled(r != nullptr);
    compare_->setEnabled(ids.size() == 1 || ids.size() == 2);
}

void RemoteRunsPage::report(const QString& error) {
    emit message(error, true);
    state_->setText(QString("<span style='color:#b00'>%1</span>").arg(error.toHtmlEscaped()));
    if (interactive_) QMessageBox::warning(this, link_->label(), error);
}

void RemoteRunsPage::stopSelected() {
    for (int64_t id : selectedRunIds())
        link_->stop(id, [this, id](const RemoteLink::Reply& r) {
            if (!r.error.isEmpty()) return report(r.error);
            emit message(tr("Asked run #%1 on %2 to stop").arg(id).arg(link_->label()), false);
            refresh();
        });
}

void RemoteRunsPage::pauseSelected(bool pause) {
    for (int64_t id : selectedRunIds())
        link_->pause(id, pause, [this, id, pause](const RemoteLink::Reply& r) {
            if (!r.error.isEmpty()) return report(r.error);
            emit message((pause ? tr("Paused run #%1 on %2") : tr("Continued run #%1 on %2"))
                             .arg(id)
                             .arg(link_->label()),
                         false);
        });
}

void RemoteRunsPage::exportModel(int64_t id, const QString& path,
                                 std::function<void(const QString&)> done) {
    const QString format =
        QFileInfo(path).suffix().compare("onnx", Qt::CaseInsensitive) == 0 ? "onnx" : "keras";
    link_->exportModel(id, format, path, std::move(done));
}

void RemoteRunsPage::exportSelected() {
    const auto ids = selectedRunIds();
    if (ids.size() != 1) return;
    const td::RunRecord* r = link_->run(ids.front());
    const QString suggested = QString("%1.keras")
                                  .arg(r ? QString::fromStdString(r->name).replace(
                                               QRegularExpression("[^A-Za-z0-9_.-]+"), "_")
                                         : QString::number(ids.front()));
    const QString path =
        QFileDialog::getSaveFileName(this, tr("Export the run's model"), suggested,
                                     tr("Keras 3 model (*.keras);;ONNX model (*.onnx)"));
    if (path.isEmpty()) return;
    exportModel(ids.front(), path, [this, path, id = ids.front()](const QString& error) {
        if (!error.isEmpty()) return report(error);
        emit message(tr("Exported run #%1 of %2 to %3").arg(id).arg(link_->label(), path), false);
    });
}

void RemoteRunsPage::compare(
    int64_t id, const td::RunRecord* other, int64_t otherRemoteId,
    std::function<void(const td::RunRecord&, const td::RunRecord&, const QString&)> done) {
    const td::RunRecord local = other ? *other : td::RunRecord{};
    link_->show(id, [this, local, otherRemoteId, done](td::Result<td::RunRecord> a) {
        if (!a.ok()) return done({}, {}, QString::fromStdString(a.error()));
        if (otherRemoteId <= 0) return done(*a, local, {});
        link_->show(otherRemoteId, [first = *a, done](td::Result<td::RunRecord> b) {
            if (!b.ok()) return done({}, {}, QString::fromStdString(b.error()));
            done(first, *b, {});
        });
    });
}

void RemoteRunsPage::compareSelected() {
    const auto ids = selectedRunIds();
    const QString server = link_->label();
    auto label = [&server](const td::RunRecord& r, bool remote) {
        return (remote ? server + ": " : QString()) +
               QString("#%1 %2").arg(r.id).arg(QString::fromStdString(r.name));
    };
    if (ids.size() == 2) {
        compare(ids[0], nullptr, ids[1],
                [this, label](const td::RunRecord& a, const td::RunRecord& b, const QString& e) {
                    if (!e.isEmpty()) return report(e);
                    showRunComparison(this, a, label(a, true), b, label(b, true));
                });
        return;
    }
    td::RunRecord local;
    if (ids.size() != 1 || !localRun_ || !localRun_(&local)) {
        report(
            tr("Select two runs of this server, or one here and one in the local store (the "
               "\"This computer\" page), to compare them"));
        return;
    }
    compare(ids[0], &local, 0,
            [this, label](const td::RunRecord& a, const td::RunRecord& b, const QString& e) {
                if (!e.isEmpty()) return report(e);
                showRunComparison(this, a, label(a, true), b, label(b, false));
            });
}

}  // namespace td::ui
