#include "ui/training_panel.h"

#include <QApplication>
#include <QButtonGroup>
#include <QCheckBox>
#include <QClipboard>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFileInfo>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QRadioButton>
#include <QScrollArea>
#include <QSpinBox>
#include <QToolButton>
#include <QVBoxLayout>

#include "ui/project_controller.h"

namespace td::ui {

namespace {

QDoubleSpinBox* dspin(double lo, double hi, int decimals, double step) {
    auto* s = new QDoubleSpinBox;
    s->setRange(lo, hi);
    s->setDecimals(decimals);
    s->setSingleStep(step);
    return s;
}

QSpinBox* ispin(int lo, int hi) {
    auto* s = new QSpinBox;
    s->setRange(lo, hi);
    return s;
}

QString gib(int64_t bytes) {
    return QString::number(static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0), 'f', 1) +
           " GiB";
}

void setRowVisible(QFormLayout* form, QWidget* field, bool on) {
    field->setVisible(on);
    if (QWidget* label = form->labelForField(field)) label->setVisible(on);
}

td::CallbackConfig* findCallback(td::TrainConfig& t, const std::string& type) {
    for (auto& c : t.callbacks)
        if (c.type == type) return &c;
    return nullptr;
}

const td::CallbackConfig* findCallback(const td::TrainConfig& t, const std::string& type) {
    for (const auto& c : t.callbacks)
        if (c.type == type) return &c;
    return nullptr;
}

const QStringList kMonitors{"val_loss", "val_accuracy", "loss", "accuracy"};
const QStringList kMetrics{
    "accuracy",        "sparse_categorical_accuracy",       "categorical_accuracy",
    "binary_accuracy", "sparse_top_k_categorical_accuracy", "top_k_categorical_accuracy"};

}  // namespace

TrainingPanel::TrainingPanel(ProjectController* project, QWidget* parent)
    : QWidget(parent), project_(project), devices_(td::listDevices()) {
    auto* content = new QWidget;
    auto* grid = new QHBoxLayout(content);
    auto* col1 = new QVBoxLayout;
    col1->addWidget(buildOptimizer());
    col1->addStretch(1);
    auto* col2 = new QVBoxLayout;
    col2->addWidget(buildLossAndMetrics());
    col2->addWidget(buildCallbacks());
    col2->addStretch(1);
    auto* col3 = new QVBoxLayout;
    col3->addWidget(buildRuntime());
    col3->addStretch(1);
    grid->addLayout(col1, 1);
    grid->addLayout(col2, 1);
    grid->addLayout(col3, 1);
    auto* scroll = new QScrollArea;
    scroll->setWidgetResizable(true);
    scroll->setWidget(content);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(scroll);
    connect(project_, &ProjectController::projectReplaced, this, &TrainingPanel::reload);
    connect(project_, &ProjectController::pathChanged, this, &TrainingPanel::updateStrategyNotes);
    connect(project_, &ProjectController::dirtyChanged, this, &TrainingPanel::updateStrategyNotes);
    // The batch size is edited on the Data tab.
    connect(project_, &ProjectController::projectEdited, this, &TrainingPanel::updateStrategyNotes);
    reload();
}

QWidget* TrainingPanel::buildOptimizer() {
    auto* box = new QGroupBox(tr("Optimizer"));
    optForm_ = new QFormLayout(box);
    optimizer_ = new QComboBox;
    optimizer_->setObjectName("optimizer");
    optimizer_->addItem("Adam", "adam");
    optimizer_->addItem("AdamW", "adamw");
    optimizer_->addItem("SGD", "sgd");
    optimizer_->addItem("RMSprop", "rmsprop");
    lr_ = dspin(1e-7, 10.0, 7, 1e-4);
    lr_->setObjectName("learningRate");
    beta1_ = dspin(0.0, 0.999999, 6, 0.01);
    beta2_ = dspin(0.0, 0.999999, 6, 0.001);
    epsilon_ = dspin(1e-12, 1.0, 10, 1e-7);
    amsgrad_ = new QCheckBox;
    weightDecay_ = dspin(0.0, 1.0, 6, 0.001);
    momentum_ = dspin(0.0, 0.999, 4, 0.05);
    nesterov_ = new QCheckBox;
    rho_ = dspin(0.0, 0.9999, 4, 0.01);
    centered_ = new QCheckBox;
    clipnorm_ = dspin(0.0, 1e6, 4, 0.1);
    clipnorm_->setSpecialValueText(tr("off"));
    clipnorm_->setToolTip(tr("Clip each gradient tensor to this L2 norm; 0 = off."));
    optForm_->addRow(tr("Optimizer"), optimizer_);
    optForm_->addRow(tr("Learning rate"), lr_);
    optForm_->addRow(tr("β₁ (beta_1)"), beta1_);
    optForm_->addRow(tr("β₂ (beta_2)"), beta2_);
    optForm_->addRow(tr("ε (epsilon)"), epsilon_);
    optForm_->addRow(tr("AMSGrad"), amsgrad_);
    optForm_->addRow(tr("Weight decay"), weightDecay_);
    optForm_->addRow(tr("Momentum"), momentum_);
    optForm_->addRow(tr("Nesterov"), nesterov_);
    optForm_->addRow(tr("ρ (rho)"), rho_);
    optForm_->addRow(tr("Centered"), centered_);
    optForm_->addRow(tr("Clip norm"), clipnorm_);

    schedule_ = new QComboBox;
    schedule_->setObjectName("schedule");
    schedule_->addItem(tr("constant"), "constant");
    schedule_->addItem(tr("exponential decay"), "exponential_decay");
    schedule_->addItem(tr("cosine decay"), "cosine_decay");
    decaySteps_ = ispin(1, INT32_MAX);
    decayRate_ = dspin(0.0001, 1.0, 4, 0.01);
    staircase_ = new QCheckBox;
    alpha_ = dspin(0.0, 1.0, 4, 0.01);
    warmupSteps_ = ispin(0, INT32_MAX);
    optForm_->addRow(tr("LR schedule"), schedule_);
    optForm_->addRow(tr("Decay steps"), decaySteps_);
    optForm_->addRow(tr("Decay rate"), decayRate_);
    optForm_->addRow(tr("Staircase"), staircase_);
    optForm_->addRow(tr("Alpha (floor)"), alpha_);
    optForm_->addRow(tr("Warmup steps"), warmupSteps_);
    schedForm_ = optForm_;

    connect(optimizer_, &QComboBox::activated, this, [this] {
        if (optimizer_->currentData() == "adamw" && weightDecay_->value() == 0.0)
            weightDecay_->setValue(0.004);  // Keras' AdamW default
        write();
    });
    connect(schedule_, &QComboBox::activated, this, &TrainingPanel::write);
    for (QDoubleSpinBox* s : {lr_, beta1_, beta2_, epsilon_, weightDecay_, momentum_, rho_,
                              clipnorm_, decayRate_, alpha_})
        connect(s, &QDoubleSpinBox::valueChanged, this, &TrainingPanel::write);
    for (QCheckBox* c : {amsgrad_, nesterov_, centered_, staircase_})
        connect(c, &QCheckBox::toggled, this, &TrainingPanel::write);
    for (QSpinBox* s : {decaySteps_, warmupSteps_})
        connect(s, &QSpinBox::valueChanged, this, &TrainingPanel::write);
    return box;
}

QWidget* TrainingPanel::buildLossAndMetrics() {
    auto* box = new QGroupBox(tr("Loss, metrics and schedule"));
    auto* form = new QFormLayout(box);
    loss_ = new QComboBox;
    loss_->setObjectName("loss");
    for (const char* l : {"sparse_categorical_crossentropy", "categorical_crossentropy",
                          "binary_crossentropy", "mean_squared_error"})
        loss_->addItem(l, l);
    fromLogits_ = new QCheckBox(tr("from logits"));
    fromLogits_->setToolTip(tr("Check when the last layer has no softmax/sigmoid."));
    auto* lossRow = new QHBoxLayout;
    lossRow->addWidget(loss_, 1);
    lossRow->addWidget(fromLogits_);
    form->addRow(tr("Loss"), lossRow);
    metrics_ = new QListWidget;
    metrics_->setMaximumHeight(90);
    form->addRow(tr("Metrics"), metrics_);
    epochs_ = ispin(1, 100000);
    epochs_->setObjectName("epochs");
    form->addRow(tr("Epochs"), epochs_);
    seed_ = ispin(0, INT32_MAX);
    seed_->setObjectName("seed");
    form->addRow(tr("Seed"), seed_);
    logEvery_ = ispin(1, 1000000);
    logEvery_->setToolTip(tr("Metrics are read back from the device every N steps."));
    form->addRow(tr("Log every (steps)"), logEvery_);
    evaluateTest_ = new QCheckBox(tr("evaluate on the test split after training"));
    form->addRow(QString(), evaluateTest_);
    connect(loss_, &QComboBox::activated, this, &TrainingPanel::write);
    connect(fromLogits_, &QCheckBox::toggled, this, &TrainingPanel::write);
    connect(metrics_, &QListWidget::itemChanged, this, &TrainingPanel::write);
    for (QSpinBox* s : {epochs_, seed_, logEvery_})
        connect(s, &QSpinBox::valueChanged, this, &TrainingPanel::write);
    connect(evaluateTest_, &QCheckBox::toggled, this, &TrainingPanel::write);
    return box;
}

QWidget* TrainingPanel::buildCallbacks() {
    auto* box = new QGroupBox(tr("Callbacks"));
    auto* form = new QFormLayout(box);
    earlyStop_ = new QCheckBox(tr("Early stopping"));
    earlyStop_->setObjectName("earlyStopping");
    esMonitor_ = new QComboBox;
    esMonitor_->setEditable(true);
    esMonitor_->addItems(kMonitors);
    esPatience_ = ispin(0, 10000);
    esMinDelta_ = dspin(0.0, 1e6, 6, 0.001);
    esRestore_ = new QCheckBox(tr("restore best weights"));
    form->addRow(earlyStop_);
    form->addRow(tr("  monitor"), esMonitor_);
    form->addRow(tr("  patience (epochs)"), esPatience_);
    form->addRow(tr("  min delta"), esMinDelta_);
    form->addRow(QString(), esRestore_);
    reduceLr_ = new QCheckBox(tr("Reduce LR on plateau"));
    reduceLr_->setObjectName("reduceLrOnPlateau");
    rlMonitor_ = new QComboBox;
    rlMonitor_->setEditable(true);
    rlMonitor_->addItems(kMonitors);
    rlFactor_ = dspin(0.001, 0.999, 3, 0.05);
    rlPatience_ = ispin(0, 10000);
    rlMinLr_ = dspin(0.0, 1.0, 8, 1e-6);
    form->addRow(reduceLr_);
    form->addRow(tr("  monitor"), rlMonitor_);
    form->addRow(tr("  factor"), rlFactor_);
    form->addRow(tr("  patience (epochs)"), rlPatience_);
    form->addRow(tr("  min LR"), rlMinLr_);
    terminateNan_ = new QCheckBox(tr("Terminate on NaN"));
    form->addRow(terminateNan_);
    for (QCheckBox* c : {earlyStop_, esRestore_, reduceLr_, terminateNan_})
        connect(c, &QCheckBox::toggled, this, &TrainingPanel::write);
    for (QComboBox* c : {esMonitor_, rlMonitor_})
        connect(c, &QComboBox::currentTextChanged, this, &TrainingPanel::write);
    for (QSpinBox* s : {esPatience_, rlPatience_})
        connect(s, &QSpinBox::valueChanged, this, &TrainingPanel::write);
    for (QDoubleSpinBox* s : {esMinDelta_, rlFactor_, rlMinLr_})
        connect(s, &QDoubleSpinBox::valueChanged, this, &TrainingPanel::write);
    return box;
}

QWidget* TrainingPanel::buildRuntime() {
    auto* host = new QWidget;
    auto* v = new QVBoxLayout(host);
    v->setContentsMargins(0, 0, 0, 0);

    auto* pbox = new QGroupBox(tr("Precision policy"));
    auto* pl = new QVBoxLayout(pbox);
    precision_ = new QButtonGroup(this);
    for (td::PrecisionPolicy p : {td::PrecisionPolicy::Float32, td::PrecisionPolicy::MixedFloat16,
                                  td::PrecisionPolicy::MixedBfloat16}) {
        auto* b = new QRadioButton(td::precisionName(p));
        b->setObjectName(QString("precision_") + td::precisionName(p));
        td::Capability cap = td::precisionCapability(p);
        // Where only this CPU lacks bf16 products but a GPU has them, the choice stays open for
        // runs on the GPUs (a run on the CPU is refused with the reason when it starts).
        const bool onGpus =
            !cap.available && p == td::PrecisionPolicy::MixedBfloat16 && td::bf16GpuPresent();
        if (onGpus)
            cap.reason =
                tr("on GPUs only here: %1").arg(QString::fromStdString(cap.reason)).toStdString();
        b->setEnabled(cap.available || onGpus);
        pl->addWidget(b);
        // Why an option is off, or what it costs on this machine's CPU (16-bit values
        // converted for each product: slower than float32 there), under the option itself.
        QString note = QString::fromStdString(cap.reason);
        if (cap.available)
            for (const std::string& n : td::precisionNotes(p)) {
                const std::string prefix = std::string(td::precisionName(p)) + ": ";
                note +=
                    QString::fromStdString(n.rfind(prefix, 0) == 0 ? n.substr(prefix.size()) : n);
            }
        if (!note.isEmpty()) {
            if (cap.available) note = tr("On this CPU: %1").arg(note);
            b->setToolTip(note);
            auto* why = new QLabel(note);
            why->setObjectName(QString("precisionNote_") + td::precisionName(p));
            why->setWordWrap(true);
            why->setStyleSheet("color: gray; margin-left: 22px;");
            pl->addWidget(why);
        }
        precision_->addButton(b, static_cast<int>(p));
        precisionButtons_[p] = b;
    }
    fusion_ = new QCheckBox(tr("Fusion (fuse element-wise ops into their producers)"));
    fusion_->setObjectName("fusion");
    pl->addWidget(fusion_);
    v->addWidget(pbox);

    auto* sbox = new QGroupBox(tr("Distribution strategy"));
    auto* sl = new QVBoxLayout(sbox);
    strategy_ = new QButtonGroup(this);
    const std::pair<QString, QString> strategies[] = {
        {"one_device", tr("One device")},
        {"mirrored", tr("Mirrored (all chosen local devices)")},
        {"multi_worker_mirrored", tr("MultiWorkerMirrored (several processes, MPI)")}};
    int id = 0;
    for (const auto& [type, label] : strategies) {
        auto* b = new QRadioButton(label);
        b->setObjectName("strategy_" + type);
        b->setProperty("strategyType", type);
        td::Capability cap = td::strategyCapability(type.toStdString());
        b->setEnabled(cap.available);
        sl->addWidget(b);
        if (!cap.available) {
            b->setToolTip(QString::fromStdString(cap.reason));
            auto* why = new QLabel(QString::fromStdString(cap.reason));
            why->setObjectName("strategyReason_" + type);
            why->setWordWrap(true);
            why->setStyleSheet("color: gray; margin-left: 22px;");
            sl->addWidget(why);
            strategyReasons_[type] = why;
        }
        strategy_->addButton(b, id++);
        strategyButtons_[type] = b;
    }
    sl->addWidget(new QLabel(tr("Detected devices:")));
    deviceList_ = new QListWidget;
    deviceList_->setObjectName("deviceList");
    deviceList_->setMaximumHeight(100);
    for (const td::DeviceInfo& d : devices_) {
        QString text = QString("%1 — %2 — %3")
                           .arg(QString::fromStdString(d.id), QString::fromStdString(d.name),
                                gib(d.memoryBytes));
        // GPUs: compute capability, free memory, and the CUDA versions of driver and runtime.
        QStringList gpu;
        if (!d.computeCapability.empty())
            gpu << tr("compute %1").arg(QString::fromStdString(d.computeCapability));
        if (d.memoryFreeBytes >= 0) gpu << tr("%1 free").arg(gib(d.memoryFreeBytes));
        if (!d.driverVersion.empty())
            gpu << tr("driver CUDA %1").arg(QString::fromStdString(d.driverVersion));
        if (!d.runtimeVersion.empty())
            gpu << tr("runtime CUDA %1").arg(QString::fromStdString(d.runtimeVersion));
        if (!gpu.isEmpty()) text += " (" + gpu.join(", ") + ")";
        auto* item = new QListWidgetItem(text);
        item->setData(Qt::UserRole, QString::fromStdString(d.id));
        item->setFlags(Qt::ItemIsEnabled | Qt::ItemIsUserCheckable);
        item->setCheckState(Qt::Checked);
        deviceList_->addItem(item);
    }
    if (devices_.empty()) deviceList_->addItem(tr("(no devices reported by the engine)"));
    sl->addWidget(deviceList_);
    strategyNote_ = new QLabel;
    strategyNote_->setObjectName("strategyNote");
    strategyNote_->setWordWrap(true);
    sl->addWidget(strategyNote_);

    // Mirrored: how many logical replicas the CPU is split into.
    mirroredOptions_ = new QWidget;
    mirroredOptions_->setObjectName("mirroredOptions");
    auto* mform = new QFormLayout(mirroredOptions_);
    mform->setContentsMargins(0, 0, 0, 0);
    replicas_ = ispin(0, 4096);
    replicas_->setObjectName("cpuReplicas");
    replicas_->setSpecialValueText(tr("auto"));
    replicas_->setToolTip(
        tr("Mirrored on CPUs: the number of logical CPU replicas (strategy.replicas); auto lets "
           "the engine choose."));
    mform->addRow(tr("CPU replicas"), replicas_);
    replicaNote_ = new QLabel;
    replicaNote_->setObjectName("replicaNote");
    replicaNote_->setWordWrap(true);
    replicaNote_->setStyleSheet("color: gray;");
    mform->addRow(QString(), replicaNote_);
    sl->addWidget(mirroredOptions_);

    // MultiWorkerMirrored: the timeout (a project field) and the command that launches it.
    multiWorkerOptions_ = new QWidget;
    multiWorkerOptions_->setObjectName("multiWorkerOptions");
    auto* wform = new QFormLayout(multiWorkerOptions_);
    wform->setContentsMargins(0, 0, 0, 0);
    timeout_ = dspin(0.01, 86400.0, 2, 10.0);
    timeout_->setObjectName("strategyTimeout");
    timeout_->setSuffix(tr(" s"));
    timeout_->setToolTip(
        tr("How long a worker waits for the others (start-up, each gradient all-reduce) before "
           "the run fails (strategy.timeout_seconds)."));
    wform->addRow(tr("Timeout"), timeout_);
    launcher_ = new QComboBox;
    launcher_->setObjectName("launcher");
    launcher_->addItem(tr("mpirun (Open MPI, MPICH)"), "mpirun");
    launcher_->addItem(tr("srun (Slurm)"), "srun");
    processes_ = ispin(1, 4096);
    processes_->setObjectName("processes");
    processes_->setValue(2);
    processes_->setToolTip(tr("Worker processes to launch (one per machine or per GPU)."));
    auto* launchRow = new QHBoxLayout;
    launchRow->addWidget(launcher_, 1);
    launchRow->addWidget(new QLabel(tr("processes")));
    launchRow->addWidget(processes_);
    wform->addRow(tr("Launch with"), launchRow);
    mwCommand_ = new QLineEdit;
    mwCommand_->setObjectName("multiWorkerCommand");
    mwCommand_->setReadOnly(true);
    auto* copy = new QToolButton;
    copy->setText(tr("Copy"));
    copy->setObjectName("copyCommand");
    copy->setToolTip(tr("Copy the command line to the clipboard"));
    connect(copy, &QToolButton::clicked, this,
            [this] { QApplication::clipboard()->setText(mwCommand_->text()); });
    auto* mwRow = new QHBoxLayout;
    mwRow->addWidget(mwCommand_, 1);
    mwRow->addWidget(copy);
    wform->addRow(tr("Command"), mwRow);
    mwSaveNote_ = new QLabel;
    mwSaveNote_->setObjectName("multiWorkerSaveNote");
    mwSaveNote_->setWordWrap(true);
    mwSaveNote_->setStyleSheet("color: #b00020;");
    wform->addRow(QString(), mwSaveNote_);
    sl->addWidget(multiWorkerOptions_);
    v->addWidget(sbox);

    connect(precision_, &QButtonGroup::idClicked, this, &TrainingPanel::write);
    connect(fusion_, &QCheckBox::toggled, this, &TrainingPanel::write);
    connect(strategy_, &QButtonGroup::idClicked, this, &TrainingPanel::write);
    connect(deviceList_, &QListWidget::itemChanged, this, &TrainingPanel::write);
    connect(replicas_, &QSpinBox::valueChanged, this, &TrainingPanel::write);
    connect(timeout_, &QDoubleSpinBox::valueChanged, this, &TrainingPanel::write);
    connect(launcher_, &QComboBox::currentIndexChanged, this, &TrainingPanel::updateStrategyNotes);
    connect(processes_, &QSpinBox::valueChanged, this, &TrainingPanel::updateStrategyNotes);
    return host;
}

QRadioButton* TrainingPanel::precisionButton(td::PrecisionPolicy p) const {
    return precisionButtons_.at(p);
}

QRadioButton* TrainingPanel::strategyButton(const QString& type) const {
    auto it = strategyButtons_.find(type);
    return it == strategyButtons_.end() ? nullptr : it->second;
}

QLabel* TrainingPanel::strategyReason(const QString& type) const {
    auto it = strategyReasons_.find(type);
    return it == strategyReasons_.end() ? nullptr : it->second;
}

void TrainingPanel::setDatabasePath(const QString& path) {
    dbPath_ = path;
    updateStrategyNotes();
}

QString TrainingPanel::multiWorkerCommand() const {
    const QString project = project_->path().isEmpty() ? QString("PROJECT.json") : project_->path();
    const QString db = dbPath_.isEmpty() ? QString("runs.db") : dbPath_;
    const QString launch = launcher_->currentData().toString() == "srun"
                               ? QString("srun --ntasks=%1").arg(processes_->value())
                               : QString("mpirun -np %1").arg(processes_->value());
    return QString("%1 traindeck train --db \"%2\" \"%3\"").arg(launch, db, project);
}

QString TrainingPanel::replicaNote() const {
    return replicaNote_->text();
}

// The texts that follow the project (batch size, replicas, its file) and the launcher choice.
void TrainingPanel::updateStrategyNotes() {
    const td::Project& p = project_->project();
    const int64_t batch = p.training.batchSize;
    const int replicas = replicas_->value();
    if (replicas <= 0) {
        replicaNote_->setText(
            tr("auto: the engine picks the replica count; each global batch of %1 is split "
               "between the replicas.")
                .arg(batch));
    } else if (batch % replicas == 0) {
        replicaNote_->setText(tr("%1 replicas × %2 samples = the global batch of %3.")
                                  .arg(replicas)
                                  .arg(batch / replicas)
                                  .arg(batch));
    } else {
        replicaNote_->setText(tr("%1 replicas share each global batch of %2: slices of %3 or %4 "
                                 "samples.")
                                  .arg(replicas)
                                  .arg(batch)
                                  .arg(batch / replicas)
                                  .arg(batch / replicas + 1));
    }
    mwCommand_->setText(multiWorkerCommand());
    mwSaveNote_->setText(project_->path().isEmpty()
                             ? tr("Save the project first: every worker reads it from its file.")
                         : project_->isDirty()
                             ? tr("Save the project: the workers read the file, not these edits.")
                             : QString());
    mwSaveNote_->setVisible(!mwSaveNote_->text().isEmpty());
}

void TrainingPanel::reload() {
    loading_ = true;
    const td::Project& p = project_->project();
    const td::TrainConfig& t = p.training;
    const td::OptimizerConfig& o = t.optimizer;
    optimizer_->setCurrentIndex(std::max(0, optimizer_->findData(QString::fromStdString(o.name))));
    lr_->setValue(o.learningRate);
    beta1_->setValue(o.beta1);
    beta2_->setValue(o.beta2);
    epsilon_->setValue(o.epsilon);
    amsgrad_->setChecked(o.amsgrad);
    weightDecay_->setValue(o.weightDecay);
    momentum_->setValue(o.momentum);
    nesterov_->setChecked(o.nesterov);
    rho_->setValue(o.rho);
    centered_->setChecked(o.centered);
    clipnorm_->setValue(o.clipnorm.value_or(0.0));
    schedule_->setCurrentIndex(
        std::max(0, schedule_->findData(QString::fromStdString(o.schedule.type))));
    decaySteps_->setValue(static_cast<int>(o.schedule.decaySteps));
    decayRate_->setValue(o.schedule.decayRate);
    staircase_->setChecked(o.schedule.staircase);
    alpha_->setValue(o.schedule.alpha);
    warmupSteps_->setValue(static_cast<int>(o.schedule.warmupSteps));

    loss_->setCurrentIndex(std::max(0, loss_->findData(QString::fromStdString(t.loss.name))));
    fromLogits_->setChecked(t.loss.fromLogits);
    metrics_->clear();
    QStringList names = kMetrics;
    for (const auto& m : t.metrics)
        if (!names.contains(QString::fromStdString(m))) names << QString::fromStdString(m);
    for (const QString& n : names) {
        auto* item = new QListWidgetItem(n);
        item->setFlags(Qt::ItemIsEnabled | Qt::ItemIsUserCheckable);
        bool on = std::find(t.metrics.begin(), t.metrics.end(), n.toStdString()) != t.metrics.end();
        item->setCheckState(on ? Qt::Checked : Qt::Unchecked);
        metrics_->addItem(item);
    }
    epochs_->setValue(t.epochs);
    seed_->setValue(static_cast<int>(std::min<uint64_t>(t.seed, INT32_MAX)));
    logEvery_->setValue(static_cast<int>(t.logEverySteps));
    evaluateTest_->setChecked(t.evaluateTest);

    const td::CallbackConfig* es = findCallback(t, "early_stopping");
    earlyStop_->setChecked(es != nullptr);
    td::CallbackConfig esDefaults;
    esDefaults.patience = 3;
    if (!es) es = &esDefaults;
    esMonitor_->setCurrentText(QString::fromStdString(es->monitor));
    esPatience_->setValue(es->patience);
    esMinDelta_->setValue(es->minDelta);
    esRestore_->setChecked(es->restoreBestWeights);
    const td::CallbackConfig* rl = findCallback(t, "reduce_lr_on_plateau");
    reduceLr_->setChecked(rl != nullptr);
    td::CallbackConfig rlDefaults;
    rlDefaults.patience = 2;
    if (!rl) rl = &rlDefaults;
    rlMonitor_->setCurrentText(QString::fromStdString(rl->monitor));
    rlFactor_->setValue(rl->factor);
    rlPatience_->setValue(rl->patience);
    rlMinLr_->setValue(rl->minLr);
    terminateNan_->setChecked(findCallback(t, "terminate_on_nan") != nullptr);

    precisionButtons_[p.precision]->setChecked(true);
    fusion_->setChecked(p.fusion);
    if (QRadioButton* b = strategyButton(QString::fromStdString(p.strategy.type)))
        b->setChecked(true);
    for (int i = 0; i < deviceList_->count(); ++i) {
        QListWidgetItem* item = deviceList_->item(i);
        if (!(item->flags() & Qt::ItemIsUserCheckable)) continue;
        const std::string id = item->data(Qt::UserRole).toString().toStdString();
        const auto& ds = p.strategy.devices;
        bool on = ds.empty() || std::find(ds.begin(), ds.end(), id) != ds.end();
        item->setCheckState(on ? Qt::Checked : Qt::Unchecked);
    }
    replicas_->setValue(p.strategy.replicas);
    timeout_->setValue(p.strategy.timeoutSeconds);
    loading_ = false;
    updateVisibility();
}

void TrainingPanel::updateVisibility() {
    const QString o = optimizer_->currentData().toString();
    const bool adam = o == "adam" || o == "adamw";
    setRowVisible(optForm_, beta1_, adam);
    setRowVisible(optForm_, beta2_, adam);
    setRowVisible(optForm_, amsgrad_, adam);
    setRowVisible(optForm_, weightDecay_, o == "adamw");
    setRowVisible(optForm_, momentum_, o == "sgd" || o == "rmsprop");
    setRowVisible(optForm_, nesterov_, o == "sgd");
    setRowVisible(optForm_, rho_, o == "rmsprop");
    setRowVisible(optForm_, centered_, o == "rmsprop");
    setRowVisible(optForm_, epsilon_, o != "sgd");
    const QString s = schedule_->currentData().toString();
    setRowVisible(schedForm_, decaySteps_, s != "constant");
    setRowVisible(schedForm_, decayRate_, s == "exponential_decay");
    setRowVisible(schedForm_, staircase_, s == "exponential_decay");
    setRowVisible(schedForm_, alpha_, s == "cosine_decay");
    setRowVisible(schedForm_, warmupSteps_, s == "cosine_decay");
    for (QWidget* w : {static_cast<QWidget*>(esMonitor_), static_cast<QWidget*>(esPatience_),
                       static_cast<QWidget*>(esMinDelta_), static_cast<QWidget*>(esRestore_)})
        w->setEnabled(earlyStop_->isChecked());
    for (QWidget* w : {static_cast<QWidget*>(rlMonitor_), static_cast<QWidget*>(rlFactor_),
                       static_cast<QWidget*>(rlPatience_), static_cast<QWidget*>(rlMinLr_)})
        w->setEnabled(reduceLr_->isChecked());
    QAbstractButton* sb = strategy_->checkedButton();
    const QString type = sb ? sb->property("strategyType").toString() : QString("one_device");
    mirroredOptions_->setVisible(type == "mirrored");
    multiWorkerOptions_->setVisible(type == "multi_worker_mirrored");
    strategyNote_->setText(
        type == "multi_worker_mirrored"
            ? tr("MultiWorkerMirrored runs as several headless processes that train one model "
                 "together; launch them with the command below. Each uses its checked devices.")
        : type == "mirrored"
            ? tr("Each checked device is one replica (the CPU as several logical replicas); the "
                 "global batch is split between them and their gradients are summed.")
            : tr("Trains on the first checked device."));
    updateStrategyNotes();
}

void TrainingPanel::write() {
    if (loading_) return;
    updateVisibility();
    project_->edit(
        [&](td::Project& p) {
            td::TrainConfig& t = p.training;
            td::OptimizerConfig& o = t.optimizer;
            o.name = optimizer_->currentData().toString().toStdString();
            o.learningRate = lr_->value();
            o.beta1 = beta1_->value();
            o.beta2 = beta2_->value();
            o.epsilon = epsilon_->value();
            o.amsgrad = amsgrad_->isChecked();
            o.weightDecay = weightDecay_->value();
            o.momentum = momentum_->value();
            o.nesterov = nesterov_->isChecked();
            o.rho = rho_->value();
            o.centered = centered_->isChecked();
            if (clipnorm_->value() > 0) {
                o.clipnorm = clipnorm_->value();
            } else {
                o.clipnorm.reset();
            }
            o.schedule.type = schedule_->currentData().toString().toStdString();
            o.schedule.decaySteps = decaySteps_->value();
            o.schedule.decayRate = decayRate_->value();
            o.schedule.staircase = staircase_->isChecked();
            o.schedule.alpha = alpha_->value();
            o.schedule.warmupSteps = warmupSteps_->value();

            t.loss.name = loss_->currentData().toString().toStdString();
            t.loss.fromLogits = fromLogits_->isChecked();
            // Keep the project's metric order; append newly checked ones.
            std::vector<std::string> checked;
            for (int i = 0; i < metrics_->count(); ++i)
                if (metrics_->item(i)->checkState() == Qt::Checked)
                    checked.push_back(metrics_->item(i)->text().toStdString());
            std::vector<std::string> metrics;
            for (const auto& m : t.metrics)
                if (std::find(checked.begin(), checked.end(), m) != checked.end())
                    metrics.push_back(m);
            for (const auto& m : checked)
                if (std::find(metrics.begin(), metrics.end(), m) == metrics.end())
                    metrics.push_back(m);
            t.metrics = metrics;
            t.epochs = epochs_->value();
            t.seed = static_cast<uint64_t>(seed_->value());
            t.logEverySteps = logEvery_->value();
            t.evaluateTest = evaluateTest_->isChecked();

            auto setCallback = [&](const std::string& type, bool on,
                                   const std::function<void(td::CallbackConfig&)>& fill) {
                td::CallbackConfig* c = findCallback(t, type);
                if (!on) {
                    std::erase_if(t.callbacks,
                                  [&](const td::CallbackConfig& x) { return x.type == type; });
                    return;
                }
                if (!c) {
                    td::CallbackConfig fresh;
                    fresh.type = type;
                    t.callbacks.push_back(fresh);
                    c = &t.callbacks.back();
                }
                fill(*c);
            };
            setCallback("early_stopping", earlyStop_->isChecked(), [&](td::CallbackConfig& c) {
                c.monitor = esMonitor_->currentText().toStdString();
                c.patience = esPatience_->value();
                c.minDelta = esMinDelta_->value();
                c.restoreBestWeights = esRestore_->isChecked();
            });
            setCallback("reduce_lr_on_plateau", reduceLr_->isChecked(), [&](td::CallbackConfig& c) {
                c.monitor = rlMonitor_->currentText().toStdString();
                c.factor = rlFactor_->value();
                c.patience = rlPatience_->value();
                c.minLr = rlMinLr_->value();
            });
            setCallback("terminate_on_nan", terminateNan_->isChecked(), [](td::CallbackConfig&) {});

            p.precision = static_cast<td::PrecisionPolicy>(std::max(0, precision_->checkedId()));
            p.fusion = fusion_->isChecked();
            QAbstractButton* sb = strategy_->checkedButton();
            p.strategy.type = sb ? sb->property("strategyType").toString().toStdString()
                                 : std::string("one_device");
            std::vector<std::string> chosen;
            int checkable = 0;
            for (int i = 0; i < deviceList_->count(); ++i) {
                QListWidgetItem* item = deviceList_->item(i);
                if (!(item->flags() & Qt::ItemIsUserCheckable)) continue;
                ++checkable;
                if (item->checkState() == Qt::Checked)
                    chosen.push_back(item->data(Qt::UserRole).toString().toStdString());
            }
            // All devices checked means "default / all detected", the schema's empty list.
            if (static_cast<int>(chosen.size()) == checkable) chosen.clear();
            // One device takes one replica on at most one device: the Mirrored settings (hidden
            // in that mode) stay in their controls for a switch back, not in the project, which
            // would otherwise refuse to start for a reason the user cannot see.
            const bool one = p.strategy.type == "one_device";
            if (one && chosen.size() > 1) chosen.resize(1);
            p.strategy.devices = chosen;
            p.strategy.replicas = one ? 0 : replicas_->value();
            // The spin box shows two decimals: keep a finer value from the file unless edited.
            if (timeout_->value() != QString::number(p.strategy.timeoutSeconds, 'f', 2).toDouble())
                p.strategy.timeoutSeconds = timeout_->value();
        },
        this);
}

}  // namespace td::ui
