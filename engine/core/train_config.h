// Training configuration: optimizer, schedule, loss, metrics, callbacks (Keras names and defaults).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace td {

struct ScheduleConfig {
    // "constant", "exponential_decay", "cosine_decay" (with optional warmup)
    std::string type = "constant";
    int64_t decaySteps = 1000;
    double decayRate = 0.96;  // exponential_decay
    bool staircase = false;   // exponential_decay
    double alpha = 0.0;       // cosine_decay: floor as a fraction of the initial rate
    int64_t warmupSteps = 0;  // cosine_decay: linear warmup from initial rate to warmupTarget
    std::optional<double> warmupTarget;
};

struct OptimizerConfig {
    std::string name = "adam";  // "sgd", "adam", "adamw", "rmsprop"
    double learningRate = 0.001;
    ScheduleConfig schedule;
    // Adam / AdamW
    double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-7;
    bool amsgrad = false;
    double weightDecay = 0.0;  // AdamW default 0.004 (set by the parser when name is adamw)
    // SGD
    double momentum = 0.0;
    bool nesterov = false;
    // RMSprop
    double rho = 0.9;
    bool centered = false;
    // Clipping
    std::optional<double> clipnorm, globalClipnorm, clipvalue;
};

struct LossConfig {
    // "sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy",
    // "mean_squared_error"
    std::string name = "sparse_categorical_crossentropy";
    bool fromLogits = false;
};

struct CallbackConfig {
    std::string type;  // "early_stopping", "reduce_lr_on_plateau", "terminate_on_nan"
    std::string monitor = "val_loss";
    std::string mode = "auto";  // "min", "max", "auto"
    double minDelta = 0.0;
    int patience = 0;
    bool restoreBestWeights = false;  // early_stopping
    int startFromEpoch = 0;           // early_stopping
    double factor = 0.1;              // reduce_lr_on_plateau
    int cooldown = 0;
    double minLr = 0.0;
    // model_checkpoint and backup_and_restore: where the files go (model_checkpoint: empty = the
    // run's checkpoint folder next to the store; backup_and_restore: backup_dir, required), and
    // how often: every epoch (0) or every N global steps.
    std::string directory;
    int64_t saveFreqSteps = 0;
    bool saveBestOnly = false;     // model_checkpoint: keep the best by monitor/mode
    int keepLast = 1;              // model_checkpoint without save_best_only: files kept
    bool deleteCheckpoint = true;  // backup_and_restore: delete the backup when the run completes
};

struct TrainConfig {
    int epochs = 1;
    int initialEpoch = 0;
    int64_t batchSize = 32;
    uint64_t seed = 0;
    OptimizerConfig optimizer;
    LossConfig loss;
    std::vector<std::string> metrics{"accuracy"};  // "accuracy", "sparse_categorical_accuracy",
                                                   // "categorical_accuracy", "binary_accuracy",
                                                   // "top_k" / "top5" ...
    std::vector<CallbackConfig> callbacks;
    int64_t logEverySteps = 20;  // metrics read back to the host every N steps
    bool evaluateTest = true;    // evaluate on the source's test split after fit
    // Every stored run keeps its last checkpoints (written at each epoch's end and when the run
    // ends) in <store folder>/checkpoints/run-<id>/, so it can be resumed or exported.
    bool runCheckpoints = true;
};

}  // namespace td
