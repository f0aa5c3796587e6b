// Gradient buckets summed between GPUs with NCCL, each sum enqueued on the device's stream in
// place (so a program captures it into its CUDA Graph and nothing waits on the host). Host
// reductions, barriers and aborts go on to the host collectives the trainer already has (the
// replica group, and MPI between workers), so log points, failures and timeouts behave as on CPUs.
// NCCL is opened on first use (core/module_loader.h): without it, the trainer keeps the host path.
//
// Between the GPUs of one process (deviceCollectives in backend.h): one communicator per device
// from ncclCommInitAll.
//
// Between the processes of a multi-worker job (ncclAcrossWorkers in nccl_workers.h, reached through
// workerDeviceCollectives in devices.cpp, which agrees with every worker and brings worker 0's id
// over MPI): ncclCommInitRankConfig per local GPU, in one NCCL group, global NCCL rank = worker
// rank x local GPUs + local index. These communicators are non-blocking (config.blocking = 0), so
// no NCCL call can block the engine forever: the set-up is polled with ncclCommGetAsyncError up to
// the strategy's timeout. A NCCL kernel waiting for a dead or hung peer would still hold the
// stream (and the host waiting on it) forever, so a watchdog thread polls every communicator's
// asynchronous error and the age of the sum each stream is in (host functions on the stream mark
// a sum's start and end, captured with the step): an error, or a sum older than the timeout, aborts
// the communicators (ncclCommAbort ends the waiting kernels). The next run of a program sees it
// (deviceSumsUsable), local replica 0 names the missing worker with a barrier of the MPI group
// where it can, and the host group is broken with that reason.
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_device.h"
#include "engine/backend/device_collectives.h"
#include "engine/backend/nccl_workers.h"
#include "engine/core/module_loader.h"
#include "engine/distribute/collectives.h"

namespace td {

namespace {

class NcclLibrary {
  public:
#define TD_NCCL_FNS(X) \
    X(ncclGetErrorString) X(ncclCommInitAll) X(ncclCommDestroy) X(ncclCommAbort) X(ncclAllReduce)
// Between processes (NCCL 2.14 and later); missing ones only make `workerError` say so.
#define TD_NCCL_WORKER_FNS(X) \
    X(ncclGetUniqueId)        \
    X(ncclCommInitRankConfig) \
    X(ncclCommGetAsyncError)  \
    X(ncclCommFinalize) X(ncclGroupStart) X(ncclGroupEnd) X(ncclGetLastError)
#define TD_NCCL_FN(name) decltype(&::name) name = nullptr;
    TD_NCCL_FNS(TD_NCCL_FN)
    TD_NCCL_WORKER_FNS(TD_NCCL_FN)
#undef TD_NCCL_FN
    std::string error;
    std::string workerError;  // why NCCL cannot sum between processes (empty: it can)

    static const NcclLibrary& get() {
        static const NcclLibrary lib = load();
        return lib;
    }
    std::string text(ncclResult_t r) const {
        const char* s = ncclGetErrorString ? ncclGetErrorString(r) : nullptr;
        return s ? std::string(s) : "NCCL result " + std::to_string(static_cast<int>(r));
    }

  private:
    static NcclLibrary load() {
        NcclLibrary lib;
        auto so = SystemLibrary::open("NCCL", {"libnccl.so.2", "libnccl.so"});
        if (!so.ok()) {
            lib.error = lib.workerError = so.error();
            return lib;
        }
#define TD_NCCL_SLOT(name) SymbolSlot(#name, lib.name),
        const Status resolved = so->resolve({TD_NCCL_FNS(TD_NCCL_SLOT)});
        const Status workers = so->resolve({TD_NCCL_WORKER_FNS(TD_NCCL_SLOT)});
#undef TD_NCCL_SLOT
        if (!resolved.ok()) lib.error = resolved.error();
        lib.workerError = lib.error;
        if (lib.workerError.empty() && !workers.ok())
            lib.workerError = workers.error() + " (NCCL 2.14 or later sums between processes)";
        return lib;
    }
#undef TD_NCCL_FNS
#undef TD_NCCL_WORKER_FNS
};

// The communicators of one group, destroyed with the last replica's collectives. abort() (a
// replica failed, the group broke) aborts them from any thread, which also ends a sum blocked
// waiting for peers that will never join it; they are not used or destroyed after that.
struct NcclComms {
    const NcclLibrary* lib = nullptr;
    std::vector<ncclComm_t> comms;
    std::mutex mu;
    std::atomic<bool> aborted{false};
    ~NcclComms() {
        if (!aborted)
            for (ncclComm_t c : comms) lib->ncclCommDestroy(c);
    }
    void abort() {
        std::lock_guard<std::mutex> lock(mu);
        if (aborted.exchange(true)) return;
        for (ncclComm_t c : comms) lib->ncclCommAbort(c);
    }
};

class NcclBucketCollectives final : public DeviceSumCollectives {
  public:
    NcclBucketCollectives(std::shared_ptr<NcclComms> comms, int local, int device,
                          cudaStream_t stream, Collectives& host)
        : DeviceSumCollectives(host),
          comms_(std::move(comms)),
          local_(local),
          device_(device),
          stream_(stream) {}

    Status allReduceStart(int bucket, float* data, int64_t count) override {
        if (comms_->aborted) return err("all-reduce: the replica group was aborted");
        if (cudaSetDevice(device_) != cudaSuccess) {
            (void)cudaGetLastError();
            return err("all-reduce bucket " + std::to_string(bucket) +
                       ": cannot select cuda:" + std::to_string(device_));
        }
        const ncclResult_t r =
            comms_->lib->ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat, ncclSum,
                                       comms_->comms[static_cast<size_t>(local_)], stream_);
        if (r != ncclSuccess)
            return err("all-reduce bucket " + std::to_string(bucket) + " on cuda:" +
                       std::to_string(device_) + ": ncclAllReduce: " + comms_->lib->text(r));
        return Status::success();
    }
    // The stream orders the sum before whatever reads the bucket.
    Status allReduceWait(int) override { return Status::success(); }
    // Aborted communicators must not be replayed in a captured step.
    Status deviceSumsUsable() override {
        if (comms_->aborted) return err("all-reduce: the replica group was aborted");
        return Status::success();
    }
    void abort(const std::string& reason) override {
        host_.abort(reason);
        comms_->abort();
    }

  private:
    std::shared_ptr<NcclComms> comms_;
    int local_;
    int device_;
    cudaStream_t stream_;
};

}  // namespace

Result<std::vector<std::unique_ptr<Collectives>>> deviceCollectives(
    const std::vector<Device*>& devices, const std::vector<Collectives*>& host,
    double timeoutSeconds) {
    if (devices.empty() || devices.size() != host.size())
        return err("deviceCollectives: one host collectives object per device expected");
    // Every replica on one GPU: that GPU's own sums (NCCL takes one rank per GPU).
    bool oneGpu = devices.size() > 1 && cuda::streamOf(*devices[0]);
    for (Device* d : devices)
        oneGpu = oneGpu && cuda::streamOf(*d) && d->desc().index == devices[0]->desc().index;
    if (oneGpu) return cuda::sharedGpuCollectives(devices, host, timeoutSeconds);
    std::vector<int> ids;
    std::vector<cudaStream_t> streams;
    for (Device* d : devices) {
        const cudaStream_t s = cuda::streamOf(*d);
        if (!s) return err(d->desc().id + " is not a CUDA device: collectives sum host memory");
        // NCCL takes one rank per GPU: replicas spread over several GPUs, some holding more than
        // one, sum through host memory.
        if (std::find(ids.begin(), ids.end(), d->desc().index) != ids.end())
            return err(d->desc().id +
                       " holds more than one replica, and NCCL takes one rank per GPU");
        ids.push_back(d->desc().index);
        streams.push_back(s);
    }
    const NcclLibrary& lib = NcclLibrary::get();
    if (!lib.error.empty()) return err(lib.error);
    auto comms = std::make_shared<NcclComms>();
    comms->lib = &lib;
    comms->comms.assign(ids.size(), nullptr);
    const ncclResult_t r =
        lib.ncclCommInitAll(comms->comms.data(), static_cast<int>(ids.size()), ids.data());
    if (r != ncclSuccess) {
        comms->comms.clear();
        return err("ncclCommInitAll over " + std::to_string(ids.size()) + " GPUs: " + lib.text(r));
    }
    std::vector<std::unique_ptr<Collectives>> out;
    for (size_t i = 0; i < ids.size(); ++i)
        out.push_back(std::make_unique<NcclBucketCollectives>(comms, static_cast<int>(i), ids[i],
                                                              streams[i], *host[i]));
    return out;
}

// ---- between the processes of a multi-worker job ----------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

int64_t nowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
        .count();
}

std::string secondsText(double s) {
    std::ostringstream o;
    o << s << " s";
    return o.str();
}

// Host functions on a stream around each sum: when the stream entered the sum under way (0: none).
void CUDART_CB sumEntered(void* p) {
    static_cast<std::atomic<int64_t>*>(p)->store(nowNs(), std::memory_order_relaxed);
}
void CUDART_CB sumLeft(void* p) {
    static_cast<std::atomic<int64_t>*>(p)->store(0, std::memory_order_relaxed);
}

// The communicators of this process's GPUs in the job-wide group, and their watchdog.
struct NcclWorkerComms {
    struct Local {
        ncclComm_t comm = nullptr;
        int device = 0;
        std::mutex mu;  // NCCL calls on `comm` (the watchdog's polls, sums, the abort)
        std::atomic<int64_t> sumSince{0};
    };
    const NcclLibrary* lib = nullptr;
    std::vector<std::unique_ptr<Local>> locals;
    Collectives* workers = nullptr;
    int workerCount = 1;
    double timeoutSeconds = 30;

    std::atomic<bool> aborted{false};
    std::mutex reasonMu;
    std::string reason;  // why the communicators were aborted
    bool named = false;  // local replica 0 has named the missing worker in `reason`

    std::thread watchdog;
    std::mutex stopMu;
    std::condition_variable stopCv;
    bool stop = false;

    ~NcclWorkerComms() {
        if (watchdog.joinable()) {
            {
                std::lock_guard<std::mutex> lock(stopMu);
                stop = true;
            }
            stopCv.notify_all();
            watchdog.join();
        }
        if (aborted) return;
        // Non-blocking communicators: finalize (it flushes what is under way and may wait for
        // peers), polled up to the timeout, then destroy; abort when a peer does not follow.
        for (auto& l : locals) lib->ncclCommFinalize(l->comm);
        if (!settle("finalize").ok()) {
            abortComms("NCCL finalize did not complete");
            return;
        }
        for (auto& l : locals) lib->ncclCommDestroy(l->comm);
    }

    // Polls every communicator until none is in progress, up to the timeout.
    Status settle(const std::string& what) {
        const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(timeoutSeconds));
        for (;;) {
            bool busy = false;
            for (auto& l : locals) {
                ncclResult_t r = ncclSuccess;
                const ncclResult_t q = lib->ncclCommGetAsyncError(l->comm, &r);
                if (q != ncclSuccess) r = q;
                if (r == ncclInProgress) {
                    busy = true;
                } else if (r != ncclSuccess) {
                    return err(what + " on cuda:" + std::to_string(l->device) + ": " + text(r));
                }
            }
            if (!busy) return Status::success();
            if (Clock::now() > deadline)
                return err(what + " did not complete within " + secondsText(timeoutSeconds) +
                           " (a worker exited or hangs)");
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }

    std::string text(ncclResult_t r) const {
        std::string t = lib->text(r);
        const char* last = lib->ncclGetLastError ? lib->ncclGetLastError(nullptr) : nullptr;
        if (last && *last) t += std::string(" (") + last + ")";
        return t;
    }

    // Aborts every communicator (any thread); the first reason stays.
    void abortComms(const std::string& why) {
        {
            std::lock_guard<std::mutex> lock(reasonMu);
            if (reason.empty()) reason = why;
        }
        if (aborted.exchange(true)) return;
        for (auto& l : locals) {
            std::lock_guard<std::mutex> lock(l->mu);
            lib->ncclCommAbort(l->comm);
        }
    }

    std::string abortReason() {
        std::lock_guard<std::mutex> lock(reasonMu);
        return reason;
    }

    void watch() {
        const int64_t limitNs = static_cast<int64_t>(timeoutSeconds * 1e9);
        std::unique_lock<std::mutex> lock(stopMu);
        while (!stop && !aborted) {
            stopCv.wait_for(lock, std::chrono::milliseconds(10));
            if (stop || aborted) break;
            std::string why;
            for (auto& l : locals) {
                {
                    std::lock_guard<std::mutex> callLock(l->mu);
                    if (aborted) break;
                    ncclResult_t r = ncclSuccess;
                    const ncclResult_t q = lib->ncclCommGetAsyncError(l->comm, &r);
                    if (q != ncclSuccess) r = q;
                    if (r != ncclSuccess && r != ncclInProgress) {
                        why = "all-reduce: NCCL between workers failed on cuda:" +
                              std::to_string(l->device) + ": " + text(r) +
                              " (a worker exited, or the network between workers failed)";
                        break;
                    }
                }
                const int64_t since = l->sumSince.load(std::memory_order_relaxed);
                if (since != 0 && nowNs() - since > limitNs) {
                    why = "all-reduce: the NCCL sum on cuda:" + std::to_string(l->device) +
                          " did not complete within " + secondsText(timeoutSeconds) +
                          " (a worker exited or hangs)";
                    break;
                }
            }
            if (!why.empty()) {
                lock.unlock();
                abortComms(why);
                lock.lock();
            }
        }
    }
};

class NcclWorkerCollectives final : public DeviceSumCollectives {
  public:
    NcclWorkerCollectives(std::shared_ptr<NcclWorkerComms> comms, int local, cudaStream_t stream,
                          Collectives& host)
        : DeviceSumCollectives(host), comms_(std::move(comms)), local_(local), stream_(stream) {}

    Status allReduceStart(int bucket, float* data, int64_t count) override {
        TD_RETURN_IF_ERROR(deviceSumsUsable());
        NcclWorkerComms::Local& l = *comms_->locals[static_cast<size_t>(local_)];
        const std::string what =
            "all-reduce bucket " + std::to_string(bucket) + " on cuda:" + std::to_string(l.device);
        if (cudaSetDevice(l.device) != cudaSuccess) {
            (void)cudaGetLastError();
            return err(what + ": cannot select the device");
        }
        void* mark = &l.sumSince;
        if (cudaLaunchHostFunc(stream_, sumEntered, mark) != cudaSuccess) {
            (void)cudaGetLastError();
            return err(what + ": cannot mark the sum on the stream");
        }
        std::string failure;
        {
            std::lock_guard<std::mutex> lock(l.mu);
            if (comms_->aborted) return err(comms_->abortReason());
            ncclResult_t r = comms_->lib->ncclAllReduce(data, data, static_cast<size_t>(count),
                                                        ncclFloat, ncclSum, l.comm, stream_);
            // Non-blocking: an operation in progress (e.g. connecting to peers on first use) is
            // polled to completion before anything else is issued on the communicator.
            const auto deadline =
                Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(comms_->timeoutSeconds));
            while (r == ncclInProgress && Clock::now() <= deadline) {
                std::this_thread::sleep_for(std::chrono::microseconds(100));
                ncclResult_t a = ncclSuccess;
                const ncclResult_t q = comms_->lib->ncclCommGetAsyncError(l.comm, &a);
                r = q != ncclSuccess ? q : a;
            }
            if (r == ncclInProgress)
                failure = what + ": ncclAllReduce was not enqueued within " +
                          secondsText(comms_->timeoutSeconds) + " (a worker exited or hangs)";
            else if (r != ncclSuccess)
                failure = what + ": ncclAllReduce: " + comms_->text(r);
        }
        if (!failure.empty()) {
            comms_->abortComms(failure);
            return err(failure);
        }
        if (cudaLaunchHostFunc(stream_, sumLeft, mark) != cudaSuccess) {
            (void)cudaGetLastError();
            return err(what + ": cannot mark the sum on the stream");
        }
        return Status::success();
    }
    // The stream orders the sum before whatever reads the bucket.
    Status allReduceWait(int) override { return Status::success(); }
    Status deviceSumsUsable() override {
        if (!comms_->aborted) return Status::success();
        std::string why = comms_->abortReason();
        if (local_ == 0) {
            std::unique_lock<std::mutex> lock(comms_->reasonMu);
            if (!comms_->named) {
                comms_->named = true;
                lock.unlock();
                // The watchdog saw the failure; every live worker's watchdog sees it about
                // together, and a barrier of the process group names the one that is missing.
                const Status b = comms_->workers->barrier();
                if (!b.ok()) why += "; " + b.error();
                lock.lock();
                comms_->reason = why;
            }
            why = comms_->reason;
            // Local replica 0 breaks the host group once it has named the missing worker (the
            // others only fail their step, so the group is still whole for that barrier).
            host_.abort(why);
        }
        return err(why);
    }
    void abort(const std::string& reason) override {
        host_.abort(reason);
        comms_->abortComms(reason);
    }

  private:
    std::shared_ptr<NcclWorkerComms> comms_;
    int local_;
    cudaStream_t stream_;
};

}  // namespace

std::string ncclAcrossWorkersUnavailable(const std::vector<Device*>& devices, bool& cpu) {
    cpu = false;
    for (Device* d : devices)
        if (!cuda::streamOf(*d)) {
            cpu = true;
            return d->desc().id + " is not a CUDA device";
        }
    const NcclLibrary& lib = NcclLibrary::get();
    return lib.workerError;
}

Result<std::vector<uint8_t>> ncclUniqueIdBytes() {
    const NcclLibrary& lib = NcclLibrary::get();
    if (!lib.workerError.empty()) return err(lib.workerError);
    ncclUniqueId id;
    const ncclResult_t r = lib.ncclGetUniqueId(&id);
    if (r != ncclSuccess) return err("ncclGetUniqueId: " + lib.text(r));
    std::vector<uint8_t> out(sizeof id.internal);
    std::memcpy(out.data(), id.internal, sizeof id.internal);
    return out;
}

Result<std::vector<std::unique_ptr<Collectives>>> ncclAcrossWorkers(
    const std::vector<Device*>& devices, const std::vector<Collectives*>& host,
    const std::vector<uint8_t>& idBytes, Collectives& workers, double timeoutSeconds) {
    if (devices.empty() || devices.size() != host.size())
        return err("ncclAcrossWorkers: one host collectives object per device expected");
    const NcclLibrary& lib = NcclLibrary::get();
    if (!lib.workerError.empty()) return err(lib.workerError);
    ncclUniqueId id;
    if (idBytes.size() != sizeof id.internal) return err("NCCL between workers: a bad NCCL id");
    std::memcpy(id.internal, idBytes.data(), sizeof id.internal);

    auto comms = std::make_shared<NcclWorkerComms>();
    comms->lib = &lib;
    comms->workers = &workers;
    comms->workerCount = workers.size();
    comms->timeoutSeconds = timeoutSeconds > 0 ? timeoutSeconds : 30;
    const int local = static_cast<int>(devices.size());
    const int nranks = comms->workerCount * local;
    std::vector<cudaStream_t> streams;
    for (Device* d : devices) {
        auto l = std::make_unique<NcclWorkerComms::Local>();
        l->device = d->desc().index;
        comms->locals.push_back(std::move(l));
        streams.push_back(cuda::streamOf(*d));
    }
    const std::string what = "NCCL set-up between " + std::to_string(comms->workerCount) +
                             " workers (" + std::to_string(nranks) + " GPUs)";
    // One group for this process's GPUs: each init would otherwise wait for the others.
    ncclResult_t r = lib.ncclGroupStart();
    int inited = 0;
    for (int i = 0; i < local && r == ncclSuccess; ++i) {
        NcclWorkerComms::Local& l = *comms->locals[static_cast<size_t>(i)];
        if (cudaSetDevice(l.device) != cudaSuccess) {
            (void)cudaGetLastError();
            (void)lib.ncclGroupEnd();
            comms->locals.resize(static_cast<size_t>(inited));
            comms->abortComms(what + ": cannot select cuda:" + std::to_string(l.device));
            return err(comms->abortReason());
        }
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        r = lib.ncclCommInitRankConfig(&l.comm, nranks, id, workers.rank() * local + i, &config);
        if (r == ncclSuccess || r == ncclInProgress) ++inited;
    }
    const ncclResult_t end = lib.ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = end;
    comms->locals.resize(static_cast<size_t>(inited));
    if (r != ncclSuccess && r != ncclInProgress) {
        const std::string why = what + ": ncclCommInitRankConfig: " + comms->text(r);
        comms->abortComms(why);
        return err(why);
    }
    const Status settled = comms->settle(what);
    if (!settled.ok()) {
        comms->abortComms(settled.error());
        return err(settled.error());
    }
    comms->watchdog = std::thread([c = comms.get()] { c->watch(); });
    std::vector<std::unique_ptr<Collectives>> out;
    for (int i = 0; i < local; ++i)
        out.push_back(std::make_unique<NcclWorkerCollectives>(
            comms, i, streams[static_cast<size_t>(i)], *host[static_cast<size_t>(i)]));
    return out;
}

}  // namespace td
