// The run's plain settings beside the model, data and training (core/train_config.h,
// core/data_config.h): the precision policy and the distribution strategy, as a project file
// holds them (io/project.h parses and writes them).
#pragma once

#include <string>
#include <vector>

namespace td {

enum class PrecisionPolicy { Float32, MixedFloat16, MixedBfloat16 };
// "float32", "mixed_float16", "mixed_bfloat16"
const char* precisionName(PrecisionPolicy p);

struct StrategyConfig {
    std::string type = "one_device";   // "one_device", "mirrored", "multi_worker_mirrored"
    std::vector<std::string> devices;  // e.g. {"cpu:0"}; empty = default / all detected
    // Mirrored on CPU: logical CPU replicas; with GPUs listed: replicas spread evenly over them
    // (0: one per GPU).
    int replicas = 0;
    // A collective that waits longer than this fails, naming the replica or worker that did not
    // arrive (a worker that died or hangs).
    double timeoutSeconds = 60;
    // multi_worker_mirrored: how the data is divided among workers (tf.data's auto-shard
    // policies): "data" (every worker reads everything and keeps its share of each global
    // batch), "off" (every worker reads everything in its own order), "auto" (= "data" for the
    // in-memory sources TrainDeck reads).
    std::string shardPolicy = "auto";
};

}  // namespace td
