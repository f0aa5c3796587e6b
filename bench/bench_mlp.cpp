// Side-by-side MLP and CNN benchmark: TrainDeck against the reference trainers of
// bench/reference_mlp.py (PyTorch 2.x eager and torch.compile, Debian's PyTorch 1.13, Keras) on
// Fashion-MNIST: same model, data, optimizer, dropout, batch and thread count, in one invocation.
// cnn-64 is projects/fashion_mnist_cnn.json's model (two Conv2D, BatchNormalization, pooling).
// Every trainer runs as its own child process, so peak memory (ru_maxrss of the child) is measured
// the same way for all. Prints steady samples/s (epochs after the first), test accuracy, peak RSS
// and TrainDeck's ratios to each reference. With --rounds R, TrainDeck and each reference run R
// times in turn, and the median of the R ratios is printed too: on a machine whose speed drifts
// (a shared virtual machine), a pair of runs back to back compares better than two runs minutes
// apart.
//
//   traindeck_bench [--epochs 3] [--threads 2] [--rounds 1]
//                   [--models seed-32,seed-256,wide-256,large-1024,cnn-64]
//                   [--frameworks torch,torch-compile,torch-debian,keras,torch-cuda,
//                                 torch-compile-cuda,torch-bf16-cuda,torch-compile-bf16-cuda|none]
//                   [--python VENV/bin/python] [--python-debian /usr/bin/python3]
//                   [--strategies one,mirrored-2,mpi-2]
//                   [--variants f32,unfused,bf16,f16,nograph,bf16-inline-update,bf16-f32-conv]
//                   [--device cuda:0] [--matmul-rate]
//
// --matmul-rate runs traindeck_bench_matmul (oneDNN's products alone at the MLP's shapes, as many
// steps as TrainDeck's timed epochs) right after each one-device TrainDeck run on the CPU and
// prints the share of that rate the run reached, then the median over the rounds: both measured
// in the same minute, where two invocations apart measured the same trainer at 81% and 109% of it
// on a drifting machine.
// --variants adds TrainDeck rows for the same model: unfused (every fusing pass off), bf16
// (mixed_bfloat16; emulated by oneDNN on a CPU without AMX-BF16 or AVX512-BF16, and labelled so)
// and f16 (mixed_float16), each with its ratio to the first row; torch-bf16 and keras-bf16 are the
// references' bf16 runs (autocast, mixed_bfloat16). On a GPU (--device cuda:N), nograph runs the
// step instruction by instruction instead of replaying its CUDA Graph (TRAINDECK_CUDA_GRAPHS=0),
// bf16-inline-update runs mixed_bfloat16 with the optimizer update after the backward pass
// instead of beside it on a second stream (pass cuda_side_update off), bf16-f32-conv with its
// convolutions in f32 instead of bf16 (pass cuda_half_conv off; models with convolutions
// only), and the *-cuda references are
// PyTorch on the first GPU, eager or torch.compile, f32 or bf16 autocast. large-1024
// (784-4096-4096-10 at batch 1024) is the GPU-sized MLP.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/cpu_isa.h"
#include "engine/io/project.h"
#include "tests/source_dir.h"

namespace {

struct Outcome {
    bool ok = false;
    double samplesPerSecond = 0;
    double testAccuracy = 0;
    double peakRssMiB = 0;
    double allReduceKiB = 0;    // per replica per step (several replicas)
    double allReduceShare = 0;  // of the replicas' time, mean over replicas
    std::string version, error;
};

// Runs argv with extra environment, captures stdout, returns exit status and child peak RSS.
int runChild(const std::vector<std::string>& argv, const std::vector<std::string>& env,
             std::string* out, double* peakMiB) {
    int pipefd[2];
    if (pipe(pipefd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipefd[1], STDOUT_FILENO);
        close(pipefd[0]);
        close(pipefd[1]);
        for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
        std::vector<char*> a;
        for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
        a.push_back(nullptr);
        execvp(a[0], a.data());
        std::perror(a[0]);
        _exit(127);
    }
    close(pipefd[1]);
    char buf[4096];
    ssize_t n;
    while ((n = read(pipefd[0], buf, sizeof buf)) > 0) out->append(buf, static_cast<size_t>(n));
    close(pipefd[0]);
    int status = 0;
    struct rusage ru {};
    wait4(pid, &status, 0, &ru);
    *peakMiB = static_cast<double>(ru.ru_maxrss) / 1024.0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string join(const std::vector<int>& v) {
    std::string s;
    for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return s;
}

// oneDNN's matrix products alone at the shapes of an MLP's step (traindeck_bench_matmul, run
// right after a TrainDeck run so that both see the machine in the same state): the samples/s
// they would allow if nothing else took time; 0 and *error set when it could not be measured.
double matmulSamplesPerSecond(const std::string& binary, int inputs, const std::vector<int>& hidden,
                              int batch, int threads, int steps, std::string* error) {
    const std::vector<std::string> argv{binary,
                                        "--layers",
                                        std::to_string(inputs) + "," + join(hidden) + ",10",
                                        "--batch",
                                        std::to_string(batch),
                                        "--threads",
                                        std::to_string(threads),
                                        "--repeat",
                                        std::to_string(steps)};
    std::string out;
    double peak = 0;
    const int rc = runChild(argv, {"OMP_NUM_THREADS=" + std::to_string(threads)}, &out, &peak);
    if (rc != 0) {
        *error = binary + " exited with " + std::to_string(rc);
        return 0;
    }
    static const std::regex rate(
        R"(step of matmuls: [0-9.]+ us, [0-9.]+ GFLOP/s, ([0-9.]+) samples/s)");
    std::smatch m;
    if (!std::regex_search(out, m, rate)) {
        *error = "no 'step of matmuls' line in the output of " + binary;
        return 0;
    }
    return std::stod(m[1]);
}

double medianOf(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A TrainDeck strategy row: "one" (one device), "mirrored-N" (N CPU replicas in one process),
// "mpi-N" (MultiWorkerMirrored, N processes under mpirun, one replica each).
struct StrategyRun {
    std::string key;
    std::string type = "one_device";
    int replicas = 1;
    bool mpi = false;
    std::vector<std::string> env;  // extra environment (a variant's)
};

Outcome runTrainDeck(const std::string& binary, const std::string& projectPath, int epochs,
                     int batch, int threads, const std::string& db, const StrategyRun& st) {
    Outcome o;
    std::string out;
    // Every replica (thread group or process) gets its share of the threads.
    const int each = std::max(1, threads / st.replicas);
    std::vector<std::string> env{"OMP_NUM_THREADS=" + std::to_string(st.mpi ? each : threads)};
    env.insert(env.end(), st.env.begin(), st.env.end());
    std::vector<std::string> argv;
    if (st.mpi) {
        argv = {"mpirun",
                "-np",
                std::to_string(st.replicas),
                "--oversubscribe",
                "--bind-to",
                "none",
                "-x",
                "OMP_NUM_THREADS"};
        if (geteuid() == 0) argv.push_back("--allow-run-as-root");
    }
    for (const std::string& a : {binary, std::string("train"), projectPath, std::string("--epochs"),
                                 std::to_string(epochs), std::string("--batch-size"),
                                 std::to_string(batch), std::string("--plain"), std::string("--db"),
                                 db, std::string("--run-name"), std::string("bench")})
        argv.push_back(a);
    int rc = runChild(argv, env, &out, &o.peakRssMiB);
    if (rc != 0) {
        o.error = "traindeck (" + st.key + ") exited with " + std::to_string(rc);
        return o;
    }
    {
        std::regex kib(R"(All-reduce: ([0-9.]+) KiB)");
        std::regex share(R"(all-reduce [0-9.]+ s \(([0-9.]+)%\))");
        std::istringstream is(out);
        std::string line;
        std::smatch m;
        int shares = 0;
        while (std::getline(is, line)) {
            if (std::regex_search(line, m, kib)) o.allReduceKiB = std::stod(m[1]);
            if (std::regex_search(line, m, share)) {
                o.allReduceShare += std::stod(m[1]);
                ++shares;
            }
        }
        if (shares) o.allReduceShare /= shares;
    }
    // Epoch lines: "1875/1875 3s 1517us/step 39548 samples/s - ..."
    std::regex epochLine(R"((\d+)/(\d+) \S+ \S+us/step ([0-9.]+) samples/s)");
    std::regex testLine(R"(test_accuracy: ([0-9.]+))");
    std::vector<double> rates;
    std::istringstream is(out);
    std::string line;
    std::smatch m;
    while (std::getline(is, line)) {
        if (std::regex_search(line, m, epochLine)) rates.push_back(std::stod(m[3]));
        if (std::regex_search(line, m, testLine)) o.testAccuracy = std::stod(m[1]);
    }
    if (rates.empty()) {
        o.error = "no epoch lines in traindeck output";
        return o;
    }
    // Steady rate: harmonic mean over epochs after the first (= samples / time), as the
    // reference script computes it.
    double inv = 0;
    size_t first = rates.size() > 1 ? 1 : 0;
    for (size_t i = first; i < rates.size(); ++i) inv += 1.0 / rates[i];
    o.samplesPerSecond = static_cast<double>(rates.size() - first) / inv;
    o.version = TRAINDECK_VERSION;
    o.ok = true;
    return o;
}

// One reference row: which interpreter runs reference_mlp.py with which options.
struct Reference {
    std::string key;    // as given to --frameworks
    std::string label;  // printed before the version
    bool debianPython;  // true: --python-debian, false: --python
    std::string framework;
    bool compile;
    bool bf16 = false;  // --precision bf16: torch autocast, Keras mixed_bfloat16
    bool cuda = false;  // --device cuda: PyTorch on the first GPU
};

const std::vector<Reference>& knownReferences() {
    static const std::vector<Reference> refs{
        {"torch", "PyTorch", false, "torch", false},
        {"torch-compile", "PyTorch compile", false, "torch", true},
        {"torch-debian", "PyTorch Debian", true, "torch", false},
        {"keras", "Keras", false, "keras", false},
        {"torch-bf16", "PyTorch bf16", false, "torch", false, true},
        {"keras-bf16", "Keras bf16", false, "keras", false, true},
        {"torch-cuda", "PyTorch GPU", false, "torch", false, false, true},
        {"torch-compile-cuda", "PyTorch GPU compile", false, "torch", true, false, true},
        {"torch-bf16-cuda", "PyTorch GPU bf16", false, "torch", false, true, true},
        {"torch-compile-bf16-cuda", "PyTorch GPU compile bf16", false, "torch", true, true, true},
    };
    return refs;
}

Outcome runReference(const std::string& python, const std::string& script, const Reference& ref,
                     const std::vector<int>& hidden, double dropout, int epochs, int batch,
                     int threads, bool cnn) {
    Outcome o;
    std::string out;
    std::vector<std::string> env{"OMP_NUM_THREADS=" + std::to_string(threads),
                                 "TF_CPP_MIN_LOG_LEVEL=2", "KERAS_BACKEND=tensorflow"};
    std::vector<std::string> argv{python,        script,
                                  "--framework", ref.framework,
                                  "--hidden",    join(hidden),
                                  "--dropout",   std::to_string(dropout),
                                  "--batch",     std::to_string(batch),
                                  "--epochs",    std::to_string(epochs),
                                  "--threads",   std::to_string(threads)};
    if (ref.compile) argv.push_back("--compile");
    if (cnn) {
        argv.push_back("--model");
        argv.push_back("cnn");
    }
    if (ref.bf16) {
        argv.push_back("--precision");
        argv.push_back("bf16");
    }
    if (ref.cuda) {
        argv.push_back("--device");
        argv.push_back("cuda");
        // On the GPU the CNN's images and weights channels-last, as TrainDeck lays them out (and
        // as cuDNN's fastest convolutions want them).
        if (cnn) argv.push_back("--channels-last");
    }
    int rc = runChild(argv, env, &out, &o.peakRssMiB);
    if (rc != 0) {
        o.error = ref.key + ": " + python + " " + script + " exited with " + std::to_string(rc) +
                  " (its message is above; installer/bench.sh installs the references)";
        return o;
    }
    auto last = out.rfind('{');
    auto j =
        nlohmann::json::parse(last == std::string::npos ? "" : out.substr(last), nullptr, false);
    if (j.is_discarded() || !j.contains("samples_per_s")) {
        o.error = ref.key + ": " + script + " printed no result line";
        return o;
    }
    o.samplesPerSecond = j.value("samples_per_s", 0.0);
    o.testAccuracy = j.value("test_accuracy", 0.0);
    o.version = j.value("version", "");
    o.ok = true;
    return o;
}

std::vector<std::string> splitList(const std::string& text) {
    std::vector<std::string> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ','))
        if (!item.empty()) out.push_back(item);
    return out;
}

// The interpreter of the virtual environment installer/bench.sh makes, else python3 on PATH.
std::string defaultVenvPython() {
    namespace fs = std::filesystem;
    fs::path venv;
    if (const char* v = std::getenv("TRAINDECK_BENCH_VENV"); v && *v) {
        venv = v;
    } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
        venv = fs::path(xdg) / "traindeck/bench-venv";
    } else if (const char* home = std::getenv("HOME"); home && *home) {
        venv = fs::path(home) / ".cache/traindeck/bench-venv";
    }
    std::error_code ec;
    if (!venv.empty() && fs::exists(venv / "bin/python", ec)) return (venv / "bin/python").string();
    return "python3";
}

void printRow(const std::string& model, int batch, const std::string& trainer, const Outcome& o,
              const Outcome* ours) {
    std::printf("%-20s %5d  %-34s %10.0f %8.4f %9.1f", model.c_str(), batch,
                trainer.substr(0, 34).c_str(), o.samplesPerSecond, o.testAccuracy, o.peakRssMiB);
    if (ours && ours->ok && o.ok && o.samplesPerSecond > 0 && o.peakRssMiB > 0)
        std::printf(" %8.2f %7.2f", ours->samplesPerSecond / o.samplesPerSecond,
                    ours->peakRssMiB / o.peakRssMiB);
    std::printf("\n");
    if (!o.ok) std::printf("  %s\n", o.error.c_str());
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"TrainDeck MLP benchmark against PyTorch / Keras, side by side"};
    int epochs = 3, threads = 2, rounds = 1;
    std::string frameworks = "torch,torch-compile,torch-debian,keras";
    std::string models = "seed-32,seed-256,wide-256";
    std::string root = td::dev::kSourceDir;
    std::string reference = root + "/bench/reference_mlp.py";
    std::string binary;
    std::string jsonOut;
    std::string python = defaultVenvPython(), pythonDebian = "/usr/bin/python3";
    app.add_option("--python", python,
                   "Interpreter with PyTorch 2.x and Keras (default: the bench virtual "
                   "environment, else python3)");
    app.add_option("--python-debian", pythonDebian, "Interpreter with Debian's python3-torch");
    app.add_option("--epochs", epochs, "Epochs per run (the first is warm-up)")
        ->check(CLI::Range(2, 100));
    app.add_option("--threads", threads, "Threads for every trainer")->check(CLI::PositiveNumber);
    app.add_option("--rounds", rounds,
                   "Runs of TrainDeck and of each reference, alternating; prints the median "
                   "ratio of each round's pair (for a machine whose speed drifts)")
        ->check(CLI::Range(1, 20));
    app.add_option("--frameworks", frameworks,
                   "References: torch, torch-compile, torch-debian, keras, torch-bf16, "
                   "keras-bf16, torch-cuda, torch-compile-cuda, torch-bf16-cuda, "
                   "torch-compile-bf16-cuda (PyTorch on the first GPU), or none");
    app.add_option("--models", models,
                   "Configurations: seed-32, seed-256, wide-256, large-1024, cnn-64");
    app.add_option("--reference", reference, "Path of reference_mlp.py");
    app.add_option("--traindeck", binary, "traindeck binary (default: next to this program)");
    app.add_option("--json", jsonOut, "Also write the results as JSON to this file");
    std::string strategies = "one";
    app.add_option("--strategies", strategies,
                   "TrainDeck strategies: one, mirrored-N (N CPU replicas), mpi-N (N processes "
                   "under mpirun); rows after the first print their scaling against it");
    std::string device;
    app.add_option("--device", device,
                   "TrainDeck's device for its one-device rows, e.g. cuda:0 (default: the "
                   "project's, the CPU)");
    bool matmulRate = false;
    app.add_flag("--matmul-rate", matmulRate,
                 "After each one-device TrainDeck run of an MLP on the CPU, oneDNN's matrix "
                 "products alone at its shapes (traindeck_bench_matmul, next to this program): "
                 "the share of their rate the run reached, side by side, and its median");
    std::string variants = "f32";
    app.add_option("--variants", variants,
                   "TrainDeck variants on one device: f32, unfused (fusion off), bf16 "
                   "(mixed_bfloat16), f16 (mixed_float16), nograph (on a GPU: no CUDA Graph "
                   "replay), bf16-inline-update and bf16-f32-conv (on a GPU: mixed_bfloat16 with "
                   "the update after the backward pass, or with f32 convolutions); rows after the "
                   "first print their ratio to it");
    CLI11_PARSE(app, argc, argv);
    auto gpuOnly = [](const std::string& v) {
        return v == "nograph" || v == "bf16-inline-update" || v == "bf16-f32-conv";
    };
    for (const std::string& v : splitList(variants))
        if (v != "f32" && v != "unfused" && v != "bf16" && v != "f16" && !gpuOnly(v)) {
            std::fprintf(stderr,
                         "bench: --variants: unknown variant '%s' (expected f32, unfused, bf16, "
                         "f16, nograph, bf16-inline-update or bf16-f32-conv)\n",
                         v.c_str());
            return 2;
        }
    const td::CpuHalfSupport half = td::cpuHalfSupport();
    const bool bf16Native = half.amxBf16 || half.avx512Bf16;
    for (const std::string& v : splitList(variants))
        if (gpuOnly(v) && device.rfind("cuda:", 0) != 0) {
            std::fprintf(stderr,
                         "bench: --variants %s compares the CUDA device's ways of running a step: "
                         "it needs --device cuda:N\n",
                         v.c_str());
            return 2;
        }
    const auto here = std::filesystem::canonical("/proc/self/exe").parent_path();
    if (binary.empty()) binary = (here / "traindeck").string();
    const std::string matmulBinary = (here / "traindeck_bench_matmul").string();
    // TrainDeck's one-device rows on the CPU (not --device cuda:N).
    const bool onCpu = device.empty() || device.rfind("cpu", 0) == 0;
    if (matmulRate && !std::filesystem::exists(matmulBinary)) {
        std::fprintf(stderr, "bench: --matmul-rate: %s does not exist (build it)\n",
                     matmulBinary.c_str());
        return 2;
    }

    std::vector<Reference> refs;
    for (const std::string& key : splitList(frameworks)) {
        if (key == "none") continue;
        auto it = std::find_if(knownReferences().begin(), knownReferences().end(),
                               [&](const Reference& r) { return r.key == key; });
        if (it == knownReferences().end()) {
            std::fprintf(stderr,
                         "bench: --frameworks: unknown reference '%s' (expected torch, "
                         "torch-compile, torch-debian, keras, torch-bf16, keras-bf16, "
                         "torch-cuda, torch-compile-cuda, torch-bf16-cuda, "
                         "torch-compile-bf16-cuda or none)\n",
                         key.c_str());
            return 2;
        }
        refs.push_back(*it);
    }
    if (!refs.empty() && !std::filesystem::exists(reference)) {
        std::fprintf(stderr, "bench: --reference: %s does not exist\n", reference.c_str());
        return 2;
    }

    struct Config {
        std::string key, name;
        std::vector<int> hidden;
        int batch;
        bool cnn = false;  // projects/fashion_mnist_cnn.json's model (hidden unused)
    };
    const std::vector<Config> allConfigs{{"seed-32", "784-128-10 (seed)", {128}, 32},
                                         {"seed-256", "784-128-10 (seed)", {128}, 256},
                                         {"wide-256", "784-1024-1024-10", {1024, 1024}, 256},
                                         {"large-1024", "784-4096-4096-10", {4096, 4096}, 1024},
                                         {"cnn-64", "CNN 2xConv2D+BN", {128}, 64, true}};
    std::vector<Config> configs;
    for (const std::string& key : splitList(models)) {
        auto it = std::find_if(allConfigs.begin(), allConfigs.end(),
                               [&](const Config& c) { return c.key == key; });
        if (it == allConfigs.end()) {
            std::fprintf(stderr,
                         "bench: --models: unknown configuration '%s' (expected seed-32, "
                         "seed-256, wide-256, large-1024 or cnn-64)\n",
                         key.c_str());
            return 2;
        }
        configs.push_back(*it);
    }

    std::vector<StrategyRun> strategyRuns;
    for (const std::string& key : splitList(strategies)) {
        StrategyRun st;
        st.key = key;
        std::smatch m;
        static const std::regex form(R"((mirrored|mpi)-([1-9][0-9]?))");
        if (key == "one") {
        } else if (std::regex_match(key, m, form)) {
            st.replicas = std::stoi(m[2]);
            st.mpi = m[1] == "mpi";
            st.type = st.mpi ? "multi_worker_mirrored" : "mirrored";
        } else {
            std::fprintf(stderr,
                         "bench: --strategies: unknown strategy '%s' (expected one, mirrored-N "
                         "or mpi-N)\n",
                         key.c_str());
            return 2;
        }
        strategyRuns.push_back(st);
    }
    if (strategyRuns.empty()) strategyRuns.push_back(StrategyRun{"one"});

    auto base = td::loadProject(root + "/projects/fashion_mnist_mlp.json");
    if (!base.ok()) {
        std::fprintf(stderr, "bench: %s\n", base.error().c_str());
        return 2;
    }
    auto cnnBase = td::loadProject(root + "/projects/fashion_mnist_cnn.json");
    if (!cnnBase.ok()) {
        std::fprintf(stderr, "bench: %s\n", cnnBase.error().c_str());
        return 2;
    }
    // The CNN's dropout rate, for the references.
    double cnnDropout = 0;
    for (const td::LayerSpec& l : cnnBase->model.layers)
        if (l.type == td::LayerType::Dropout) cnnDropout = l.rate;
    const auto tmp =
        std::filesystem::temp_directory_path() / ("traindeck-bench-" + std::to_string(getpid()));
    std::filesystem::create_directories(tmp);

    std::printf(
        "TrainDeck benchmark: Fashion-MNIST, %d epochs (steady = epochs 2..%d), threads: %d, "
        "dropout 0.2 (MLP) / as the CNN project, Adam\n",
        epochs, epochs, threads);
    std::printf("%-20s %5s  %-34s %10s %8s %9s %8s %7s\n", "model", "batch", "trainer", "samples/s",
                "test acc", "peak MiB", "speed x", "mem x");
    const std::string ourName =
        std::string("TrainDeck ") + TRAINDECK_VERSION + " (" +
        (device.empty() || device.rfind("cpu", 0) == 0 ? td::cpuIsaName(td::activeCpuIsa().isa)
                                                       : device) +
        ")";
    nlohmann::json results = nlohmann::json::array();
    int idx = 0;
    for (const Config& c : configs) {
        td::Project p = *base;
        // Flatten, then Dense(h, relu) + Dropout(0.2) per hidden layer, then Dense(10, softmax).
        td::ModelSpec m;
        m.name = "bench_mlp";
        td::LayerSpec flat = p.model.layers.front().type == td::LayerType::Input
                                 ? p.model.layers[1]
                                 : p.model.layers[0];
        m.layers.push_back(p.model.layers.front());
        if (p.model.layers.front().type == td::LayerType::Input) m.layers.push_back(flat);
        int k = 0;
        for (int h : c.hidden) {
            td::LayerSpec d;
            d.type = td::LayerType::Dense;
            d.name = "dense_h" + std::to_string(k);
            d.units = h;
            d.activation = td::ActivationKind::Relu;
            td::LayerSpec dr;
            dr.type = td::LayerType::Dropout;
            dr.name = "dropout_h" + std::to_string(k++);
            dr.rate = 0.2;
            m.layers.push_back(d);
            m.layers.push_back(dr);
        }
        td::LayerSpec out;
        out.type = td::LayerType::Dense;
        out.name = "logits";
        out.units = 10;
        out.activation = td::ActivationKind::Softmax;
        m.layers.push_back(out);
        p.model = m;
        if (c.cnn) {
            p = *cnnBase;
            p.training.epochs = base->training.epochs;
        }
        // --matmul-rate: each one-device run's share of oneDNN's matmul rate, measured after it.
        std::vector<double> matmulShares;
        auto measureMatmul = [&](const Outcome& run) {
            if (!matmulRate || c.cnn || !onCpu || !run.ok || run.samplesPerSecond <= 0) return;
            std::string error;
            // Every MLP configuration flattens Fashion-MNIST's 28x28 pixels; the products run as
            // many steps as TrainDeck's timed epochs (its 60,000 training images).
            const int steps = (epochs - 1) * ((60000 + c.batch - 1) / c.batch);
            const double alone = matmulSamplesPerSecond(matmulBinary, 784, c.hidden, c.batch,
                                                        threads, steps, &error);
            if (alone <= 0) {
                std::printf("  matmul rate: not measured: %s\n", error.c_str());
                return;
            }
            matmulShares.push_back(run.samplesPerSecond / alone);
            std::printf(
                "  matmul rate: oneDNN's products alone %.0f samples/s; TrainDeck's %.0f at "
                "%.0f%% of it\n",
                alone, run.samplesPerSecond, 100.0 * matmulShares.back());
        };
        Outcome ours;
        std::string oursPath;  // the one-device project, for further rounds
        std::vector<std::pair<StrategyRun, Outcome>> scaled;
        for (const StrategyRun& st : strategyRuns) {
            td::Project ps = p;
            ps.strategy.type = st.type;
            ps.strategy.replicas = st.mpi ? 1 : (st.type == "mirrored" ? st.replicas : 0);
            if (st.type == "one_device" && !device.empty()) ps.strategy.devices = {device};
            const std::string pp = (tmp / ("bench" + std::to_string(idx++) + ".json")).string();
            if (auto s = td::saveProject(ps, pp); !s.ok()) {
                std::fprintf(stderr, "bench: %s\n", s.error().c_str());
                return 2;
            }
            Outcome o =
                runTrainDeck(binary, pp, epochs, c.batch, threads, (tmp / "bench.db").string(), st);
            if (scaled.empty()) {
                ours = o;
                oursPath = pp;
                printRow(c.name, c.batch, ourName + (st.key == "one" ? "" : " " + st.key), o,
                         nullptr);
                if (st.key == "one") measureMatmul(o);
            } else {
                printRow(c.name, c.batch, "TrainDeck " + st.key, o, nullptr);
                if (o.ok && ours.ok && ours.samplesPerSecond > 0)
                    std::printf(
                        "  %s / %s: %.2fx samples/s; all-reduce %.1f KiB per replica "
                        "per step, %.1f%% of the replicas' time\n",
                        st.key.c_str(), strategyRuns.front().key.c_str(),
                        o.samplesPerSecond / ours.samplesPerSecond, o.allReduceKiB,
                        o.allReduceShare);
            }
            scaled.emplace_back(st, o);
        }
        // Variants: the same model on one device with another precision or without fusion.
        nlohmann::json variantRows = nlohmann::json::array();
        Outcome firstVariant;
        const bool hasConv =
            std::any_of(p.model.layers.begin(), p.model.layers.end(),
                        [](const td::LayerSpec& l) { return l.type == td::LayerType::Conv2D; });
        for (const std::string& v : splitList(variants)) {
            // bf16-f32-conv only differs from bf16 where the model has convolutions.
            if (v == "bf16-f32-conv" && !hasConv) continue;
            td::Project pv = p;
            if (!device.empty()) pv.strategy.devices = {device};
            StrategyRun st{"one"};
            std::string label = "TrainDeck " + v;
            if (v == "unfused") pv.fusion = false;
            if (v == "f16") pv.precision = td::PrecisionPolicy::MixedFloat16;
            if (v == "bf16") {
                pv.precision = td::PrecisionPolicy::MixedBfloat16;
                st.env.push_back("TRAINDECK_BF16_EMULATION=1");
                if (!bf16Native && onCpu) label += " (emulated)";
            }
            if (v == "nograph") {
                st.env.push_back("TRAINDECK_CUDA_GRAPHS=0");
                label = "TrainDeck without CUDA Graph";
            }
            if (v == "bf16-inline-update" || v == "bf16-f32-conv") {
                pv.precision = td::PrecisionPolicy::MixedBfloat16;
                const bool afterBackward = v == "bf16-inline-update";
                pv.disabledPasses.push_back(afterBackward ? "cuda_side_update" : "cuda_half_conv");
                label = afterBackward ? "TrainDeck bf16, update after backward"
                                      : "TrainDeck bf16, f32 convolutions";
            }
            Outcome o;
            if (v == "f32" && strategyRuns.front().key == "one") {
                o = ours;
            } else {
                const std::string pp = (tmp / ("bench" + std::to_string(idx++) + ".json")).string();
                if (auto s = td::saveProject(pv, pp); !s.ok()) {
                    std::fprintf(stderr, "bench: %s\n", s.error().c_str());
                    return 2;
                }
                o = runTrainDeck(binary, pp, epochs, c.batch, threads, (tmp / "bench.db").string(),
                                 st);
                printRow(c.name, c.batch, label, o, nullptr);
            }
            if (variantRows.empty()) {
                firstVariant = o;
            } else if (o.ok && firstVariant.ok && firstVariant.samplesPerSecond > 0) {
                std::printf("  %s / %s: %.2fx samples/s\n", v.c_str(),
                            variantRows[0]["variant"].get<std::string>().c_str(),
                            o.samplesPerSecond / firstVariant.samplesPerSecond);
            }
            variantRows.push_back({{"variant", v},
                                   {"ok", o.ok},
                                   {"error", o.error},
                                   {"samples_per_s", o.samplesPerSecond},
                                   {"test_accuracy", o.testAccuracy},
                                   {"bf16_native", bf16Native || !onCpu}});
        }
        nlohmann::json row{{"model", c.name},
                           {"batch", c.batch},
                           {"threads", threads},
                           {"epochs", epochs},
                           {"traindeck_isa", td::cpuIsaName(td::activeCpuIsa().isa)},
                           {"traindeck_samples_per_s", ours.samplesPerSecond},
                           {"traindeck_test_accuracy", ours.testAccuracy},
                           {"traindeck_peak_rss_mib", ours.peakRssMiB},
                           {"references", nlohmann::json::array()},
                           {"strategies", nlohmann::json::array()},
                           {"variants", variantRows}};
        for (const auto& [st, o] : scaled)
            row["strategies"].push_back({{"strategy", st.key},
                                         {"ok", o.ok},
                                         {"error", o.error},
                                         {"samples_per_s", o.samplesPerSecond},
                                         {"all_reduce_kib_per_step", o.allReduceKiB},
                                         {"all_reduce_share_percent", o.allReduceShare}});
        for (const Reference& r : refs) {
            Outcome ref =
                runReference(r.debianPython ? pythonDebian : python, reference, r, c.hidden,
                             c.cnn ? cnnDropout : 0.2, epochs, c.batch, threads, c.cnn);
            printRow(c.name, c.batch, r.label + " " + ref.version, ref, &ours);
            // Further rounds: TrainDeck then the reference again, each pair back to back.
            std::vector<double> ratios;
            if (ours.ok && ref.ok && ref.samplesPerSecond > 0)
                ratios.push_back(ours.samplesPerSecond / ref.samplesPerSecond);
            for (int round = 1;
                 round < rounds && !ratios.empty() && strategyRuns.front().key == "one"; ++round) {
                const Outcome a = runTrainDeck(binary, oursPath, epochs, c.batch, threads,
                                               (tmp / "bench.db").string(), strategyRuns.front());
                measureMatmul(a);
                const Outcome b =
                    runReference(r.debianPython ? pythonDebian : python, reference, r, c.hidden,
                                 c.cnn ? cnnDropout : 0.2, epochs, c.batch, threads, c.cnn);
                if (a.ok && b.ok && b.samplesPerSecond > 0) {
                    ratios.push_back(a.samplesPerSecond / b.samplesPerSecond);
                    std::printf("  round %d: TrainDeck %.0f, %s %.0f samples/s: %.2fx\n", round + 1,
                                a.samplesPerSecond, r.label.c_str(), b.samplesPerSecond,
                                ratios.back());
                } else {
                    std::printf("  round %d: no ratio: %s\n", round + 1,
                                !a.ok ? ("TrainDeck: " + a.error).c_str()
                                      : (r.label + ": " + b.error).c_str());
                }
            }
            const double medianRatio = medianOf(ratios);
            if (ratios.size() > 1) {
                const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
                std::printf("  %s over %zu rounds: median %.2fx (%.2fx to %.2fx)\n",
                            r.label.c_str(), ratios.size(), medianRatio, *lo, *hi);
            }
            const bool both = ours.ok && ref.ok && ref.samplesPerSecond > 0 && ref.peakRssMiB > 0;
            row["references"].push_back(
                {{"reference", r.key},
                 {"version", ref.version},
                 {"ok", ref.ok},
                 {"error", ref.error},
                 {"samples_per_s", ref.samplesPerSecond},
                 {"test_accuracy", ref.testAccuracy},
                 {"peak_rss_mib", ref.peakRssMiB},
                 {"speed_ratio", both ? ours.samplesPerSecond / ref.samplesPerSecond : 0.0},
                 {"speed_ratios_by_round", ratios},
                 {"median_speed_ratio", medianRatio},
                 {"memory_ratio", both ? ours.peakRssMiB / ref.peakRssMiB : 0.0}});
        }
        if (matmulShares.size() > 1) {
            const auto [lo, hi] = std::minmax_element(matmulShares.begin(), matmulShares.end());
            std::printf(
                "  TrainDeck over %zu runs: median %.0f%% of oneDNN's matmul rate (%.0f%% "
                "to %.0f%%)\n",
                matmulShares.size(), 100.0 * medianOf(matmulShares), 100.0 * *lo, 100.0 * *hi);
        }
        row["matmul_rate_shares"] = matmulShares;
        results.push_back(row);
    }
    if (!jsonOut.empty()) std::ofstream(jsonOut) << results.dump(2) << "\n";
    std::filesystem::remove_all(tmp);
    return 0;
}
