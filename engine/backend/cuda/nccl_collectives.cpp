// Gradient buckets summed between the GPUs of one process with NCCL (deviceCollectives in
// backend.h): one communicator per device from ncclCommInitAll, each sum enqueued on the
// device's stream in place (so a program captures it into its CUDA Graph and nothing waits on
// the host). Host reductions, barriers and aborts go on to the host collectives the trainer
// already has (the replica group), so log points, failures and timeouts behave as on CPUs. NCCL
// is opened with dlopen: without it, deviceCollectives says so and the trainer keeps the host
// path. Between processes (MultiWorkerMirrored) the gradients still go through MPI.
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_device.h"
#include "engine/distribute/collectives.h"

namespace td {

namespace {

class NcclLibrary {
  public:
#define TD_NCCL_FNS(X) \
    X(ncclGetErrorString) X(ncclCommInitAll) X(ncclCommDestroy) X(ncclCommAbort) X(ncclAllReduce)
#define TD_NCCL_FN(name) decltype(&::name) name = nullptr;
    TD_NCCL_FNS(TD_NCCL_FN)
#undef TD_NCCL_FN
    std::string error;

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
        void* h = nullptr;
        for (const char* name : {"libnccl.so.2", "libnccl.so"}) {
            h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
            if (h) break;
        }
        if (!h) {
            const char* e = dlerror();
            lib.error = std::string("cannot load NCCL (libnccl.so.2): ") + (e ? e : "not found");
            return lib;
        }
        auto sym = [&](auto& fn, const char* name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
            if (!fn && lib.error.empty()) lib.error = std::string("NCCL has no ") + name;
        };
#define TD_NCCL_SYM(name) sym(lib.name, #name);
        TD_NCCL_FNS(TD_NCCL_SYM)
#undef TD_NCCL_SYM
        return lib;
    }
#undef TD_NCCL_FNS
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

class NcclBucketCollectives final : public Collectives {
  public:
    NcclBucketCollectives(std::shared_ptr<NcclComms> comms, int local, int device,
                          cudaStream_t stream, Collectives& host)
        : comms_(std::move(comms)), local_(local), device_(device), stream_(stream), host_(host) {}

    int size() const override { return host_.size(); }
    int rank() const override { return host_.rank(); }
    bool reducesDeviceMemory() const override { return true; }
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
    Status allReduceHost(double* values, int64_t count) override {
        return host_.allReduceHost(values, count);
    }
    Status allGatherHost(const double* values, int64_t count, double* out) override {
        return host_.allGatherHost(values, count, out);
    }
    Status barrier() override { return host_.barrier(); }
    void abort(const std::string& reason) override {
        host_.abort(reason);
        comms_->abort();
    }

  private:
    std::shared_ptr<NcclComms> comms_;
    int local_;
    int device_;
    cudaStream_t stream_;
    Collectives& host_;
};

}  // namespace

Result<std::vector<std::unique_ptr<Collectives>>> deviceCollectives(
    const std::vector<Device*>& devices, const std::vector<Collectives*>& host) {
    if (devices.empty() || devices.size() != host.size())
        return err("deviceCollectives: one host collectives object per device expected");
    std::vector<int> ids;
    std::vector<cudaStream_t> streams;
    for (Device* d : devices) {
        const cudaStream_t s = cuda::streamOf(*d);
        if (!s) return err(d->desc().id + " is not a CUDA device: collectives sum host memory");
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

}  // namespace td
