// Side-by-side MLP benchmark: TrainDeck against the reference trainers (PyTorch, Keras) on
// Fashion-MNIST, same model, same batch, same thread count, in one invocation. Every trainer runs
// as its own child process, so peak memory (ru_maxrss of the child) is measured the same way for
// all. Prints steady samples/s (epochs after the first), test accuracy, peak RSS and the ratios.
//
//   traindeck_bench [--epochs 3] [--threads 2] [--frameworks torch,keras] [--reference PATH]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "engine/io/project.h"

namespace {

struct Outcome {
    bool ok = false;
    double samplesPerSecond = 0;
    double testAccuracy = 0;
    double peakRssMiB = 0;
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

Outcome runTrainDeck(const std::string& binary, const std::string& projectPath, int epochs,
                     int batch, int threads, const std::string& db) {
    Outcome o;
    std::string out;
    std::vector<std::string> env{"OMP_NUM_THREADS=" + std::to_string(threads)};
    int rc =
        runChild({binary, "train", projectPath, "--epochs", std::to_string(epochs), "--batch-size",
                  std::to_string(batch), "--plain", "--db", db, "--run-name", "bench"},
                 env, &out, &o.peakRssMiB);
    if (rc != 0) {
        o.error = "traindeck exited with " + std::to_string(rc);
        return o;
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

Outcome runReference(const std::string& python, const std::string& script,
                     const std::string& framework, const std::vector<int>& hidden, double dropout,
                     int epochs, int batch, int threads) {
    Outcome o;
    std::string out;
    std::vector<std::string> env{"OMP_NUM_THREADS=" + std::to_string(threads),
                                 "TF_CPP_MIN_LOG_LEVEL=2"};
    int rc = runChild({python, script, "--framework", framework, "--hidden", join(hidden),
                       "--dropout", std::to_string(dropout), "--batch", std::to_string(batch),
                       "--epochs", std::to_string(epochs), "--threads", std::to_string(threads)},
                      env, &out, &o.peakRssMiB);
    if (rc != 0) {
        o.error = framework + " reference exited with " + std::to_string(rc) +
                  " (is it installed? installer/bench.sh installs the references)";
        return o;
    }
    auto last = out.rfind('{');
    auto j =
        nlohmann::json::parse(last == std::string::npos ? "" : out.substr(last), nullptr, false);
    if (j.is_discarded()) {
        o.error = framework + " reference printed no JSON";
        return o;
    }
    o.samplesPerSecond = j.value("samples_per_s", 0.0);
    o.testAccuracy = j.value("test_accuracy", 0.0);
    o.version = j.value("version", "");
    o.ok = true;
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"TrainDeck MLP benchmark against PyTorch / Keras, side by side"};
    int epochs = 3, threads = 2;
    std::string frameworks = "torch,keras";
    std::string root = TRAINDECK_SOURCE_DIR;
    std::string reference = root + "/../shared/bench/reference_mlp.py";
    std::string binary;
    std::string jsonOut;
    // Debian's PyTorch lives in the system interpreter; TensorFlow from pip in the default python3.
    std::string pythonTorch = "/usr/bin/python3", pythonKeras = "python3";
    app.add_option("--python-torch", pythonTorch, "Interpreter with torch");
    app.add_option("--python-keras", pythonKeras, "Interpreter with tensorflow/keras");
    app.add_option("--epochs", epochs, "Epochs per run (the first is warm-up)")
        ->check(CLI::Range(2, 100));
    app.add_option("--threads", threads, "Threads for every trainer")->check(CLI::PositiveNumber);
    app.add_option("--frameworks", frameworks, "Reference frameworks (torch, keras)");
    app.add_option("--reference", reference, "Path of reference_mlp.py");
    app.add_option("--traindeck", binary, "traindeck binary (default: next to this program)");
    app.add_option("--json", jsonOut, "Also write the results as JSON to this file");
    CLI11_PARSE(app, argc, argv);
    if (binary.empty())
        binary =
            (std::filesystem::canonical("/proc/self/exe").parent_path() / "traindeck").string();

    auto base = td::loadProject(root + "/projects/fashion_mnist_mlp.json");
    if (!base.ok()) {
        std::fprintf(stderr, "bench: %s\n", base.error().c_str());
        return 2;
    }
    const auto tmp =
        std::filesystem::temp_directory_path() / ("traindeck-bench-" + std::to_string(getpid()));
    std::filesystem::create_directories(tmp);

    struct Config {
        std::string name;
        std::vector<int> hidden;
        int batch;
    };
    const std::vector<Config> configs{{"seed MLP 784-128-10", {128}, 32},
                                      {"seed MLP 784-128-10", {128}, 256},
                                      {"MLP 784-1024-1024-10", {1024, 1024}, 256}};
    std::vector<std::string> fws;
    {
        std::stringstream ss(frameworks);
        std::string f;
        while (std::getline(ss, f, ','))
            if (!f.empty()) fws.push_back(f);
    }

    std::printf(
        "TrainDeck MLP benchmark: Fashion-MNIST, %d epochs (steady = epochs 2..%d), %d threads, "
        "dropout 0.2\n",
        epochs, epochs, threads);
    std::printf("%-22s %5s | %-10s %11s %8s %9s | %-16s %11s %8s %9s | %7s %7s\n", "model", "batch",
                "trainer", "samples/s", "test acc", "peak MiB", "reference", "samples/s",
                "test acc", "peak MiB", "speed x", "mem x");
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
        const std::string pp = (tmp / ("bench" + std::to_string(idx++) + ".json")).string();
        if (auto s = td::saveProject(p, pp); !s.ok()) {
            std::fprintf(stderr, "bench: %s\n", s.error().c_str());
            return 2;
        }
        Outcome ours =
            runTrainDeck(binary, pp, epochs, c.batch, threads, (tmp / "bench.db").string());
        for (const std::string& fw : fws) {
            Outcome ref = runReference(fw == "keras" ? pythonKeras : pythonTorch, reference, fw,
                                       c.hidden, 0.2, epochs, c.batch, threads);
            const double speed =
                ours.ok && ref.ok ? ours.samplesPerSecond / ref.samplesPerSecond : 0;
            const double mem = ours.ok && ref.ok ? ours.peakRssMiB / ref.peakRssMiB : 0;
            std::printf(
                "%-22s %5d | %-10s %11.0f %8.4f %9.1f | %-16s %11.0f %8.4f %9.1f | %7.2f %7.2f\n",
                c.name.c_str(), c.batch, "traindeck", ours.samplesPerSecond, ours.testAccuracy,
                ours.peakRssMiB, (fw + " " + ref.version).substr(0, 16).c_str(),
                ref.samplesPerSecond, ref.testAccuracy, ref.peakRssMiB, speed, mem);
            if (!ours.ok) std::printf("  traindeck: %s\n", ours.error.c_str());
            if (!ref.ok) std::printf("  %s: %s\n", fw.c_str(), ref.error.c_str());
            results.push_back({{"model", c.name},
                               {"batch", c.batch},
                               {"threads", threads},
                               {"traindeck_samples_per_s", ours.samplesPerSecond},
                               {"traindeck_test_accuracy", ours.testAccuracy},
                               {"traindeck_peak_rss_mib", ours.peakRssMiB},
                               {"reference", fw},
                               {"reference_version", ref.version},
                               {"reference_samples_per_s", ref.samplesPerSecond},
                               {"reference_test_accuracy", ref.testAccuracy},
                               {"reference_peak_rss_mib", ref.peakRssMiB},
                               {"speed_ratio", speed},
                               {"memory_ratio", mem}});
            std::fflush(stdout);
        }
    }
    if (!jsonOut.empty()) std::ofstream(jsonOut) << results.dump(2) << "\n";
    std::filesystem::remove_all(tmp);
    return 0;
}
