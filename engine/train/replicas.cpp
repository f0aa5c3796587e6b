// The strategy's replicas: one device each, its thread (every replica but the first), the
// collectives between them, which rows of a batch each takes, and the sums read back from them.
// OneDevice is one replica on the engine thread; Mirrored is N local replicas (GPUs, or N logical
// CPU replicas with a share of the cores each); MultiWorkerMirrored adds the processes of an MPI
// launch (TrainerSetup::workers).
#include <algorithm>

#include "engine/backend/device_collectives.h"
#include "engine/train/trainer_impl.h"

namespace td {

// Threads per step: forking a team costs a few microseconds per kernel and a barrier stalls
// whenever another process holds a core. Measured on a 2-core AVX-512 machine, the seed MLP
// trains faster on one thread at batch 32 (20 MFLOP per step) and batch 256 (156 MFLOP), breaks
// even at batch 1024 (625 MFLOP), and the 784-1024-1024-10 MLP at batch 256 (2.9 GFLOP) gains 1.5x
// from two threads. So steps under 512 MFLOP run on one thread. A step's multiply-adds: each
// weight of a layer once per output position in the forward pass (one position for Dense on a
// vector, H x W for Conv2D), and twice that backward.
int chooseWorkerThreads(const ModelInfo& info, int64_t batch, int deviceThreads) {
    double flops = 0;
    for (const LayerInfo& l : info.layers) {
        double positions = 1;
        for (size_t d = 0; d + 1 < l.outputShape.size(); ++d)
            positions *= static_cast<double>(l.outputShape[d]);
        flops += 6.0 * static_cast<double>(batch) * static_cast<double>(l.params) * positions;
    }
    return flops < 512e6 ? 1 : deviceThreads;
}

Trainer::Impl::~Impl() {
    for (auto& r : replicas)
        if (r->thread.joinable()) {
            r->quit = true;
            wake(*r);
            r->thread.join();
        }
    for (auto& r : replicas) {
        if (!r->device) continue;
        Device& d = *r->device;
        for (auto& [key, p] : r->programs) {
            p->exe.reset();
            if (p->input.ptr) d.release(p->input);
            if (p->label.ptr) d.release(p->label);
        }
        for (Buffer& b : r->params) d.release(b);
        for (Buffer& b : r->shadows)
            if (b.ptr) d.release(b);
        if (r->lossScale.ptr) d.release(r->lossScale);
        if (r->flatGrads.ptr) d.release(r->flatGrads);
        for (Buffer& b : r->slots) d.release(b);
        (void)d.synchronize();
        for (Buffer& b : r->staging)
            if (b.ptr) d.releaseHost(b);
        if (r->trainAccum.ptr) d.release(r->trainAccum);
        if (r->evalAccum.ptr) d.release(r->evalAccum);
    }
}

// Breaks the replica group (and the GPUs' NCCL communicators, which would otherwise keep a
// stream waiting for a peer that never joins): every replica's collectives fail from now.
void Trainer::Impl::abortGroup(const std::string& why) {
    if (group) group->abort(why);
    for (auto& r : replicas)
        if (r->deviceCollectives) r->deviceCollectives->abort(why);
}

void Trainer::Impl::replicaLoop(Replica* r) {
    uint64_t done = 0;
    for (;;) {
        await(*r, [&] { return r->posted.load(std::memory_order_acquire) > done || r->quit; });
        if (r->quit) return;
        ++done;
        Status st = r->job(r->jobFn, *r);
        // A replica that fails breaks the group so that no other waits for it.
        if (!st.ok()) abortGroup(st.error());
        r->jobResult = std::move(st);
        r->finished.store(done, std::memory_order_release);
        wake(*r);
    }
}

Status Trainer::Impl::resolveStrategy(std::vector<std::string>& localDevices, int& threadsEach) {
    const StrategyConfig& st = s.project.strategy;
    const DeviceDesc cpu = cpuDeviceDesc();
    threadsEach = 0;
    if (s.workers) {
        workerRank = s.workers->rank();
        workerCount = s.workers->size();
    }
    if (st.type == "one_device") {
        localDevices = {st.devices.empty() ? std::string("cpu:0") : st.devices[0]};
    } else {
        std::vector<std::string> gpus, cpus;
        for (const std::string& d : st.devices) (d.rfind("cpu", 0) == 0 ? cpus : gpus).push_back(d);
        if (!gpus.empty() && !cpus.empty())
            return err(
                "strategy.devices: mix CPU and GPU replicas in one strategy is not "
                "supported (got " +
                cpus[0] + " and " + gpus[0] + ")");
        if (!gpus.empty()) {
            // One replica per listed GPU, or `replicas` of them spread evenly over the GPUs in
            // blocks (two on one GPU: the multi-replica paths on a machine with one).
            const int n = st.replicas > 0 ? st.replicas : static_cast<int>(gpus.size());
            if (n % static_cast<int>(gpus.size()) != 0)
                return err("strategy.replicas: " + std::to_string(n) +
                           " replicas do not spread evenly over the " +
                           std::to_string(gpus.size()) + " GPUs listed in strategy.devices");
            const int each = n / static_cast<int>(gpus.size());
            for (const std::string& g : gpus) localDevices.insert(localDevices.end(), each, g);
        } else {
            // N logical CPU replicas, each with its share of the cores.
            int n = st.replicas;
            if (n == 0) n = st.type == "mirrored" ? std::max(1, cpu.threads) : 1;
            // More replicas than cores is allowed (they share cores), for tests of the
            // semantics; each replica then runs its kernels on one thread.
            localDevices.assign(static_cast<size_t>(n), "cpu:0");
            threadsEach = std::max(1, cpu.threads / n);
        }
    }
    totalReplicas = static_cast<int>(localDevices.size()) * workerCount;
    if (globalBatch() % totalReplicas != 0)
        return err("training.batch_size: the global batch of " + std::to_string(globalBatch()) +
                   " does not split evenly across " + std::to_string(totalReplicas) + " replicas" +
                   (workerCount > 1 ? " (" + std::to_string(workerCount) + " workers x " +
                                          std::to_string(localDevices.size()) + ")"
                                    : std::string()) +
                   "; use a multiple of " + std::to_string(totalReplicas));
    return Status::success();
}

Status Trainer::Impl::openReplicas() {
    std::vector<std::string> ids;
    int threadsEach = 0;
    TD_RETURN_IF_ERROR(resolveStrategy(ids, threadsEach));
    const int local = static_cast<int>(ids.size());
    if (totalReplicas > 1)
        group = std::make_unique<ReplicaGroup>(local, s.project.strategy.timeoutSeconds, s.workers);
    for (int i = 0; i < local; ++i) {
        auto r = std::make_unique<Replica>();
        r->local = i;
        r->global = workerRank * local + i;
        auto dev = s.openDevice(ids[static_cast<size_t>(i)], threadsEach);
        if (!dev.ok()) return err("strategy.devices: " + dev.error());
        r->device = std::move(dev).value();
        r->label = ids[static_cast<size_t>(i)];
        if (totalReplicas > 1) r->label += "/replica " + std::to_string(r->global);
        const int64_t perReplica = globalBatch() / totalReplicas;
        r->workerThreads = chooseWorkerThreads(s.info, perReplica, r->device->desc().threads);
        if (group) r->timed = std::make_unique<TimedCollectives>(group->replica(i));
        replicas.push_back(std::move(r));
    }
    if (group && workerCount == 1 && local > 1) {
        // Replicas on GPUs of this process sum their gradient buckets on the GPUs (NCCL, or one
        // GPU's own sum kernel where they all share it); anything else (CPU replicas, no NCCL,
        // several GPUs with several replicas each) keeps the replica group for them.
        std::vector<Device*> devices;
        std::vector<Collectives*> host;
        for (int i = 0; i < local; ++i) {
            devices.push_back(replicas[static_cast<size_t>(i)]->device.get());
            host.push_back(&group->replica(i));
        }
        auto dc = deviceCollectives(devices, host, s.project.strategy.timeoutSeconds);
        if (dc.ok()) {
            for (int i = 0; i < local; ++i) {
                Replica& r = *replicas[static_cast<size_t>(i)];
                r.deviceCollectives = std::move((*dc)[static_cast<size_t>(i)]);
                r.timed = std::make_unique<TimedCollectives>(*r.deviceCollectives);
            }
            if (!replicas.front()->deviceCollectives->capturable())
                deviceSumNote = "gradient sums between the GPU replicas go through " + ids.front() +
                                "'s own sum kernel: its " + std::to_string(local) +
                                " replicas share it, and NCCL takes one rank per GPU";
        } else if (ids.front().rfind("cpu", 0) != 0)
            deviceSumNote =
                "gradient sums between the GPU replicas go through host memory: " + dc.error();
    }
    if (group && workerCount > 1) {
        // MultiWorkerMirrored with GPUs in every worker: NCCL over all of them, bootstrapped
        // through the workers' MPI group; metric sums, barriers and aborts stay on the host
        // path. Every worker takes part in the agreement, whatever its devices.
        std::vector<Device*> devices;
        std::vector<Collectives*> host;
        for (int i = 0; i < local; ++i) {
            devices.push_back(replicas[static_cast<size_t>(i)]->device.get());
            host.push_back(&group->replica(i));
        }
        TD_ASSIGN_OR_RETURN(
            WorkerDeviceCollectives wdc,
            workerDeviceCollectives(devices, host, *s.workers, s.project.strategy.timeoutSeconds));
        if (!wdc.whyNot.empty())
            deviceSumNote =
                "gradient sums between workers go through MPI (host memory), not "
                "NCCL: " +
                wdc.whyNot;
        for (size_t i = 0; i < wdc.collectives.size(); ++i) {
            Replica& r = *replicas[i];
            r.deviceCollectives = std::move(wdc.collectives[i]);
            r.timed = std::make_unique<TimedCollectives>(*r.deviceCollectives);
        }
    }
    for (size_t i = 1; i < replicas.size(); ++i)
        replicas[i]->thread = std::thread([this, r = replicas[i].get()] { replicaLoop(r); });
    return Status::success();
}

// Rows [begin, end) of a batch of `rows` from this worker's pipeline that global replica g
// takes: with the "data" policy every worker holds the global batch and g indexes all
// replicas; with "off" the worker's batch is split among its local replicas.
std::pair<int64_t, int64_t> Trainer::Impl::sliceOf(int global, int64_t rows) const {
    if (shardOff()) {
        const int64_t local = static_cast<int64_t>(replicas.size());
        const int64_t l = global % local;
        return {rows * l / local, rows * (l + 1) / local};
    }
    return {rows * global / totalReplicas, rows * (global + 1) / totalReplicas};
}

// The sums in every local replica's accumulators (and, with workers, every worker's), after
// the devices finished what was enqueued: the one host read of a log point.
Result<std::vector<double>> Trainer::Impl::readAccumulators(bool train, double extra) {
    std::vector<double> sums(static_cast<size_t>(accumCount()) + 1, 0.0);
    std::vector<double> v(static_cast<size_t>(accumCount()));
    for (auto& rp : replicas) {
        Device& d = *rp->device;
        TD_RETURN_IF_ERROR(d.synchronize());
        TD_RETURN_IF_ERROR(d.copyToHost(v.data(), train ? rp->trainAccum : rp->evalAccum, 0,
                                        v.size() * sizeof(double)));
        for (size_t i = 0; i < v.size(); ++i) sums[i] += v[i];
    }
    sums.back() = extra;
    if (s.workers && train)
        TD_RETURN_IF_ERROR(
            s.workers->allReduceHost(sums.data(), static_cast<int64_t>(sums.size())));
    return sums;
}

// Each local replica's training sums of the epoch so far (a host read).
Result<std::vector<std::vector<double>>> Trainer::Impl::localSums() {
    std::vector<std::vector<double>> out;
    for (auto& rp : replicas) {
        std::vector<double> v(static_cast<size_t>(accumCount()));
        TD_RETURN_IF_ERROR(rp->device->synchronize());
        TD_RETURN_IF_ERROR(
            rp->device->copyToHost(v.data(), rp->trainAccum, 0, v.size() * sizeof(double)));
        out.push_back(std::move(v));
    }
    return out;
}

// With workers, before a mid-epoch checkpoint: every worker's local sums, rank-major, in
// gatheredSums (every worker takes part, the chief writes them). The checkpoint then holds
// the whole epoch's sums, and each worker of a resumed run goes on from its own.
Status Trainer::Impl::gatherSums() {
    TD_ASSIGN_OR_RETURN(auto mine, localSums());
    const size_t n = static_cast<size_t>(accumCount());
    std::vector<double> flat;
    for (const auto& v : mine) flat.insert(flat.end(), v.begin(), v.end());
    std::vector<double> all(flat.size() * static_cast<size_t>(workerCount));
    TD_RETURN_IF_ERROR(
        s.workers->allGatherHost(flat.data(), static_cast<int64_t>(flat.size()), all.data()));
    gatheredSums.clear();
    for (size_t i = 0; i + n <= all.size(); i += n)
        gatheredSums.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(i),
                                  all.begin() + static_cast<std::ptrdiff_t>(i + n));
    return Status::success();
}

Status Trainer::Impl::zeroAccumulators(bool train) {
    for (auto& rp : replicas) {
        Buffer& a = train ? rp->trainAccum : rp->evalAccum;
        TD_RETURN_IF_ERROR(rp->device->fillZero(a, 0, a.bytes));
    }
    return Status::success();
}

// Each replica normalizes with its own rows' statistics and moves its moving statistics
// towards them (tf.distribute without synchronized BatchNorm); the replicas' moving
// statistics are then averaged (Keras' ON_READ variables with MEAN aggregation), so every
// replica holds the same bits again. The update is linear, so this equals moving once
// towards the mean of the replicas' batch statistics. A few values per layer: one host
// read and write per step and replica, and one host all-reduce across workers.
Status Trainer::Impl::syncMovingStats() {
    if (movingIndex.empty() || totalReplicas < 2) return Status::success();
    size_t total = 0;
    for (size_t i : movingIndex) total += static_cast<size_t>(numElements(paramShapes[i]));
    std::vector<double> sum(total, 0.0);
    std::vector<float> host;
    for (auto& rp : replicas) {
        TD_RETURN_IF_ERROR(rp->device->synchronize());
        size_t at = 0;
        for (size_t i : movingIndex) {
            host.resize(static_cast<size_t>(numElements(paramShapes[i])));
            TD_RETURN_IF_ERROR(
                rp->device->copyToHost(host.data(), rp->params[i], 0, host.size() * sizeof(float)));
            for (float v : host) sum[at++] += v;
        }
    }
    if (s.workers)
        TD_RETURN_IF_ERROR(s.workers->allReduceHost(sum.data(), static_cast<int64_t>(sum.size())));
    size_t at = 0;
    for (size_t i : movingIndex) {
        host.resize(static_cast<size_t>(numElements(paramShapes[i])));
        for (float& v : host) v = static_cast<float>(sum[at++] / totalReplicas);
        for (auto& rp : replicas)
            TD_RETURN_IF_ERROR(rp->device->copyToDevice(rp->params[i], 0, host.data(),
                                                        host.size() * sizeof(float)));
    }
    return Status::success();
}

// The first replica's parameters, copied to the host (callbacks' get_weights).
std::vector<Tensor> Trainer::Impl::weights() {
    std::vector<Tensor> w;
    Replica& r = *replicas[0];
    (void)r.device->synchronize();
    for (size_t i = 0; i < r.params.size(); ++i) {
        Tensor t(DType::F32, paramShapes[i]);
        (void)r.device->copyToHost(t.raw(), r.params[i], 0, t.bytes());
        w.push_back(std::move(t));
    }
    return w;
}

// Every replica's parameters from the host (callbacks' set_weights).
void Trainer::Impl::setWeights(const std::vector<Tensor>& w) {
    for (auto& rp : replicas) {
        for (size_t i = 0; i < rp->params.size() && i < w.size(); ++i)
            (void)rp->device->copyToDevice(rp->params[i], 0, w[i].raw(), w[i].bytes());
        rp->weightsDirty = true;
    }
}

}  // namespace td
