#include "engine/train/run_setup.h"

#include <sstream>

#include "engine/distribute/mpi_world.h"
#include "engine/io/keras_archive.h"
#include "engine/train/optimizer.h"

namespace td {

bool isCheckpointCallback(const CallbackConfig& c) {
    return c.type == "model_checkpoint" || c.type == "backup_and_restore";
}

Result<RunSetup> prepareRun(Project& p, const RunSetupOptions& opt) {
    RunSetup out;
    TrainerSetup& ts = out.trainer;
    TD_ASSIGN_OR_RETURN(ts.info, inferShapes(p.model));
    TD_RETURN_IF_ERROR(checkProjectResources(p, ts.info));
    if (!opt.initialParams.empty()) {
        ts.initialParams = opt.initialParams;
    } else if (!p.initialWeights.empty()) {
        auto w = loadWeightsFor(p.model, p.initialWeights);
        if (!w.ok()) return err("initial_weights: " + w.error());
        ts.initialParams = std::move(w).value();
    }
    TD_ASSIGN_OR_RETURN(ts.labelSpec, labelSpecFor(p.training.loss, ts.info.outputShape));
    TD_ASSIGN_OR_RETURN(ts.metrics, resolveMetrics(p.training.metrics, p.training.loss));
    for (size_t i = 0; i < p.training.callbacks.size(); ++i) {
        const CallbackConfig& c = p.training.callbacks[i];
        if (isCheckpointCallback(c)) {
            // Written by the trainer (it owns the state they save), not a Callback object.
            if (c.type == "model_checkpoint" && c.directory.empty() && !opt.stored)
                return err("training.callbacks[" + std::to_string(i) +
                           "].config.directory: needed when the run is not stored (without a "
                           "run store there is no run checkpoint folder)");
            continue;
        }
        auto cb = Callback::create(p.training.callbacks[i]);
        if (!cb.ok()) return err("training.callbacks: " + cb.error());
        ts.callbacks.push_back(std::move(cb).value());
        ts.callbackNames.push_back("training.callbacks[" + std::to_string(i) + "] (" +
                                   p.training.callbacks[i].type + ")");
    }
    for (size_t i = 0; i < opt.callbacks.size(); ++i) {
        if (!opt.callbacks[i]) return err("callbacks[" + std::to_string(i) + "]: null callback");
        ts.callbacks.push_back(opt.callbacks[i]);
        ts.callbackNames.push_back("callback " + std::to_string(i) + " of the session");
    }
    {
        auto opt0 = Optimizer::create(p.training.optimizer);
        if (!opt0.ok()) return err("training." + opt0.error());
    }

    // Image and record sources are decoded into memory when the pipeline caches in memory (the
    // cache would hold them decoded anyway, and a load decodes on every core), and are otherwise
    // streamed: decoded by the pipeline's map workers each epoch, or once into a file cache. A
    // cache before the "decode" step keeps the encoded files or records: streamed, decoded each
    // epoch.
    auto data = loadSource(p.data.source, /*stream=*/p.data.pipeline.cache != "memory" ||
                                              cachesEncoded(p.data.pipeline));
    if (!data.ok()) {
        std::string e = data.error().rfind("data.source", 0) == 0 ? data.error()
                                                                  : "data.source: " + data.error();
        // Decoded for a memory cache that does not fit: streaming would.
        if (p.data.pipeline.cache == "memory" && !cachesEncoded(p.data.pipeline) &&
            (p.data.source.type == "image_directory" || p.data.source.type == "tfrecord") &&
            e.find("over the budget") != std::string::npos)
            e += "; with data.pipeline.cache \"none\" or \"file:<path>\" the samples are "
                 "decoded as batches need them instead; with [{\"op\": \"cache\"}, "
                 "{\"op\": \"decode\"}, ...] as data.pipeline.map the memory cache keeps the "
                 "encoded files or records (decoded each epoch)";
        return err(e);
    }
    out.splits = std::move(data).value();
    if (out.splits.validation) {
        if (p.data.validationData == "test" || p.data.validationSplit > 0)
            return err(std::string("data.") +
                       (p.data.validationSplit > 0 ? "validation_split" : "validation_data") +
                       ": the source already gives a validation subset "
                       "(data.source.validation_split); use one of the two");
        ts.trainSet = out.splits.train;
        ts.valSet = *out.splits.validation;
    } else if (p.data.validationData == "test") {
        if (!out.splits.test)
            return err("data.validation_data: \"test\" needs a source with a test split");
        ts.trainSet = out.splits.train;
        ts.valSet = *out.splits.test;
    } else if (p.data.validationSplit > 0) {
        auto [tr, va] = splitTail(out.splits.train, p.data.validationSplit);
        // Keras refuses a split that leaves either side empty; skipping validation silently
        // would hide that the monitored val_* metrics never exist.
        if (tr.size() == 0 || va.size() == 0) {
            std::ostringstream split;
            split << p.data.validationSplit;
            return err(
                "data.validation_split: " + split.str() + " of " +
                std::to_string(out.splits.train.size()) + " training samples leaves " +
                std::to_string(tr.size()) + " for training and " + std::to_string(va.size()) +
                " for validation (the split is at int(samples * (1 - validation_split)))"
                "; expected at least one sample on each side: use " +
                (va.size() == 0 ? "a larger" : "a smaller") + " validation_split or more data");
        }
        ts.trainSet = tr;
        ts.valSet = va;
    } else {
        ts.trainSet = out.splits.train;
    }
    const Shape sample = ts.trainSet.sampleShape();
    if (numElements(sample) != numElements(ts.info.inputShape))
        return err("the model's input shape " + shapeToString(ts.info.inputShape) +
                   " does not match the data's samples " + shapeToString(sample) + " (" +
                   std::to_string(numElements(sample)) + " values)");
    if (ts.labelSpec.dtype == DType::I32)
        TD_RETURN_IF_ERROR(checkLabelsFit(p.data.source, out.splits, ts.info.outputShape[0]));
    if (p.strategy.type == "multi_worker_mirrored" && detectMpiLaunch().launched) {
        // One process per worker, started by mpirun or srun. Without a launch, the strategy runs
        // as one worker with its local replicas (as tf.distribute does without a cluster).
        auto world = mpiWorld();
        if (!world.ok()) return err("strategy.type: multi_worker_mirrored: " + world.error());
        auto group = MpiCollectives::create(*world.value(), p.strategy.timeoutSeconds);
        if (!group.ok()) return err("strategy.type: multi_worker_mirrored: " + group.error());
        out.workers = std::move(group).value();
        ts.workers = out.workers.get();
        // The launcher ends the job with SIGTERM when a worker dies: the run ends failed.
        ts.interrupted = [] {
            const int sig = mpiTerminationSignal();
            return sig ? "the launcher is ending the job (" + signalName(sig) +
                             "; a worker exited or was killed)"
                       : std::string();
        };
    }
    ts.project = p;
    ts.openDevice = opt.openDevice;
    return out;
}

}  // namespace td
