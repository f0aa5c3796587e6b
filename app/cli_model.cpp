// traindeck export | import | predict, and train --save-model: model files in and out through
// engine/api/export.h.
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "app/cli.h"
#include "engine/api/export.h"
#include "engine/api/runs.h"
#include "engine/data/pipeline.h"
#include "engine/io/zip_archive.h"
#include "engine/train/checkpoint.h"

namespace td::cli {

namespace {

std::string extensionOf(const std::string& path) {
    std::string ext = std::filesystem::path(path).extension().string();
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return ext;
}

// The format a file name asks for: --format when given, else its extension.
// Where an export's closing line goes: standard error when the model itself goes to standard
// output.
FILE* reportTo(const ExportArgs& a) {
    return a.reportToStderr ? stderr : stdout;
}

const char* shownOutput(const ExportArgs& a) {
    return a.reportToStderr ? "standard output" : a.output.c_str();
}

Result<ExportFormat> formatFor(const std::string& format, const std::string& path) {
    if (!format.empty()) return parseExportFormat(format);
    const std::string ext = extensionOf(path);
    if (ext == ".onnx") return ExportFormat::Onnx;
    if (ext == ".keras") return ExportFormat::Keras;
    return err(path + ": cannot tell the format from the extension '" + ext +
               "' (use .onnx or .keras, or --format onnx|keras)");
}

// What a file is, by its first bytes: "keras" for a zip archive, "a TrainDeck checkpoint", "a
// JSON document", "an HDF5 file", "" when it cannot be read (the reader then says why), else "not a
// .keras file".
std::string fileKind(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return "";
    char head[8] = {};
    in.read(head, sizeof head);
    const std::string_view h(head, static_cast<size_t>(in.gcount()));
    if (h.size() >= 2 && h[0] == 'P' && h[1] == 'K') return "keras";
    if (hasCheckpointMagic(h)) return "a TrainDeck checkpoint";
    if (h.size() >= 4 && h.substr(1, 3) == "HDF") return "an HDF5 file (Keras 2 weights)";
    const size_t first = h.find_first_not_of(" \t\r\n");
    if (first != std::string_view::npos && (h[first] == '{' || h[first] == '['))
        return "a JSON document";
    return "not a .keras file";
}

// Prediction input by extension: .npy, .csv (a training CSV: the label column is left out),
// anything else IDX (raw or gzip).
Result<Tensor> readInput(const std::string& path, const std::string& labelColumn) {
    const std::string ext = extensionOf(path);
    if (ext == ".npy") return readNpy(path);
    if (ext == ".csv") {
        TD_ASSIGN_OR_RETURN(CsvData csv, readCsv(path, labelColumn));
        return csv.x;
    }
    return readIdx(path);
}

// NumPy .npy version 1.0 of an f32 tensor: magic, version, header length, a Python dict literal
// padded with spaces to a multiple of 64 bytes, ending in '\n', then the values little-endian.
std::string npyBytes(const Tensor& t) {
    std::string shape = "(";
    for (size_t i = 0; i < t.rank(); ++i)
        shape += std::to_string(t.dim(i)) + (t.rank() == 1 || i + 1 < t.rank() ? "," : "");
    shape += ")";
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
    const size_t total = 10 + header.size() + 1;
    header.append((64 - total % 64) % 64, ' ');
    header += '\n';
    std::string out = "\x93NUMPY";
    out += '\x01';
    out += '\x00';
    out += static_cast<char>(header.size() & 0xff);
    out += static_cast<char>(header.size() >> 8);
    out += header;
    out.append(static_cast<const char*>(t.raw()), t.bytes());
    return out;
}

// Per row: the class (arg max) and its probability, the model's output read as probabilities
// when it ends in a softmax, else through a softmax of its outputs (logits).
struct RowClass {
    int64_t cls = 0;
    double probability = 0;
};
RowClass classOf(const float* v, int64_t k, bool outputsAreProbabilities) {
    RowClass r;
    for (int64_t j = 1; j < k; ++j)
        if (v[j] > v[r.cls]) r.cls = j;
    if (outputsAreProbabilities) {
        r.probability = v[r.cls];
    } else {
        double sum = 0;
        for (int64_t j = 0; j < k; ++j) sum += std::exp(double(v[j]) - double(v[r.cls]));
        r.probability = 1.0 / sum;
    }
    return r;
}

bool endsInSoftmax(const ModelSpec& m) {
    ActivationKind last = ActivationKind::Linear;
    for (const LayerSpec& l : m.layers)
        if (l.type == LayerType::Dense || l.type == LayerType::Activation) last = l.activation;
    return last == ActivationKind::Softmax;
}

// `export RUN`: the stored run's newest good checkpoint (a damaged newer one is skipped, with a
// warning that says why).
int exportRun(const ExportArgs& a, ExportFormat format) {
    const std::string db = a.db.empty() ? defaultDbPath() : a.db;
    std::error_code ec;
    if (!std::filesystem::exists(db, ec)) {
        printError("export: " + a.source + ": no such model file, and no run store at " + db +
                   " to look a run with that id or name up in" +
                   (a.db.empty() ? " (--db names one)" : ""));
        return 2;
    }
    auto catalog = api::RunCatalog::open(db);
    if (!catalog.ok()) {
        printError(catalog.error());
        return 2;
    }
    auto run = (*catalog)->findRun(a.source);
    if (!run.ok()) {
        printError("export: " + a.source + ": no such model file, and " + run.error());
        return 2;
    }
    auto model = loadRunModel(**catalog, run->id);
    if (!model.ok()) {
        printError(model.error());
        return 2;
    }
    for (const std::string& note : model->notes)
        std::fprintf(stderr, "traindeck: warning: run %lld: %s\n",
                     static_cast<long long>(model->runId), note.c_str());
    if (Status st =
            td::exportModel(model->model.weights, format, a.output, model->model.savedAtSeconds);
        !st.ok()) {
        printError(st.error());
        return 1;
    }
    const LoadedModel& m = model->model;
    const std::string when = m.stepInEpoch == 0 ? "after epoch " + std::to_string(m.epoch)
                                                : "in epoch " + std::to_string(m.epoch + 1);
    std::fprintf(reportTo(a),
                 "Exported run %lld (%s) to %s (%s) from checkpoint %s (%s, global step %lld)\n",
                 static_cast<long long>(model->runId), model->runName.c_str(), shownOutput(a),
                 exportFormatName(format), model->checkpointPath.c_str(), when.c_str(),
                 static_cast<long long>(m.globalStep));
    return 0;
}

}  // namespace

static int exportToFile(const ExportArgs& a) {
    auto format = formatFor(a.format, a.output);
    if (!format.ok()) {
        printError(format.error());
        return 2;
    }
    Result<ModelWeights> weights = err("");
    int64_t savedAtSeconds = 0;  // a checkpoint's: the same file exported twice, the same bytes
    if (!a.project.empty() || !a.weights.empty()) {
        if (a.project.empty() || a.weights.empty() || !a.source.empty()) {
            printError(
                "export: give a model file or a stored run (id or name), or --project with "
                "--weights");
            return 2;
        }
        auto project = loadProject(a.project);
        if (!project.ok()) {
            printError(project.error());
            return 2;
        }
        if (std::string kind = fileKind(a.weights); kind != "keras" && !kind.empty()) {
            printError(a.weights + ": --weights takes a Keras 3 .keras file (its weights are " +
                       "matched to the project's layers by name); this is " + kind +
                       (kind == "a TrainDeck checkpoint"
                            ? ", which holds its own model: export it as it is (traindeck export " +
                                  a.weights + " -o " + a.output + ")"
                            : std::string()));
            return 2;
        }
        weights = projectModelWeights(*project, a.weights);
    } else if (std::error_code ec;
               !a.source.empty() && std::filesystem::is_regular_file(a.source, ec)) {
        // A model file: .keras or a checkpoint, told apart by content.
        auto model = loadModelFile(a.source);
        if (!model.ok()) {
            printError(model.error());
            return 2;
        }
        weights = std::move(model->weights);
        savedAtSeconds = model->savedAtSeconds;
    } else if (!a.source.empty()) {
        return exportRun(a, *format);
    } else {
        printError(
            "export: give a model file or a stored run (id or name), or --project with --weights");
        return 2;
    }
    if (!weights.ok()) {
        printError(weights.error());
        return 2;
    }
    if (Status st = td::exportModel(*weights, *format, a.output, savedAtSeconds); !st.ok()) {
        printError(st.error());
        return 1;
    }
    std::fprintf(reportTo(a), "Exported %s (%s)\n", shownOutput(a), exportFormatName(*format));
    return 0;
}

int exportModel(const ExportArgs& a) {
    if (a.output != "-") return exportToFile(a);
    // Standard output (a model fetched over SSH): written to a private temporary file first, so
    // a failed export writes nothing, then copied; the report goes to standard error.
    if (a.format.empty()) {
        printError(
            "export -o -: give --format onnx or --format keras (standard output has no "
            "extension to tell it by)");
        return 2;
    }
    auto format = parseExportFormat(a.format);
    if (!format.ok()) {
        printError(format.error());
        return 2;
    }
    const char* dir = std::getenv("TMPDIR");
    std::string tmp = std::string(dir && *dir ? dir : "/tmp") + "/traindeck-export-XXXXXX";
    const std::string ext = *format == ExportFormat::Onnx ? ".onnx" : ".keras";
    tmp += ext;
    const int fd = ::mkstemps(tmp.data(), static_cast<int>(ext.size()));
    if (fd < 0) {
        printError("export -o -: cannot create a temporary file in " +
                   std::string(dir && *dir ? dir : "/tmp") + ": " + std::strerror(errno));
        return 1;
    }
    ::close(fd);
    ExportArgs toFile = a;
    toFile.output = tmp;
    toFile.reportToStderr = true;
    int rc = exportToFile(toFile);
    if (rc == 0) {
        std::ifstream in(tmp, std::ios::binary);
        std::vector<char> buf(1 << 16);
        while (in && rc == 0) {
            in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
            const auto got = static_cast<size_t>(in.gcount());
            if (got > 0 && std::fwrite(buf.data(), 1, got, stdout) != got) rc = 1;
        }
        if (std::fflush(stdout) != 0) rc = 1;
        if (rc != 0) printError("export -o -: cannot write to standard output");
    }
    ::unlink(tmp.c_str());
    return rc;
}

int importModel(const std::string& model, const std::string& output, const std::string& like) {
    std::optional<Project> likeProject;
    if (!like.empty()) {
        auto p = loadProject(like);
        if (!p.ok()) {
            printError(p.error());
            return 2;
        }
        likeProject = std::move(p).value();
    }
    auto imported = importKerasModel(model, likeProject ? &*likeProject : nullptr);
    if (!imported.ok()) {
        printError(imported.error());
        return 2;
    }
    for (const std::string& w : imported->warnings)
        std::fprintf(stderr, "traindeck: warning: %s: %s\n", model.c_str(), w.c_str());
    if (Status st = saveProject(imported->project, output); !st.ok()) {
        printError(st.error());
        return 1;
    }
    std::printf("Wrote %s (model '%s', %zu layers, weights from %s)\n", output.c_str(),
                imported->project.model.name.c_str(), imported->project.model.layers.size(),
                model.c_str());
    if (likeProject == std::nullopt)
        std::printf(
            "Its data source is the default (Fashion-MNIST): set data.source for this "
            "model's input\n");
    return 0;
}

int predict(const std::string& modelPath, const std::string& input, const std::string& output,
            const std::string& labelColumn) {
    auto model = loadModelFile(modelPath);
    if (!model.ok()) {
        printError(model.error());
        return 2;
    }
    for (const std::string& w : model->warnings)
        std::fprintf(stderr, "traindeck: warning: %s: %s\n", modelPath.c_str(), w.c_str());
    const std::string ext = extensionOf(output);
    if (!output.empty() && ext != ".csv" && ext != ".npy") {
        printError(output + ": expected a .csv or .npy output file");
        return 2;
    }
    auto x = readInput(input, labelColumn);
    if (!x.ok()) {
        printError(x.error());
        return 2;
    }
    // As training does: NaN or infinite features are refused, naming the sample.
    if (x->dtype() == DType::F32 && x->rank() >= 1 && x->dim(0) > 0) {
        const float* v = x->data<float>();
        const int64_t perSample = x->size() / x->dim(0);
        for (int64_t i = 0; i < x->size(); ++i)
            if (!std::isfinite(v[i])) {
                printError(input + ": sample " + std::to_string(i / perSample) + ", value " +
                           std::to_string(i % perSample) + " is " +
                           (std::isnan(v[i]) ? "NaN" : "infinite") +
                           " (expected finite features, as training does)");
                return 2;
            }
    }
    // Samples of another shape with the model's number of values are read in row-major order,
    // as training reads them; said, so that a wrong file is not mistaken for a right one.
    if (auto info = inferShapes(model->weights.model); info.ok() && x->rank() >= 1) {
        const Shape sample(x->shape().begin() + 1, x->shape().end());
        if (sample != info->inputShape && numElements(sample) == numElements(info->inputShape))
            std::fprintf(stderr,
                         "traindeck: warning: %s: samples of shape %s are read as the model's "
                         "input shape %s (the same %lld values, in row-major order)\n",
                         input.c_str(), shapeToString(sample).c_str(),
                         shapeToString(info->inputShape).c_str(),
                         static_cast<long long>(numElements(sample)));
    }
    auto y = predictWithModel(*model, *x);
    if (!y.ok()) {
        printError(input + ": " + y.error());
        return 2;
    }
    const int64_t n = y->dim(0);
    const int64_t k = y->size() / std::max<int64_t>(1, n);
    const bool classes = k >= 2;
    const bool probabilities = endsInSoftmax(model->weights.model);
    if (ext == ".npy") {
        if (Status st = writeFileAtomic(output, npyBytes(*y)); !st.ok()) {
            printError(st.error());
            return 1;
        }
        std::printf("Wrote %lld predictions to %s\n", static_cast<long long>(n), output.c_str());
        return 0;
    }
    std::string text = classes ? "row,class,probability" : "row";
    for (int64_t j = 0; j < k; ++j) text += ",output_" + std::to_string(j);
    text += "\n";
    char buf[64];
    for (int64_t i = 0; i < n; ++i) {
        const float* v = y->data<float>() + i * k;
        text += std::to_string(i);
        if (classes) {
            const RowClass r = classOf(v, k, probabilities);
            std::snprintf(buf, sizeof buf, ",%lld,%.6g", static_cast<long long>(r.cls),
                          r.probability);
            text += buf;
        }
        for (int64_t j = 0; j < k; ++j) {
            std::snprintf(buf, sizeof buf, ",%.9g", double(v[j]));
            text += buf;
        }
        text += "\n";
    }
    if (output.empty()) {
        std::fwrite(text.data(), 1, text.size(), stdout);
        return 0;
    }
    if (Status st = writeFileAtomic(output, text); !st.ok()) {
        printError(st.error());
        return 1;
    }
    std::printf("Wrote %lld predictions to %s\n", static_cast<long long>(n), output.c_str());
    return 0;
}

int saveTrainedModel(Session& session, const std::string& path) {
    auto format = formatFor("", path);
    if (!format.ok()) {
        printError(format.error());
        return 2;
    }
    auto weights = sessionModelWeights(session);
    if (!weights.ok()) {
        printError(path + ": " + weights.error());
        return 1;
    }
    if (Status st = td::exportModel(*weights, *format, path); !st.ok()) {
        printError(st.error());
        return 1;
    }
    std::printf("Saved the trained model to %s\n", path.c_str());
    return 0;
}

}  // namespace td::cli
