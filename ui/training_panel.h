// Training panel: optimizer and its parameters, learning-rate schedule, loss, metrics, epochs,
// seed, callbacks, precision policy, fusion and distribution strategy (Mirrored: the devices and
// the CPU replica count; MultiWorkerMirrored: the timeout and the mpirun / srun command line that
// launches its processes). Options this machine cannot run are shown disabled with the engine's
// reason (precisionCapability / strategyCapability).
#pragma once

#include <QWidget>
#include <map>

#include "engine/api/session.h"

class QButtonGroup;
class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QFormLayout;
class QLabel;
class QLineEdit;
class QListWidget;
class QRadioButton;
class QSpinBox;

namespace td::ui {

class ProjectController;

class TrainingPanel : public QWidget {
    Q_OBJECT
  public:
    explicit TrainingPanel(ProjectController* project, QWidget* parent = nullptr);

    void setDatabasePath(const QString& path);  // for the MultiWorker command line
    QRadioButton* precisionButton(td::PrecisionPolicy p) const;
    QRadioButton* strategyButton(const QString& type) const;
    // The engine's reason under a strategy it cannot run here (null when it can).
    QLabel* strategyReason(const QString& type) const;
    QSpinBox* replicasSpin() const { return replicas_; }
    QDoubleSpinBox* timeoutSpin() const { return timeout_; }
    QComboBox* launcherCombo() const { return launcher_; }
    QSpinBox* processesSpin() const { return processes_; }
    QWidget* mirroredOptions() const { return mirroredOptions_; }
    QWidget* multiWorkerOptions() const { return multiWorkerOptions_; }
    // The command that launches the project's MultiWorkerMirrored processes with the chosen
    // launcher (mpirun or srun) and process count.
    QString multiWorkerCommand() const;
    QString replicaNote() const;

  private:
    QWidget* buildOptimizer();
    QWidget* buildLossAndMetrics();
    QWidget* buildCallbacks();
    QWidget* buildRuntime();
    void reload();
    void write();
    void updateVisibility();
    void updateStrategyNotes();

    ProjectController* project_;
    bool loading_ = false;
    QString dbPath_;
    std::vector<td::DeviceInfo> devices_;

    QComboBox* optimizer_;
    QDoubleSpinBox* lr_;
    QFormLayout* optForm_;
    QDoubleSpinBox* beta1_;
    QDoubleSpinBox* beta2_;
    QDoubleSpinBox* epsilon_;
    QCheckBox* amsgrad_;
    QDoubleSpinBox* weightDecay_;
    QDoubleSpinBox* momentum_;
    QCheckBox* nesterov_;
    QDoubleSpinBox* rho_;
    QCheckBox* centered_;
    QDoubleSpinBox* clipnorm_;
    QComboBox* schedule_;
    QFormLayout* schedForm_;
    QSpinBox* decaySteps_;
    QDoubleSpinBox* decayRate_;
    QCheckBox* staircase_;
    QDoubleSpinBox* alpha_;
    QSpinBox* warmupSteps_;

    QComboBox* loss_;
    QCheckBox* fromLogits_;
    QListWidget* metrics_;
    QSpinBox* epochs_;
    QSpinBox* seed_;
    QSpinBox* logEvery_;
    QCheckBox* evaluateTest_;

    QCheckBox* earlyStop_;
    QComboBox* esMonitor_;
    QSpinBox* esPatience_;
    QDoubleSpinBox* esMinDelta_;
    QCheckBox* esRestore_;
    QCheckBox* reduceLr_;
    QComboBox* rlMonitor_;
    QDoubleSpinBox* rlFactor_;
    QSpinBox* rlPatience_;
    QDoubleSpinBox* rlMinLr_;
    QCheckBox* terminateNan_;

    QButtonGroup* precision_;
    std::map<td::PrecisionPolicy, QRadioButton*> precisionButtons_;
    QCheckBox* fusion_;
    QButtonGroup* strategy_;
    std::map<QString, QRadioButton*> strategyButtons_;
    std::map<QString, QLabel*> strategyReasons_;
    QListWidget* deviceList_;
    QWidget* mirroredOptions_;
    QSpinBox* replicas_;
    QLabel* replicaNote_;
    QWidget* multiWorkerOptions_;
    QDoubleSpinBox* timeout_;
    QComboBox* launcher_;
    QSpinBox* processes_;
    QLineEdit* mwCommand_;
    QLabel* mwSaveNote_;
    QLabel* strategyNote_;
};

}  // namespace td::ui
