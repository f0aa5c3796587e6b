// Gradient sums between replicas that share one GPU (a Mirrored strategy with more replicas than
// GPUs, e.g. `"devices": ["cuda:0"], "replicas": 2`), where NCCL refuses: it takes one rank per
// GPU. Each replica runs its step on its own stream; at a bucket's start it marks its stream with
// an event and meets the others on the host. The last to arrive enqueues, on a stream of the
// group's own, a wait for every replica's event and one kernel that sums the replicas' buckets in
// replica order and writes the sum into each (cuda::sumShared: the same bits everywhere), then an
// event that each replica's stream waits for before it reads its bucket. The host meeting is why
// a step with these sums is launched, not replayed as a CUDA Graph (capturable() is false).
// Host reductions, barriers and aborts go on to the replica group, as with NCCL.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "engine/backend/cuda/cuda_device.h"
#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/device_collectives.h"
#include "engine/distribute/collectives.h"

namespace td::cuda {

namespace {

// What the replicas of one GPU share: the meeting of each bucket and the group's sum stream.
class SharedSums {
  public:
    SharedSums(int device, std::vector<cudaStream_t> streams, double timeoutSeconds)
        : device_(device), streams_(std::move(streams)), timeoutSeconds_(timeoutSeconds) {}
    ~SharedSums() {
        if (cudaSetDevice(device_) != cudaSuccess) return;
        if (stream_) cudaStreamSynchronize(stream_);
        for (auto& [bucket, m] : meets_) {
            if (m.done) cudaEventDestroy(m.done);
            for (cudaEvent_t e : m.ready)
                if (e) cudaEventDestroy(e);
        }
        if (stream_) cudaStreamDestroy(stream_);
    }
    SharedSums(const SharedSums&) = delete;
    SharedSums& operator=(const SharedSums&) = delete;

    Status init() {
        if (cudaSetDevice(device_) != cudaSuccess ||
            cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess) {
            const cudaError_t e = cudaGetLastError();
            return err(where() + ": the sum stream: " + cudaText(e));
        }
        return Status::success();
    }

    Status start(int replica, int bucket, float* data, int64_t count) {
        std::unique_lock<std::mutex> lock(mu_);
        if (aborted_) return err(reason_);
        const std::string what = "all-reduce bucket " + std::to_string(bucket) + " on " + where();
        if (cudaSetDevice(device_) != cudaSuccess) {
            (void)cudaGetLastError();
            return err(what + ": cannot select the GPU");
        }
        TD_ASSIGN_OR_RETURN(Meet * m, meet(bucket));
        if (m->count >= 0 && m->count != count)
            return fail(what + ": replica " + std::to_string(replica) + " has " +
                        std::to_string(count) + " values, another " + std::to_string(m->count));
        const cudaEvent_t ready = m->ready[static_cast<size_t>(replica)];
        if (const cudaError_t e = cudaEventRecord(ready, streams_[static_cast<size_t>(replica)]);
            e != cudaSuccess)
            return fail(what + ": marking replica " + std::to_string(replica) +
                        "'s stream: " + cudaText(e));
        m->buckets.p[replica] = data;
        m->count = count;
        m->arrived.push_back(replica);
        const uint64_t generation = m->generation;
        if (static_cast<int>(m->arrived.size()) == replicas()) {
            // The last to arrive enqueues the sum for all.
            for (cudaEvent_t e : m->ready)
                if (const cudaError_t w = cudaStreamWaitEvent(stream_, e, 0); w != cudaSuccess)
                    return fail(what + ": waiting for the replicas: " + cudaText(w));
            if (const cudaError_t k = sumShared(stream_, m->buckets, count); k != cudaSuccess)
                return fail(what + ": the sum kernel: " + cudaText(k));
            if (const cudaError_t d = cudaEventRecord(m->done, stream_); d != cudaSuccess)
                return fail(what + ": marking the sum: " + cudaText(d));
            m->arrived.clear();
            m->count = -1;
            ++m->generation;
            cv_.notify_all();
            return Status::success();
        }
        const auto limit = std::chrono::duration<double>(timeoutSeconds_);
        if (!cv_.wait_for(lock, limit, [&] { return m->generation != generation || aborted_; })) {
            std::ostringstream missing;
            for (int r = 0; r < replicas(); ++r)
                if (std::find(m->arrived.begin(), m->arrived.end(), r) == m->arrived.end())
                    missing << (missing.tellp() > 0 ? ", " : "") << r;
            return fail(what + ": replica " + missing.str() + " did not arrive within " +
                        std::to_string(static_cast<int>(timeoutSeconds_)) +
                        " s (it failed or hangs)");
        }
        if (aborted_) return err(reason_);
        return Status::success();
    }

    // The replica's stream waits for the bucket's latest sum (enqueued when the last replica
    // started it, which this replica's start waited for).
    Status wait(int replica, int bucket) {
        std::lock_guard<std::mutex> lock(mu_);
        if (aborted_) return err(reason_);
        auto it = meets_.find(bucket);
        if (it == meets_.end())
            return err("all-reduce bucket " + std::to_string(bucket) + " on " + where() +
                       ": waited for before it started");
        if (const cudaError_t e =
                cudaStreamWaitEvent(streams_[static_cast<size_t>(replica)], it->second.done, 0);
            e != cudaSuccess)
            return err("all-reduce bucket " + std::to_string(bucket) + " on " + where() + ": " +
                       cudaText(e));
        return Status::success();
    }

    Status usable() {
        std::lock_guard<std::mutex> lock(mu_);
        if (aborted_) return err(reason_);
        return Status::success();
    }

    void abort(const std::string& reason) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (!aborted_) reason_ = reason;
            aborted_ = true;
        }
        cv_.notify_all();
    }

    int replicas() const { return static_cast<int>(streams_.size()); }

  private:
    struct Meet {
        std::vector<cudaEvent_t> ready;  // per replica: its stream reached the bucket
        cudaEvent_t done = nullptr;      // the sum
        SharedBuckets buckets;
        int64_t count = -1;
        std::vector<int> arrived;
        uint64_t generation = 0;  // sums enqueued so far
    };

    std::string where() const { return "cuda:" + std::to_string(device_); }

    // The bucket's meeting, made on first use (the lock held; std::map keeps it in place).
    Result<Meet*> meet(int bucket) {
        auto [it, fresh] = meets_.try_emplace(bucket);
        Meet& m = it->second;
        if (fresh) {
            m.buckets.n = replicas();
            m.ready.assign(streams_.size(), nullptr);
            cudaError_t e = cudaEventCreateWithFlags(&m.done, cudaEventDisableTiming);
            for (cudaEvent_t& r : m.ready)
                if (e == cudaSuccess) e = cudaEventCreateWithFlags(&r, cudaEventDisableTiming);
            if (e != cudaSuccess)
                return err("all-reduce events on " + where() + ": " + cudaText(e));
        }
        return &m;
    }

    // Breaks the group with `why` (the lock held) and returns it as the error.
    Status fail(const std::string& why) {
        if (!aborted_) reason_ = why;
        aborted_ = true;
        cv_.notify_all();
        return err(why);
    }

    int device_;
    std::vector<cudaStream_t> streams_;
    double timeoutSeconds_;
    cudaStream_t stream_ = nullptr;
    std::mutex mu_;
    std::condition_variable cv_;
    std::map<int, Meet> meets_;
    bool aborted_ = false;
    std::string reason_;
};

class SharedGpuCollectives final : public DeviceSumCollectives {
  public:
    SharedGpuCollectives(std::shared_ptr<SharedSums> sums, int local, Collectives& host)
        : DeviceSumCollectives(host), sums_(std::move(sums)), local_(local) {}
    bool capturable() const override { return false; }
    Status allReduceStart(int bucket, float* data, int64_t count) override {
        return sums_->start(local_, bucket, data, count);
    }
    Status allReduceWait(int bucket) override { return sums_->wait(local_, bucket); }
    Status deviceSumsUsable() override { return sums_->usable(); }
    void abort(const std::string& reason) override {
        host_.abort(reason);
        sums_->abort(reason);
    }

  private:
    std::shared_ptr<SharedSums> sums_;
    int local_;
};

}  // namespace

Result<std::vector<std::unique_ptr<Collectives>>> sharedGpuCollectives(
    const std::vector<Device*>& devices, const std::vector<Collectives*>& host,
    double timeoutSeconds) {
    if (devices.size() < 2 || devices.size() != host.size())
        return err("sharedGpuCollectives: two or more replicas, one host collectives object each");
    if (devices.size() > static_cast<size_t>(kMaxSharedReplicas))
        return err(std::to_string(devices.size()) + " replicas on " + devices[0]->desc().id +
                   ": its own sums take at most " + std::to_string(kMaxSharedReplicas));
    std::vector<cudaStream_t> streams;
    for (Device* d : devices) {
        const cudaStream_t s = streamOf(*d);
        if (!s) return err(d->desc().id + " is not a CUDA device: collectives sum host memory");
        if (d->desc().index != devices[0]->desc().index)
            return err("replicas on " + devices[0]->desc().id + " and " + d->desc().id +
                       ": one GPU's own sums take replicas of that GPU only");
        streams.push_back(s);
    }
    auto sums = std::make_shared<SharedSums>(devices[0]->desc().index, std::move(streams),
                                             timeoutSeconds > 0 ? timeoutSeconds : 60.0);
    TD_RETURN_IF_ERROR(sums->init());
    std::vector<std::unique_ptr<Collectives>> out;
    for (size_t i = 0; i < devices.size(); ++i)
        out.push_back(std::make_unique<SharedGpuCollectives>(sums, static_cast<int>(i), *host[i]));
    return out;
}

}  // namespace td::cuda
