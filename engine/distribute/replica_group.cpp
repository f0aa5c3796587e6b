#include "engine/distribute/replica_group.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

namespace td {

namespace {

using Clock = std::chrono::steady_clock;

enum class OpKind { Reduce, HostReduce, Gather, Barrier };

const char* opTitle(OpKind k) {
    switch (k) {
        case OpKind::Reduce:
            return "all-reduce";
        case OpKind::HostReduce:
            return "all-reduce of host values";
        case OpKind::Gather:
            return "all-gather";
        case OpKind::Barrier:
            return "barrier";
    }
    return "collective";
}

// One collective operation: the n-th call of every replica.
struct Op {
    OpKind kind = OpKind::Reduce;
    int bucket = -1;
    int64_t count = -1;
    std::vector<float*> data;           // Reduce: each replica's buffer
    std::vector<const double*> hostIn;  // HostReduce / Gather: each replica's values
    std::vector<char> posted;           // replica r has called
    std::vector<char> chunkClaimed;     // Reduce: replica r took its chunk
    int postedCount = 0;
    int chunksDone = 0;
    bool outerDone = false;          // the process-level step finished (or not needed)
    std::vector<double> hostResult;  // HostReduce / Gather: the result every replica copies
    int finished = 0;                // replicas that returned from the operation
};

}  // namespace

struct ReplicaGroup::State {
    int n = 1;
    double timeoutSeconds = 60;
    Collectives* outer = nullptr;
    std::mutex mu;
    std::condition_variable cv;
    std::map<int64_t, Op> ops;
    std::vector<int64_t> nextOp;                   // per replica: index of its next operation
    std::vector<std::map<int, int64_t>> bucketOp;  // per replica: started bucket -> operation
    std::string broken;                            // non-empty: every call fails with it

    // Bumped (under mu) on every change a waiter may be waiting for: waiters spin on it before
    // they sleep on cv.
    std::atomic<uint64_t> changes{0};

    void signal() {
        changes.fetch_add(1, std::memory_order_release);
        cv.notify_all();
    }

    Error brokenError() const { return err(broken); }

    void breakGroup(const std::string& reason) {
        if (broken.empty()) broken = reason;
        signal();
        // The peers in other processes must not wait for this one either.
        if (outer) outer->abort(reason);
    }

    // Chunk r of a bucket of `count` floats split n ways on 16-float (cache line) boundaries.
    std::pair<int64_t, int64_t> chunk(int64_t count, int r) const {
        auto edge = [&](int k) {
            const int64_t e = count * k / n;
            return k == n ? count : std::min(count, (e + 15) / 16 * 16);
        };
        return {edge(r), edge(r + 1)};
    }

    // Sums chunk r over the replicas in rank order into replica 0's copy, then copies it to the
    // others. Called without the lock: chunks are disjoint and every buffer is posted.
    static void reduceChunk(const Op& op, int64_t lo, int64_t hi) {
        if (hi <= lo) return;
        float* d0 = op.data[0];
        for (size_t k = 1; k < op.data.size(); ++k) {
            const float* dk = op.data[k];
            for (int64_t i = lo; i < hi; ++i) d0[i] += dk[i];
        }
        for (size_t k = 1; k < op.data.size(); ++k)
            std::memcpy(op.data[k] + lo, d0 + lo, static_cast<size_t>(hi - lo) * sizeof(float));
    }

    std::string missing(const Op& op, bool posting) const {
        std::ostringstream s;
        int count = 0;
        for (int r = 0; r < n; ++r) {
            const bool absent = posting ? !op.posted[static_cast<size_t>(r)] : false;
            if (absent) s << (count++ ? ", " : "") << r;
        }
        return (count > 1 ? "replicas " : "replica ") + s.str();
    }

    std::string what(const Op& op) const {
        std::string w = opTitle(op.kind);
        if (op.kind == OpKind::Reduce) w += " of bucket " + std::to_string(op.bucket);
        return w;
    }

    // Waits for pred under the lock until the deadline; fails when the group breaks or time
    // runs out (the message is built by `onTimeout`).
    template <typename Pred, typename OnTimeout>
    Status waitFor(std::unique_lock<std::mutex>& lk, Clock::time_point deadline, Pred pred,
                   OnTimeout onTimeout) {
        while (!pred()) {
            if (!broken.empty()) return brokenError();
            // Spin a little without the lock first: the replicas run on their own cores and at
            // small steps a wake-up through the kernel costs more than the wait itself.
            const uint64_t seen = changes.load(std::memory_order_acquire);
            lk.unlock();
            const auto t0 = Clock::now();
            bool changed = false;
            for (int i = 0; !changed; ++i) {
                if ((i & 63) == 63 && Clock::now() - t0 > std::chrono::microseconds(50)) break;
#if defined(__x86_64__)
                __builtin_ia32_pause();
#endif
                changed = changes.load(std::memory_order_acquire) != seen;
            }
            lk.lock();
            if (changed || pred()) continue;
            if (!broken.empty()) return brokenError();
            if (cv.wait_until(lk, deadline) == std::cv_status::timeout && !pred()) {
                if (!broken.empty()) return brokenError();
                breakGroup(onTimeout());
                return brokenError();
            }
        }
        if (!broken.empty()) return brokenError();
        return Status::success();
    }

    Clock::time_point deadline() const {
        return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(timeoutSeconds));
    }

    std::string timeoutText(const Op& op) const {
        std::ostringstream t;
        t << timeoutSeconds;
        return what(op) + ": " + missing(op, true) + " did not arrive within " + t.str() +
               " s (a replica failed or hangs)";
    }

    // Registers replica r's call as the next operation of its sequence.
    Result<int64_t> post(int r, OpKind kind, int bucket, int64_t count) {
        if (!broken.empty()) return brokenError();
        const int64_t id = nextOp[static_cast<size_t>(r)]++;
        Op& op = ops[id];
        if (op.posted.empty()) {
            op.kind = kind;
            op.bucket = bucket;
            op.count = count;
            op.posted.assign(static_cast<size_t>(n), 0);
            op.chunkClaimed.assign(static_cast<size_t>(n), 0);
            op.data.assign(static_cast<size_t>(n), nullptr);
            op.hostIn.assign(static_cast<size_t>(n), nullptr);
            op.outerDone = outer == nullptr;
        } else if (op.kind != kind || op.bucket != bucket || op.count != count) {
            breakGroup("collectives out of step: replica " + std::to_string(r) + " called " +
                       opTitle(kind) +
                       (kind == OpKind::Reduce ? " of bucket " + std::to_string(bucket) : "") +
                       " with " + std::to_string(count) + " values where another replica called " +
                       what(op) + " with " + std::to_string(op.count));
            return brokenError();
        }
        op.posted[static_cast<size_t>(r)] = 1;
        if (++op.postedCount == n) signal();
        return id;
    }

    void finish(int64_t id) {
        Op& op = ops.at(id);
        if (++op.finished == n) ops.erase(id);
    }

    // Does replica r's chunk of every fully posted all-reduce it has not done yet.
    void progress(std::unique_lock<std::mutex>& lk, int r) {
        for (auto& [id, op] : ops) {
            if (op.kind != OpKind::Reduce || op.postedCount != n ||
                op.chunkClaimed[static_cast<size_t>(r)])
                continue;
            op.chunkClaimed[static_cast<size_t>(r)] = 1;
            const auto [lo, hi] = chunk(op.count, r);
            const Op* p = &op;  // std::map nodes are stable; the op lives until all finish
            lk.unlock();
            reduceChunk(*p, lo, hi);
            lk.lock();
            if (++op.chunksDone == n) signal();
        }
    }
};

namespace {

class ReplicaHandle final : public Collectives {
  public:
    ReplicaHandle(ReplicaGroup::State& s, int r) : s_(s), r_(r) {}

    int size() const override { return s_.n * (s_.outer ? s_.outer->size() : 1); }
    int rank() const override { return (s_.outer ? s_.outer->rank() * s_.n : 0) + r_; }

    Status allReduceStart(int bucket, float* data, int64_t count) override {
        std::unique_lock<std::mutex> lk(s_.mu);
        TD_ASSIGN_OR_RETURN(int64_t id, s_.post(r_, OpKind::Reduce, bucket, count));
        s_.ops.at(id).data[static_cast<size_t>(r_)] = data;
        s_.bucketOp[static_cast<size_t>(r_)][bucket] = id;
        s_.progress(lk, r_);
        return Status::success();
    }

    Status allReduceWait(int bucket) override {
        std::unique_lock<std::mutex> lk(s_.mu);
        if (!s_.broken.empty()) return s_.brokenError();
        auto& started = s_.bucketOp[static_cast<size_t>(r_)];
        auto it = started.find(bucket);
        if (it == started.end())
            return err("all-reduce of bucket " + std::to_string(bucket) +
                       ": waited for a bucket that was not started");
        const int64_t id = it->second;
        started.erase(it);
        Op& op = s_.ops.at(id);
        const auto deadline = s_.deadline();
        TD_RETURN_IF_ERROR(s_.waitFor(
            lk, deadline, [&] { return op.postedCount == s_.n; },
            [&] { return s_.timeoutText(op); }));
        s_.progress(lk, r_);
        TD_RETURN_IF_ERROR(s_.waitFor(
            lk, deadline, [&] { return op.chunksDone == s_.n; },
            [&] { return s_.what(op) + ": a replica did not finish its share in time"; }));
        if (s_.outer) {
            if (r_ == 0) {
                // Replica 0 sums the local result across processes, then hands it out.
                lk.unlock();
                Status st = s_.outer->allReduceStart(op.bucket, op.data[0], op.count);
                if (st.ok()) st = s_.outer->allReduceWait(op.bucket);
                if (st.ok())
                    for (int k = 1; k < s_.n; ++k)
                        std::memcpy(op.data[static_cast<size_t>(k)], op.data[0],
                                    static_cast<size_t>(op.count) * sizeof(float));
                lk.lock();
                if (!st.ok()) {
                    s_.breakGroup(st.error());
                    return s_.brokenError();
                }
                op.outerDone = true;
                s_.signal();
            } else {
                // The process-level step has its own timeout; waiting twice as long here only
                // guards against a local replica 0 that hangs.
                const auto outerDeadline =
                    deadline + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(s_.timeoutSeconds));
                TD_RETURN_IF_ERROR(s_.waitFor(
                    lk, outerDeadline, [&] { return op.outerDone; },
                    [&] {
                        return s_.what(op) +
                               ": replica 0 did not finish the step across workers in time";
                    }));
            }
        }
        s_.finish(id);
        return Status::success();
    }

    Status allReduceHost(double* values, int64_t count) override {
        return hostOp(OpKind::HostReduce, values, count, values);
    }
    Status allGatherHost(const double* values, int64_t count, double* out) override {
        return hostOp(OpKind::Gather, values, count, out);
    }
    Status barrier() override { return hostOp(OpKind::Barrier, nullptr, 0, nullptr); }

    void abort(const std::string& reason) override {
        std::lock_guard<std::mutex> lk(s_.mu);
        s_.breakGroup(reason);
    }

  private:
    // Host operations: every replica posts its values; the last to arrive computes the result (in
    // rank order), then every replica copies it out.
    Status hostOp(OpKind kind, const double* in, int64_t count, double* out) {
        std::unique_lock<std::mutex> lk(s_.mu);
        TD_ASSIGN_OR_RETURN(int64_t id, s_.post(r_, kind, -1, count));
        Op& op = s_.ops.at(id);
        op.hostIn[static_cast<size_t>(r_)] = in;
        const auto deadline = s_.deadline();
        if (op.postedCount == s_.n) {
            // Last to arrive: compute the local result, then the process-level one.
            const size_t c = static_cast<size_t>(count);
            if (kind == OpKind::HostReduce) {
                op.hostResult.assign(c, 0.0);
                for (int k = 0; k < s_.n; ++k)
                    for (size_t i = 0; i < c; ++i)
                        op.hostResult[i] += op.hostIn[static_cast<size_t>(k)][i];
            } else if (kind == OpKind::Gather) {
                op.hostResult.resize(c * static_cast<size_t>(s_.n));
                for (int k = 0; k < s_.n; ++k)
                    std::copy(op.hostIn[static_cast<size_t>(k)],
                              op.hostIn[static_cast<size_t>(k)] + c,
                              op.hostResult.begin() + static_cast<std::ptrdiff_t>(c * k));
            }
            if (s_.outer) {
                lk.unlock();
                Status st = Status::success();
                std::vector<double> all;
                if (kind == OpKind::HostReduce) {
                    st = s_.outer->allReduceHost(op.hostResult.data(), count);
                } else if (kind == OpKind::Gather) {
                    all.resize(op.hostResult.size() * static_cast<size_t>(s_.outer->size()));
                    st = s_.outer->allGatherHost(op.hostResult.data(),
                                                 static_cast<int64_t>(op.hostResult.size()),
                                                 all.data());
                } else {
                    st = s_.outer->barrier();
                }
                lk.lock();
                if (!st.ok()) {
                    s_.breakGroup(st.error());
                    return s_.brokenError();
                }
                if (kind == OpKind::Gather) op.hostResult = std::move(all);
                op.outerDone = true;
            }
            s_.signal();
        } else {
            TD_RETURN_IF_ERROR(s_.waitFor(
                lk, deadline, [&] { return op.postedCount == s_.n; },
                [&] { return s_.timeoutText(op); }));
        }
        if (s_.outer) {
            const auto outerDeadline =
                deadline + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(s_.timeoutSeconds));
            TD_RETURN_IF_ERROR(s_.waitFor(
                lk, outerDeadline, [&] { return op.outerDone; },
                [&] { return s_.what(op) + ": the step across workers did not finish in time"; }));
        }
        if (out && kind != OpKind::Barrier)
            std::copy(op.hostResult.begin(), op.hostResult.end(), out);
        s_.finish(id);
        return Status::success();
    }

    ReplicaGroup::State& s_;
    int r_;
};

}  // namespace

ReplicaGroup::ReplicaGroup(int replicas, double timeoutSeconds, Collectives* outer)
    : state_(std::make_unique<State>()) {
    TD_ASSERT(replicas >= 1);
    state_->n = replicas;
    state_->timeoutSeconds = timeoutSeconds;
    state_->outer = outer;
    state_->nextOp.assign(static_cast<size_t>(replicas), 0);
    state_->bucketOp.resize(static_cast<size_t>(replicas));
    for (int r = 0; r < replicas; ++r)
        handles_.push_back(std::make_unique<ReplicaHandle>(*state_, r));
}

ReplicaGroup::~ReplicaGroup() = default;

int ReplicaGroup::replicas() const {
    return state_->n;
}

Collectives& ReplicaGroup::replica(int r) {
    return *handles_.at(static_cast<size_t>(r));
}

void ReplicaGroup::abort(const std::string& reason) {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->breakGroup(reason);
}

}  // namespace td
