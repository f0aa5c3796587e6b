#include "engine/distribute/mpi_collectives.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <mutex>
#include <vector>

#include "engine/distribute/mpi_detail.h"

namespace td {

#if TRAINDECK_HAVE_MPI

namespace {

using mpi_detail::Backoff;
using mpi_detail::Clock;
using mpi_detail::formatSeconds;

// Tags. Buckets on their own communicator: 2 * bucket + phase. Host operations and control
// messages on theirs.
constexpr int kMaxBuckets = 16384;
// Buckets up to this many values are summed whole by every rank (one round of messages).
constexpr int64_t kDirectMaxValues = 8192;
constexpr int kTagHostReduce = 1;
constexpr int kTagHostGather = 2;
constexpr int kTagBarrier = 3;
constexpr int kTagControl = 1;
// A worker that sees the launcher's SIGTERM (or reaches its timeout in a gather, where the peer
// it waits for may itself wait for another) polls this long for a peer's explanation before it
// names the ranks it is missing.
constexpr double kNamingGraceSeconds = 0.2;
// How long abort() and a failure try to hand their control messages over before returning.
constexpr double kNotifyFlushSeconds = 0.25;
constexpr size_t kMaxReasonBytes = 4000;

Clock::time_point after(double seconds) {
    return Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string rankList(const std::vector<int>& ranks) {
    std::string s = ranks.size() == 1 ? "worker rank " : "worker ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(ranks[i]);
    }
    return s;
}

// The operation an error is about, spelled out only when there is an error.
struct OpName {
    const char* text;
    int bucket = -1;
    std::string str() const {
        return bucket < 0 ? std::string(text) : std::string(text) + " " + std::to_string(bucket);
    }
};

// One round of point-to-point requests, each with the peer it talks to.
struct Exchange {
    std::vector<MPI_Request> reqs;
    std::vector<int> peer;
    std::vector<char> isRecv;
    std::vector<int> expected;  // element count a receive must bring
    std::vector<MPI_Status> statuses;
    std::vector<int> indices;

    void clear() {
        reqs.clear();
        peer.clear();
        isRecv.clear();
        expected.clear();
    }
    bool done() const {
        return std::all_of(reqs.begin(), reqs.end(),
                           [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
    }
    // Ranks with an unfinished receive; when every receive is in, ranks with an unfinished send.
    std::vector<int> pendingPeers() const {
        std::vector<int> out;
        for (int pass = 0; pass < 2 && out.empty(); ++pass)
            for (size_t i = 0; i < reqs.size(); ++i)
                if (reqs[i] != MPI_REQUEST_NULL && (isRecv[i] != 0) == (pass == 0))
                    out.push_back(peer[i]);
        std::sort(out.begin(), out.end());
        out.erase(std::unique(out.begin(), out.end()), out.end());
        return out;
    }
    Status postRecv(void* buf, int count, MPI_Datatype type, int src, int tag, MPI_Comm comm) {
        MPI_Request r = MPI_REQUEST_NULL;
        TD_RETURN_IF_ERROR(TD_MPI_CHECK(MPI_Irecv(buf, count, type, src, tag, comm, &r)));
        reqs.push_back(r);
        peer.push_back(src);
        isRecv.push_back(1);
        expected.push_back(count);
        return Status::success();
    }
    Status postSend(const void* buf, int count, MPI_Datatype type, int dst, int tag,
                    MPI_Comm comm) {
        MPI_Request r = MPI_REQUEST_NULL;
        TD_RETURN_IF_ERROR(TD_MPI_CHECK(MPI_Isend(buf, count, type, dst, tag, comm, &r)));
        reqs.push_back(r);
        peer.push_back(dst);
        isRecv.push_back(0);
        expected.push_back(count);
        return Status::success();
    }
    // Tests every request once. Errors name the peer.
    Status test(MPI_Datatype type) {
        if (reqs.empty()) return Status::success();
        const int n = static_cast<int>(reqs.size());
        statuses.resize(reqs.size());
        indices.resize(reqs.size());
        int outcount = 0;
        const int rc = MPI_Testsome(n, reqs.data(), &outcount, indices.data(), statuses.data());
        if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS)
            return err("MPI_Testsome failed: " + mpi_detail::errorString(rc));
        if (outcount == MPI_UNDEFINED) return Status::success();
        for (int k = 0; k < outcount; ++k) {
            const size_t i = static_cast<size_t>(indices[static_cast<size_t>(k)]);
            const MPI_Status& st = statuses[static_cast<size_t>(k)];
            if (rc == MPI_ERR_IN_STATUS && st.MPI_ERROR != MPI_SUCCESS)
                return err(std::string(isRecv[i] ? "receiving from" : "sending to") +
                           " worker rank " + std::to_string(peer[i]) +
                           " failed: " + mpi_detail::errorString(st.MPI_ERROR));
            if (isRecv[i]) {
                int got = 0;
                MPI_Get_count(&st, type, &got);
                if (got != expected[i])
                    return err("worker rank " + std::to_string(peer[i]) + " sent " +
                               std::to_string(got) + " values where " +
                               std::to_string(expected[i]) +
                               " were expected (the workers run different models or call the "
                               "collectives in a different order)");
            }
        }
        return Status::success();
    }
};

}  // namespace

struct MpiCollectives::Impl {
    struct Bucket {
        bool active = false;
        int phase = 0;  // 1: pieces to their owners, 2: sums back from the owners, 3: done
        // Every rank receives the whole bucket from every peer and sums all of it (one round
        // instead of two): for two workers (the same bytes on the wire) and small buckets.
        bool direct = false;
        float* data = nullptr;
        int64_t count = 0;
        std::vector<float> staging;  // (size - 1) pieces of this rank's chunk, then the sum
        Exchange ex;
    };

    int rank = 0;
    int size = 1;
    double timeout = 30;
    MPI_Comm bucketComm = MPI_COMM_NULL;
    MPI_Comm hostComm = MPI_COMM_NULL;
    MPI_Comm controlComm = MPI_COMM_NULL;
    std::vector<Bucket> buckets;
    std::vector<double> hostStaging;
    Exchange hostEx;

    // Every MPI call runs under mpi_detail::callMutex() (MPI_THREAD_SERIALIZED); abort() from
    // another thread only takes it when free.
    mutable std::mutex stateMutex;  // error, notify
    std::atomic<bool> isBroken{false};
    std::string error;
    bool notifyPending = false;  // a locally caused break whose control messages are not sent
    std::vector<MPI_Request> controlSends;
    std::vector<std::string> controlPayloads;  // kept alive while their sends are in flight

    int64_t chunkBegin(int64_t count, int j) const { return count * j / size; }
    // The part of a bucket rank j owns (sums): [lo, hi).
    int64_t lo(const Bucket& b, int j) const { return b.direct ? 0 : chunkBegin(b.count, j); }
    int64_t hi(const Bucket& b, int j) const {
        return b.direct ? b.count : chunkBegin(b.count, j + 1);
    }

    // --- failure ----------------------------------------------------------------------------

    // Breaks the group with `message` (the first failure wins). `local`: this worker found the
    // failure, so its peers are told.
    Error breakWith(const std::string& message, bool local) {
        {
            std::lock_guard<std::mutex> g(stateMutex);
            if (!isBroken.load()) {
                error = message;
                notifyPending = local;
                isBroken.store(true);
            }
        }
        markMpiWorldBroken();
        sendNotifications();
        cancelPendingReceives();
        std::lock_guard<std::mutex> g(stateMutex);
        return err(error);
    }

    Error currentError() const {
        std::lock_guard<std::mutex> g(stateMutex);
        return err(error);
    }

    // Under the call mutex.
    void sendNotifications() {
        std::string reason;
        {
            std::lock_guard<std::mutex> g(stateMutex);
            if (!notifyPending) return;
            notifyPending = false;
            reason = error.substr(0, kMaxReasonBytes);
        }
        controlPayloads.push_back(reason);
        const std::string& payload = controlPayloads.back();
        for (int p = 0; p < size; ++p) {
            if (p == rank) continue;
            MPI_Request r = MPI_REQUEST_NULL;
            // A peer that is gone may refuse; the others still hear.
            if (MPI_Isend(payload.data(), static_cast<int>(payload.size()), MPI_CHAR, p,
                          kTagControl, controlComm, &r) == MPI_SUCCESS)
                controlSends.push_back(r);
        }
        const auto until = after(kNotifyFlushSeconds);
        Backoff backoff;
        while (Clock::now() < until) {
            int all = 0;
            if (MPI_Testall(static_cast<int>(controlSends.size()), controlSends.data(), &all,
                            MPI_STATUSES_IGNORE) != MPI_SUCCESS ||
                all)
                break;
            backoff.pause();
        }
    }

    // After a failure, receives still posted into the caller's buffers (or ours) are cancelled,
    // so a peer that wakes up later cannot write into memory the trainer has moved on from.
    // What cannot be cancelled (a transfer already under way from a dead peer) keeps its staging
    // memory: the buckets are never freed once broken.
    void cancelPendingReceives() {
        auto cancel = [](Exchange& ex) {
            for (size_t i = 0; i < ex.reqs.size(); ++i) {
                if (ex.reqs[i] == MPI_REQUEST_NULL || !ex.isRecv[i]) continue;
                MPI_Cancel(&ex.reqs[i]);
                int done = 0;
                MPI_Test(&ex.reqs[i], &done, MPI_STATUS_IGNORE);
            }
        };
        for (Bucket& b : buckets)
            if (b.active) cancel(b.ex);
        cancel(hostEx);
    }

    // A control message from a peer: true and its reason in `out`; a failed probe breaks the
    // group too. Under the call mutex.
    bool pollControl(const OpName& what, Error* out) {
        int flag = 0;
        MPI_Status st;
        if (Status s =
                TD_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kTagControl, controlComm, &flag, &st));
            !s.ok()) {
            *out = breakWith(what.str() + ": " + s.error(), true);
            return true;
        }
        if (!flag) return false;
        int len = 0;
        MPI_Get_count(&st, MPI_CHAR, &len);
        std::string reason(static_cast<size_t>(std::max(len, 0)), '\0');
        if (Status s = TD_MPI_CHECK(MPI_Recv(reason.data(), len, MPI_CHAR, st.MPI_SOURCE,
                                             kTagControl, controlComm, MPI_STATUS_IGNORE));
            !s.ok()) {
            *out = breakWith(what.str() + ": " + s.error(), true);
            return true;
        }
        *out = breakWith(
            what.str() + ": worker rank " + std::to_string(st.MPI_SOURCE) + " failed: " + reason,
            false);
        return true;
    }

    // --- buckets ----------------------------------------------------------------------------

    Status postScatter(int bucket, Bucket& b) {
        b.ex.clear();
        const int64_t mineLo = lo(b, rank), mineHi = hi(b, rank);
        const int mine = static_cast<int>(mineHi - mineLo);
        // The peers' pieces, then (for more than two) the running sum.
        b.staging.resize(static_cast<size_t>(size == 2 ? 1 : size) * static_cast<size_t>(mine));
        const int tag = 2 * bucket;
        int slot = 0;
        for (int p = 0; p < size; ++p) {
            if (p == rank) continue;
            if (mine > 0)
                TD_RETURN_IF_ERROR(b.ex.postRecv(
                    b.staging.data() + static_cast<size_t>(slot) * static_cast<size_t>(mine), mine,
                    MPI_FLOAT, p, tag, bucketComm));
            ++slot;
            const int64_t plo = lo(b, p), phi = hi(b, p);
            if (phi > plo)
                TD_RETURN_IF_ERROR(b.ex.postSend(b.data + plo, static_cast<int>(phi - plo),
                                                 MPI_FLOAT, p, tag, bucketComm));
        }
        b.phase = 1;
        return Status::success();
    }

    // Sums this rank's chunk in rank order: x0 + x1 + ... + x(size-1).
    void sumOwnChunk(Bucket& b) {
        const int64_t mineLo = lo(b, rank), mineHi = hi(b, rank);
        const size_t n = static_cast<size_t>(mineHi - mineLo);
        if (n == 0) return;
        float* own = b.data + mineLo;
        // Slot of peer p in staging: p for p < rank, p - 1 above; the last slot is the sum.
        auto src = [&](int p) -> const float* {
            if (p == rank) return own;
            return b.staging.data() + static_cast<size_t>(p < rank ? p : p - 1) * n;
        };
        if (size == 2) {  // in place: x0[i] + x1[i] reads element i before writing it
            const float* x0 = src(0);
            const float* x1 = src(1);
            for (size_t i = 0; i < n; ++i) own[i] = x0[i] + x1[i];
            return;
        }
        float* acc = b.staging.data() + static_cast<size_t>(size - 1) * n;
        std::memcpy(acc, src(0), n * sizeof(float));
        for (int p = 1; p < size; ++p) {
            const float* x = src(p);
            for (size_t i = 0; i < n; ++i) acc[i] += x[i];
        }
        std::memcpy(own, acc, n * sizeof(float));
    }

    Status postGather(int bucket, Bucket& b) {
        b.ex.clear();
        const int64_t mineLo = lo(b, rank), mineHi = hi(b, rank);
        const int tag = 2 * bucket + 1;
        for (int p = 0; p < size; ++p) {
            if (p == rank) continue;
            if (mineHi > mineLo)
                TD_RETURN_IF_ERROR(b.ex.postSend(b.data + mineLo, static_cast<int>(mineHi - mineLo),
                                                 MPI_FLOAT, p, tag, bucketComm));
            const int64_t plo = lo(b, p), phi = hi(b, p);
            if (phi > plo)
                TD_RETURN_IF_ERROR(b.ex.postRecv(b.data + plo, static_cast<int>(phi - plo),
                                                 MPI_FLOAT, p, tag, bucketComm));
        }
        b.phase = 2;
        return Status::success();
    }

    // Moves a bucket along as far as its requests allow.
    Status advance(int bucket, Bucket& b) {
        for (;;) {
            if (b.phase == 3) return Status::success();
            TD_RETURN_IF_ERROR(b.ex.test(MPI_FLOAT));
            if (!b.ex.done()) return Status::success();
            if (b.phase == 1) {
                sumOwnChunk(b);
                if (b.direct) {
                    b.phase = 3;
                    continue;
                }
                TD_RETURN_IF_ERROR(postGather(bucket, b));
            } else {
                b.phase = 3;
            }
        }
    }

    Status advanceAll() {
        for (size_t i = 0; i < buckets.size(); ++i) {
            Bucket& b = buckets[i];
            if (!b.active || b.phase == 3) continue;
            if (Status s = advance(static_cast<int>(i), b); !s.ok())
                return breakWith(
                    OpName{"all-reduce of bucket", static_cast<int>(i)}.str() + ": " + s.error(),
                    true);
        }
        return Status::success();
    }

    // --- the wait loop ------------------------------------------------------------------------

    // Polls until `step()` says done: every call moves every started bucket along first, then
    // `step` tests the operation waited for. Ends early on a peer's control message, a local
    // abort, the launcher's signal or the timeout; failures name the peers `attribution` still
    // waits for. `gather`: the operation now waits for sums from owners that may themselves be
    // waiting for another rank, so a timeout first listens briefly for their explanation.
    template <typename StepFn>
    Status waitLoop(const OpName& what, const Exchange& attribution, StepFn step,
                    const bool& gather) {
        Backoff backoff;
        const auto deadline = after(timeout);
        Clock::time_point namingDeadline{};
        bool naming = false;
        int signal = 0;
        for (;;) {
            TD_RETURN_IF_ERROR(advanceAll());
            Result<bool> stepped = step();
            if (!stepped.ok()) return breakWith(what.str() + ": " + stepped.error(), true);
            if (isBroken.load()) {  // abort() from another thread
                sendNotifications();
                cancelPendingReceives();
                return currentError();
            }
            if (Error remote; pollControl(what, &remote)) return remote;
            const bool done = *stepped;
            if (const int sig = mpiTerminationSignal(); sig != 0) {
                if (done || attribution.pendingPeers().empty())
                    return breakWith(
                        what.str() + ": the launcher is ending the job (" + signalName(sig) + ")",
                        true);
                if (signal == 0) {
                    signal = sig;
                    // With more than one peer, the one this rank waits for may itself wait for
                    // the dead one: give the peers a moment to say who.
                    namingDeadline =
                        size > 2 ? std::min(after(kNamingGraceSeconds), deadline) : Clock::now();
                }
            } else if (done) {
                return Status::success();
            }
            const auto now = Clock::now();
            if (signal != 0 && now >= namingDeadline)
                return breakWith(what.str() + ": " + rankList(attribution.pendingPeers()) +
                                     " stopped answering; the launcher is ending the job (" +
                                     signalName(signal) + ")",
                                 true);
            if (now >= deadline) {
                if (gather && size > 2 && !naming) {
                    naming = true;
                    namingDeadline = after(kNamingGraceSeconds);
                } else if (!naming || now >= namingDeadline) {
                    const std::vector<int> missing = attribution.pendingPeers();
                    return breakWith(
                        what.str() + ": " + rankList(missing) + " did not answer within " +
                            formatSeconds(timeout) + " (" +
                            (missing.size() == 1 ? "it exited or hangs" : "they exited or hang") +
                            ")",
                        true);
                }
            }
            backoff.pause();
        }
    }

    // Entry of every call: the group's state and what peers said meanwhile. Under the call mutex.
    Status enter(const OpName& what) {
        if (isBroken.load()) {
            sendNotifications();
            return currentError();
        }
        if (Error remote; pollControl(what, &remote)) return remote;
        return Status::success();
    }

    // Sends `count` values of `type` to every peer and receives theirs into `recvBase` (slot per
    // peer, `count` apart, in rank order with this rank's slot skipped when `skipOwnSlot`).
    Status exchangeAll(const OpName& what, const void* sendBuf, void* recvBase, int count,
                       MPI_Datatype type, size_t elemSize, int tag, bool skipOwnSlot) {
        hostEx.clear();
        int slot = 0;
        for (int p = 0; p < size; ++p) {
            if (p == rank) {
                if (!skipOwnSlot) ++slot;
                continue;
            }
            char* dst = static_cast<char*>(recvBase) +
                        static_cast<size_t>(slot) * static_cast<size_t>(count) * elemSize;
            ++slot;
            Status s = hostEx.postRecv(count ? dst : nullptr, count, type, p, tag, hostComm);
            if (s.ok()) s = hostEx.postSend(sendBuf, count, type, p, tag, hostComm);
            if (!s.ok()) return breakWith(what.str() + ": " + s.error(), true);
        }
        const bool noGather = false;
        return waitLoop(
            what, hostEx,
            [&]() -> Result<bool> {
                TD_RETURN_IF_ERROR(hostEx.test(type));
                return hostEx.done();
            },
            noGather);
    }
};

MpiCollectives::MpiCollectives(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MpiCollectives::~MpiCollectives() {
    if (!impl_) return;
    std::lock_guard<std::mutex> lock(mpi_detail::callMutex());
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (impl_->isBroken.load()) {
        // Requests to a dead or hung peer may still point into the staging buffers and the
        // communicators: keep both, reachable, for the rest of the process.
        static auto* kept = new std::vector<std::unique_ptr<Impl>>();
        kept->push_back(std::move(impl_));
        return;
    }
    if (!finalized) {
        for (MPI_Comm* c : {&impl_->bucketComm, &impl_->hostComm, &impl_->controlComm})
            if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    }
}

Result<std::unique_ptr<MpiCollectives>> MpiCollectives::create(MpiWorld& world,
                                                               double timeoutSeconds) {
    if (!(timeoutSeconds > 0))
        return err("the collectives' timeout must be a positive number of seconds, got " +
                   std::to_string(timeoutSeconds));
    std::lock_guard<std::mutex> lock(mpi_detail::callMutex());
    auto impl = std::make_unique<Impl>();
    impl->rank = world.rank();
    impl->size = world.size();
    impl->timeout = timeoutSeconds;
    for (MPI_Comm* c : {&impl->bucketComm, &impl->hostComm, &impl->controlComm}) {
        MPI_Request req = MPI_REQUEST_NULL;
        TD_RETURN_IF_ERROR(TD_MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, c, &req)));
        if (Status s = mpi_detail::pollRequest(
                &req, after(timeoutSeconds), "setting up the workers' collectives", timeoutSeconds);
            !s.ok()) {
            markMpiWorldBroken();
            return std::move(s).takeError();
        }
        TD_RETURN_IF_ERROR(TD_MPI_CHECK(MPI_Comm_set_errhandler(*c, MPI_ERRORS_RETURN)));
    }
    return std::unique_ptr<MpiCollectives>(new MpiCollectives(std::move(impl)));
}

int MpiCollectives::size() const {
    return impl_->size;
}

int MpiCollectives::rank() const {
    return impl_->rank;
}

double MpiCollectives::timeoutSeconds() const {
    return impl_->timeout;
}

bool MpiCollectives::broken() const {
    return impl_->isBroken.load();
}

std::string MpiCollectives::error() const {
    std::lock_guard<std::mutex> g(impl_->stateMutex);
    return impl_->error;
}

Status MpiCollectives::allReduceStart(int bucket, float* data, int64_t count) {
    Impl& m = *impl_;
    std::lock_guard<std::mutex> lock(mpi_detail::callMutex());
    const OpName what{"all-reduce of bucket", bucket};
    TD_RETURN_IF_ERROR(m.enter(what));
    TD_ASSERT_MSG(bucket >= 0 && bucket < kMaxBuckets, "bucket number out of range");
    TD_ASSERT(count >= 0 && (data != nullptr || count == 0));
    if (static_cast<size_t>(bucket) >= m.buckets.size())
        m.buckets.resize(static_cast<size_t>(bucket) + 1);
    Impl::Bucket& b = m.buckets[static_cast<size_t>(bucket)];
    TD_ASSERT_MSG(!b.active, "allReduceStart: bucket already started and not waited for");
    const bool direct = m.size == 2 || count <= kDirectMaxValues;
    if ((direct ? count : (count + m.size - 1) / m.size) > INT_MAX)
        return m.breakWith(what.str() + ": " + std::to_string(count) +
                               " values are too many for one MPI message per worker",
                           true);
    b.active = true;
    b.data = data;
    b.count = count;
    b.direct = direct;
    if (Status s = m.postScatter(bucket, b); !s.ok())
        return m.breakWith(what.str() + ": " + s.error(), true);
    // Small buckets often finish right here; large ones move on in later calls.
    return m.advanceAll();
}

Status MpiCollectives::allReduceWait(int bucket) {
    Impl& m = *impl_;
    std::lock_guard<std::mutex> lock(mpi_detail::callMutex());
    const OpName what{"all-reduce of bucket", bucket};
    TD_RETURN_IF_ERROR(m.enter(what));
    TD_ASSERT_MSG(bucket >= 0 && static_cast<size_t>(bucket) < m.buckets.size() &&
                      m.buckets[static_cast<size_t>(bucket)].active,
                  "allReduceWait: bucket was not started");
    Impl::Bucket& b = m.buckets[static_cast<size_t>(bucket)];
    bool gather = false;
    // advanceAll() in the loop tests the bucket's requests; the step only reads its phase.
    auto step = [&]() -> Result<bool> {
        gather = b.phase == 2;
        return b.phase == 3;
    };
    Status s = m.waitLoop(what, b.ex, step, gather);
    if (s.ok()) b.active = false;
    return s;
}

Status MpiCollectives::allReduceHost(double* values, int64_t count) {
    Impl& m = *impl_;
    std::lock_guard<std::mutex> lock(mpi_detail::callMutex());
    const OpName what{"all-reduce of host values"};
    TD_RETURN_IF_ERROR(m.enter(what));
    TD_ASSERT(count >= 0 && (values != nullptr || count == 0));
    if (count > INT_MAX / std::max(m.size, 1))
        return m.breakWith(what.str() + ": " + std::to_string(count) + " values are too many",
                           true);
    const size_t n = static_cast<size_t>(count);
    m.hostStaging.assign(static_cast<size_t>(m.size) * n, 0.0);
    TD_RETURN_IF_ERROR(m.exchangeAll(what, values, m.hostStaging.data(), static_cast<int>(count),
                                     MPI_DOUBLE, sizeof(double), kTagHostReduce, false));
    if (n)
        std::memcpy(m.hostStaging.data() + static_cast<size_t>(m.rank) * n, values,
                    n * sizeof(double));
    for (size_t i = 0; i < n; ++i) {
        double s = m.hostStaging[i];
        for (int p = 1; p < m.size; ++p) s += m.hostStaging[static_cast<size_t>(p) * n + i];
        values[i] = s;
    }
    return Status::success();
}

Status MpiCollectives::allGatherHost(const double* values, int64_t count, double* out) {
    Impl& m = *impl_;
    std::lock_guard<std::mutex> lock(mpi_detail::callMutex());
    const OpName what{"all-gather of host values"};
    TD_RETURN_IF_ERROR(m.enter(what));
    TD_ASSERT(count >= 0 && ((values != nullptr && out != nullptr) || count == 0));
    if (count > INT_MAX / std::max(m.size, 1))
        return m.breakWith(what.str() + ": " + std::to_string(count) + " values are too many",
                           true);
    const size_t n = static_cast<size_t>(count);
    TD_RETURN_IF_ERROR(m.exchangeAll(what, values, out, static_cast<int>(count), MPI_DOUBLE,
                                     sizeof(double), kTagHostGather, false));
    if (n) std::memmove(out + static_cast<size_t>(m.rank) * n, values, n * sizeof(double));
    return Status::success();
}

Status MpiCollectives::barrier() {
    Impl& m = *impl_;
    std::lock_guard<std::mutex> lock(mpi_detail::callMutex());
    const OpName what{"barrier"};
    TD_RETURN_IF_ERROR(m.enter(what));
    return m.exchangeAll(what, nullptr, nullptr, 0, MPI_BYTE, 1, kTagBarrier, true);
}

void MpiCollectives::abort(const std::string& reason) {
    Impl& m = *impl_;
    {
        std::lock_guard<std::mutex> g(m.stateMutex);
        if (!m.isBroken.load()) {
            m.error = reason;
            m.notifyPending = true;
            m.isBroken.store(true);
        }
    }
    markMpiWorldBroken();
    // The thread in a wait (if any) holds the call mutex; it sends the messages at its next poll.
    std::unique_lock<std::mutex> lock(mpi_detail::callMutex(), std::try_to_lock);
    if (!lock.owns_lock()) return;
    m.sendNotifications();
    m.cancelPendingReceives();
}

#else  // no MPI in this build

struct MpiCollectives::Impl {};

MpiCollectives::MpiCollectives(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MpiCollectives::~MpiCollectives() = default;

Result<std::unique_ptr<MpiCollectives>> MpiCollectives::create(MpiWorld&, double) {
    return err(kNoMpiSupport);
}

// Never constructed in a build without MPI.
int MpiCollectives::size() const {
    return 1;
}
int MpiCollectives::rank() const {
    return 0;
}
double MpiCollectives::timeoutSeconds() const {
    return 0;
}
bool MpiCollectives::broken() const {
    return true;
}
std::string MpiCollectives::error() const {
    return kNoMpiSupport;
}
Status MpiCollectives::allReduceStart(int, float*, int64_t) {
    return err(kNoMpiSupport);
}
Status MpiCollectives::allReduceWait(int) {
    return err(kNoMpiSupport);
}
Status MpiCollectives::allReduceHost(double*, int64_t) {
    return err(kNoMpiSupport);
}
Status MpiCollectives::allGatherHost(const double*, int64_t, double*) {
    return err(kNoMpiSupport);
}
Status MpiCollectives::barrier() {
    return err(kNoMpiSupport);
}
void MpiCollectives::abort(const std::string&) {}

#endif

}  // namespace td
