// Project files: parse + validate, write, atomic save. The schema is documented in
// docs/PROJECT_FORMAT.md; keep the two in step.
#include "engine/io/project.h"
#include "engine/core/names.h"
#include "engine/core/text_limits.h"
#include "engine/data/resource_plan.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

#include "engine/io/json_fields.h"

namespace td {

namespace fs = std::filesystem;
using namespace jsonio;

namespace {

constexpr const char* kFormat = "traindeck-project";
constexpr int kVersion = 1;
// Far above any real project (the model is a few KiB of Keras JSON; free text is capped by
// text_limits.h), low enough that an unrelated huge file is refused before it is read.
constexpr size_t kMaxProjectBytes = size_t{16} << 20;
// Sample counts, batch sizes, class ids and one_hot depths are 32-bit inside the pipeline and the
// label tensors; larger values are refused by the parser whatever the machine.
constexpr int64_t kMaxInt32 = 2147483647;
// strategy.timeout_seconds: one day.
constexpr double kMaxStrategyTimeoutSeconds = 86400;

// A count that the engine keeps in 32 bits.
int64_t atMostInt32(int64_t n, const std::string& path, const char* why) {
    if (n > kMaxInt32)
        fail(path,
             "expected at most 2147483647 (" + std::string(why) + "), got " + std::to_string(n));
    return n;
}

std::string freeText(const Json& v, const std::string& path, TextKind kind) {
    std::string s = getString(v, path);
    if (std::string problem = textProblem(s, kind); !problem.empty()) fail(path, problem);
    return s;
}

const char* nonFiniteName(NonFinitePolicy p) {
    return p == NonFinitePolicy::DropRows ? "drop_rows" : "error";
}

std::string resolvePath(const std::string& p, const std::string& baseDir) {
    if (p.empty() || baseDir.empty()) return p;
    fs::path q(p);
    if (q.is_absolute()) return q.lexically_normal().string();
    return (fs::path(baseDir) / q).lexically_normal().string();
}

// The inverse for saving: a path inside `dir` becomes relative to it; others stay as they are.
std::string relativePath(const std::string& p, const fs::path& dir) {
    if (p.empty()) return p;
    fs::path q(p);
    if (!q.is_absolute()) return p;
    fs::path rel = q.lexically_normal().lexically_relative(dir);
    if (rel.empty() || *rel.begin() == "..") return p;
    return rel.string();
}

struct Reader {
    std::string baseDir;

    // ---- data --------------------------------------------------------------------------------

    SourceConfig source(const Json& v, const std::string& path) const {
        requireObject(v, path);
        SourceConfig s;
        s.type = getOneOf(
            requireMember(v, path, "type"), child(path, "type"),
            {"fashion_mnist", "idx", "csv", "npy", "synthetic", "image_directory", "tfrecord"});
        auto file = [&](const char* key, bool required) -> std::string {
            const Json* x = member(v, key);
            if (!x) {
                if (required)
                    fail(child(path, key), "missing (required for a " + s.type + " source)");
                return {};
            }
            return resolvePath(getNonEmptyString(*x, child(path, key)), baseDir);
        };
        auto bothOrNeither = [&](const char* a, const char* b) {
            if (!member(v, a) != !member(v, b))
                fail(path, std::string("give both ") + a + " and " + b + ", or neither");
        };
        if (s.type == "fashion_mnist") {
            checkKeys(v, path, {"type"});
        } else if (s.type == "idx") {
            checkKeys(v, path,
                      {"type", "train_images", "train_labels", "test_images", "test_labels",
                       "non_finite"});
            s.trainImages = file("train_images", true);
            s.trainLabels = file("train_labels", true);
            bothOrNeither("test_images", "test_labels");
            s.testImages = file("test_images", false);
            s.testLabels = file("test_labels", false);
        } else if (s.type == "npy") {
            checkKeys(v, path, {"type", "train_x", "train_y", "test_x", "test_y", "non_finite"});
            s.trainImages = file("train_x", true);
            s.trainLabels = file("train_y", true);
            bothOrNeither("test_x", "test_y");
            s.testImages = file("test_x", false);
            s.testLabels = file("test_y", false);
        } else if (s.type == "csv") {
            checkKeys(v, path, {"type", "train", "test", "label_column", "non_finite"});
            s.trainPath = file("train", true);
            s.testPath = file("test", false);
            if (const Json* x = member(v, "label_column"))
                s.labelColumn = getNonEmptyString(*x, child(path, "label_column"));
        } else if (s.type == "image_directory") {
            s.images = imageDirectory(v, path, file);
        } else if (s.type == "tfrecord") {
            s.records = tfRecords(v, path);
        } else {  // synthetic
            checkKeys(v, path, {"type", "samples", "test_samples", "shape", "classes", "seed"});
            const char* why = "samples are indexed with 32-bit integers";
            if (const Json* x = member(v, "samples"))
                s.samples = atMostInt32(getPositiveInteger(*x, child(path, "samples")),
                                        child(path, "samples"), why);
            if (const Json* x = member(v, "test_samples"))
                s.testSamples = atMostInt32(getNonNegativeInteger(*x, child(path, "test_samples")),
                                            child(path, "test_samples"), why);
            if (s.samples + s.testSamples > kMaxInt32)
                fail(child(path, "test_samples"),
                     "samples + test_samples must be at most 2147483647 (" + std::string(why) +
                         "), got " + std::to_string(s.samples + s.testSamples));
            if (const Json* x = member(v, "shape")) {
                const std::string sp = child(path, "shape");
                requireArray(*x, sp);
                if (x->empty()) fail(sp, "expected at least one dimension, got []");
                s.sampleShape.clear();
                int64_t values = 1;
                for (size_t i = 0; i < x->size(); ++i) {
                    const int64_t d = getPositiveInteger((*x)[i], child(sp, i));
                    if (d > (int64_t{1} << 40) / values)
                        fail(child(sp, i), "the shape holds more than 2^40 values per sample");
                    values *= d;
                    s.sampleShape.push_back(d);
                }
            }
            if (const Json* x = member(v, "classes")) {
                s.classes = getPositiveInteger(*x, child(path, "classes"));
                if (s.classes < 2)
                    fail(child(path, "classes"), "expected an integer >= 2, got " + describe(*x));
                atMostInt32(s.classes, child(path, "classes"), "class ids are 32-bit");
            }
            if (const Json* x = member(v, "seed")) s.seed = getUnsigned(*x, child(path, "seed"));
        }
        if (const Json* x = member(v, "non_finite"))
            s.nonFinite =
                getOneOf(*x, child(path, "non_finite"), {"error", "drop_rows"}) == "drop_rows"
                    ? NonFinitePolicy::DropRows
                    : NonFinitePolicy::Error;
        return s;
    }

    // Keras' image_dataset_from_directory arguments (engine/data/image_folder.h).
    template <class File>
    ImageDirectoryConfig imageDirectory(const Json& v, const std::string& path, File& file) const {
        checkKeys(v, path,
                  {"type", "directory", "test_directory", "labels", "label_mode", "class_names",
                   "color_mode", "image_size", "interpolation", "crop_to_aspect_ratio",
                   "pad_to_aspect_ratio", "follow_links", "shuffle", "seed", "validation_split",
                   "skip_bad_files"});
        ImageDirectoryConfig c;
        c.directory = file("directory", true);
        c.testDirectory = file("test_directory", false);
        if (const Json* x = member(v, "labels")) {
            const std::string lp = child(path, "labels");
            if (x->is_string()) {
                getOneOf(*x, lp, {"inferred"});
            } else {
                if (!x->is_array())
                    fail(lp, "expected \"inferred\" or a list of class ids, got " + describe(*x));
                c.labelsInferred = false;
                for (size_t i = 0; i < x->size(); ++i) {
                    const int64_t l = getNonNegativeInteger((*x)[i], child(lp, i));
                    atMostInt32(l, child(lp, i), "class ids are 32-bit");
                    c.labels.push_back(l);
                }
            }
        }
        if (const Json* x = member(v, "label_mode"))
            c.labelMode = getOneOf(*x, child(path, "label_mode"), {"int", "categorical", "binary"});
        if (const Json* x = member(v, "class_names")) {
            const std::string cp = child(path, "class_names");
            requireArray(*x, cp);
            if (!c.labelsInferred)
                fail(cp, "class_names needs labels \"inferred\" (the classes are sub-folders)");
            for (size_t i = 0; i < x->size(); ++i) {
                std::string n = getNonEmptyString((*x)[i], child(cp, i));
                if (std::find(c.classNames.begin(), c.classNames.end(), n) != c.classNames.end())
                    fail(child(cp, i), "\"" + n + "\" is listed twice");
                c.classNames.push_back(std::move(n));
            }
        }
        if (const Json* x = member(v, "color_mode"))
            c.colorMode = getOneOf(*x, child(path, "color_mode"), {"grayscale", "rgb", "rgba"});
        if (const Json* x = member(v, "image_size")) {
            const std::string ip = child(path, "image_size");
            requireArray(*x, ip);
            if (x->size() != 2)
                fail(ip, "expected [height, width], got " + std::to_string(x->size()) + " values");
            c.height = getPositiveInteger((*x)[0], child(ip, 0));
            c.width = getPositiveInteger((*x)[1], child(ip, 1));
            if (c.height > 16384 || c.width > 16384)
                fail(ip, "expected sides of at most 16384 pixels");
        }
        if (const Json* x = member(v, "interpolation"))
            c.interpolation = getOneOf(*x, child(path, "interpolation"), {"bilinear", "nearest"});
        if (const Json* x = member(v, "crop_to_aspect_ratio"))
            c.cropToAspectRatio = getBool(*x, child(path, "crop_to_aspect_ratio"));
        if (const Json* x = member(v, "pad_to_aspect_ratio"))
            c.padToAspectRatio = getBool(*x, child(path, "pad_to_aspect_ratio"));
        if (c.cropToAspectRatio && c.padToAspectRatio)
            fail(child(path, "pad_to_aspect_ratio"),
                 "crop_to_aspect_ratio and pad_to_aspect_ratio cannot both be true");
        if (const Json* x = member(v, "follow_links"))
            c.followLinks = getBool(*x, child(path, "follow_links"));
        if (const Json* x = member(v, "shuffle")) c.shuffle = getBool(*x, child(path, "shuffle"));
        if (const Json* x = member(v, "seed")) {
            const std::string sp = child(path, "seed");
            if (auto seed = getOptionalSeed(*x, sp)) {
                if (*seed > 0xffffffffull)
                    fail(sp, "expected a seed in [0, 4294967295] (numpy's), got " +
                                 std::to_string(*seed));
                c.seed = static_cast<uint32_t>(*seed);
            }
        }
        if (const Json* x = member(v, "validation_split")) {
            c.validationSplit =
                getNumberInRange(*x, child(path, "validation_split"), 0.0, 1.0, false);
            if (c.validationSplit > 0 && c.shuffle && !c.seed)
                fail(child(path, "seed"),
                     "needed with validation_split and shuffle (as in Keras: the training and "
                     "validation files must not overlap from one run to the next)");
        }
        if (const Json* x = member(v, "skip_bad_files"))
            c.skipBadFiles = getBool(*x, child(path, "skip_bad_files"));
        if (!c.testDirectory.empty() && !c.labelsInferred)
            fail(child(path, "test_directory"),
                 "a test folder needs labels \"inferred\" (its classes are its sub-folders)");
        return c;
    }

    // TFRecord shards (engine/data/tfrecord_source.h).
    TfRecordConfig tfRecords(const Json& v, const std::string& path) const {
        checkKeys(v, path,
                  {"type", "files", "test_files", "compression", "x", "y", "cycle_length",
                   "block_length", "shuffle_files", "skip_bad_files"});
        TfRecordConfig c;
        auto patterns = [&](const char* key, bool required) {
            std::vector<std::string> out;
            const Json* x = member(v, key);
            if (!x) {
                if (required) fail(child(path, key), "missing (required for a tfrecord source)");
                return out;
            }
            const std::string fp = child(path, key);
            if (x->is_string()) {
                out.push_back(resolvePath(getNonEmptyString(*x, fp), baseDir));
                return out;
            }
            requireArray(*x, fp);
            if (x->empty()) fail(fp, "expected at least one file or pattern, got []");
            for (size_t i = 0; i < x->size(); ++i)
                out.push_back(resolvePath(getNonEmptyString((*x)[i], child(fp, i)), baseDir));
            return out;
        };
        c.files = patterns("files", true);
        c.testFiles = patterns("test_files", false);
        if (const Json* x = member(v, "compression"); x && !x->is_null()) {
            const std::string comp = getOneOf(*x, child(path, "compression"), {"GZIP", "NONE", ""});
            c.compression = comp == "GZIP" ? "GZIP" : "";
        }
        auto shapeOf = [&](const Json& o, const std::string& op) {
            const std::string sp = child(op, "shape");
            const Json& sh = requireMember(o, op, "shape");
            requireArray(sh, sp);
            if (sh.empty()) fail(sp, "expected at least one dimension, got []");
            Shape shape;
            int64_t values = 1;
            for (size_t i = 0; i < sh.size(); ++i) {
                const int64_t d = getPositiveInteger(sh[i], child(sp, i));
                if (d > (int64_t{1} << 31) / values)
                    fail(child(sp, i), "the shape holds more than 2^31 values per sample");
                values *= d;
                shape.push_back(d);
            }
            return shape;
        };
        const std::string xp = child(path, "x");
        const Json& x = requireMember(v, path, "x");
        requireObject(x, xp);
        c.xFeature = getNonEmptyString(requireMember(x, xp, "feature"), child(xp, "feature"));
        c.xDecode = getOneOf(requireMember(x, xp, "decode"), child(xp, "decode"),
                             {"image", "raw", "float"});
        if (c.xDecode == "image") {
            checkKeys(x, xp,
                      {"feature", "decode", "color_mode", "image_size", "interpolation",
                       "crop_to_aspect_ratio", "pad_to_aspect_ratio"});
            if (!member(x, "image_size"))
                fail(child(xp, "image_size"),
                     "missing (decoded images are resized to [height, width])");
            Json image = x;
            image.erase("feature");
            image.erase("decode");
            image["type"] = "image_directory";
            image["directory"] = ".";
            auto unused = [](const char*, bool) { return std::string(); };
            c.image = imageDirectory(image, xp, unused);
        } else if (c.xDecode == "raw") {
            checkKeys(x, xp, {"feature", "decode", "dtype", "shape"});
            if (const Json* d = member(x, "dtype"))
                c.rawDtype = getOneOf(*d, child(xp, "dtype"), {"uint8", "float32"});
            c.xShape = shapeOf(x, xp);
        } else {
            checkKeys(x, xp, {"feature", "decode", "shape"});
            c.xShape = shapeOf(x, xp);
        }
        const std::string yp = child(path, "y");
        const Json& y = requireMember(v, path, "y");
        requireObject(y, yp);
        c.yFeature = getNonEmptyString(requireMember(y, yp, "feature"), child(yp, "feature"));
        c.yDecode =
            getOneOf(requireMember(y, yp, "decode"), child(yp, "decode"), {"int64", "float"});
        if (c.yDecode == "float") {
            checkKeys(y, yp, {"feature", "decode", "shape"});
            const Shape shape = shapeOf(y, yp);
            if (shape.size() != 1) fail(child(yp, "shape"), "expected [values], one dimension");
            c.yWidth = shape[0];
        } else {
            checkKeys(y, yp, {"feature", "decode"});
        }
        if (const Json* n = member(v, "cycle_length"))
            c.cycleLength = getPositiveInteger(*n, child(path, "cycle_length"));
        if (const Json* n = member(v, "block_length"))
            c.blockLength = getPositiveInteger(*n, child(path, "block_length"));
        if (const Json* n = member(v, "shuffle_files"))
            c.shuffleFiles = getBool(*n, child(path, "shuffle_files"));
        if (const Json* n = member(v, "skip_bad_files"))
            c.skipBadFiles = getBool(*n, child(path, "skip_bad_files"));
        return c;
    }

    MapStep mapStep(const Json& v, const std::string& path) const {
        requireObject(v, path);
        MapStep m;
        m.op = getOneOf(requireMember(v, path, "op"), child(path, "op"),
                        {"scale", "normalize", "cast", "one_hot", "cache", "decode"});
        if (m.op == "cache" || m.op == "decode") {
            checkKeys(v, path, {"op"});
        } else if (m.op == "scale") {
            checkKeys(v, path, {"op", "factor"});
            m.factor = getNumber(requireMember(v, path, "factor"), child(path, "factor"));
        } else if (m.op == "normalize") {
            checkKeys(v, path, {"op", "mean", "std"});
            m.mean = getNumber(requireMember(v, path, "mean"), child(path, "mean"));
            m.stddev = getPositiveNumber(requireMember(v, path, "std"), child(path, "std"));
        } else if (m.op == "cast") {
            checkKeys(v, path, {"op", "dtype"});
            if (const Json* x = member(v, "dtype")) getOneOf(*x, child(path, "dtype"), {"float32"});
        } else {
            checkKeys(v, path, {"op", "depth"});
            m.depth = atMostInt32(
                getPositiveInteger(requireMember(v, path, "depth"), child(path, "depth")),
                child(path, "depth"), "class ids are 32-bit");
        }
        return m;
    }

    static int64_t autotuneOr(const Json& v, const std::string& path, int64_t minimum) {
        if (v.is_string() && v.get<std::string>() == "autotune") return kAutotune;
        int64_t n = -1;
        if (v.is_number_integer() || v.is_number_float()) {
            try {
                n = getInteger(v, path);
            } catch (const FieldError&) {
                n = -1;
            }
        }
        if (n < minimum)
            fail(path, std::string("expected \"autotune\" or an integer >= ") +
                           std::to_string(minimum) + ", got " + describe(v));
        return n;
    }

    PipelineConfig pipeline(const Json& v, const std::string& path) const {
        requireObject(v, path);
        checkKeys(v, path,
                  {"map", "cache", "shuffle_buffer", "shuffle_seed", "reshuffle_each_iteration",
                   "drop_remainder", "prefetch", "parallel_calls"});
        PipelineConfig p;
        if (const Json* x = member(v, "map")) {
            const std::string mp = child(path, "map");
            requireArray(*x, mp);
            for (size_t i = 0; i < x->size(); ++i) p.map.push_back(mapStep((*x)[i], child(mp, i)));
        }
        if (const Json* x = member(v, "cache")) {
            const std::string cp = child(path, "cache");
            std::string c = x->is_string() ? x->get<std::string>() : std::string();
            if (c == "memory" || c == "none") {
                p.cache = c;
            } else if (c.rfind("file:", 0) == 0 && c.size() > 5) {
                p.cache = "file:" + resolvePath(c.substr(5), baseDir);
            } else {
                fail(cp, "expected \"memory\", \"none\" or \"file:PATH\", got " + describe(*x));
            }
        }
        if (const Json* x = member(v, "shuffle_buffer"))
            p.shuffleBuffer = getNonNegativeInteger(*x, child(path, "shuffle_buffer"));
        if (const Json* x = member(v, "shuffle_seed"))
            p.shuffleSeed = getOptionalSeed(*x, child(path, "shuffle_seed"));
        if (const Json* x = member(v, "reshuffle_each_iteration"))
            p.reshuffleEachIteration = getBool(*x, child(path, "reshuffle_each_iteration"));
        if (const Json* x = member(v, "drop_remainder"))
            p.dropRemainder = getBool(*x, child(path, "drop_remainder"));
        if (const Json* x = member(v, "prefetch"))
            p.prefetch = autotuneOr(*x, child(path, "prefetch"), 0);
        if (const Json* x = member(v, "parallel_calls"))
            p.parallelCalls = autotuneOr(*x, child(path, "parallel_calls"), 1);
        return p;
    }

    // A "decode" map step: at most once, only after "cache" steps, and only for the sources that
    // decode files or records.
    static void decodeStep(const DataConfig& d, const std::string& mapPath) {
        bool seen = false;
        for (size_t i = 0; i < d.pipeline.map.size(); ++i) {
            const std::string& op = d.pipeline.map[i].op;
            const std::string at = child(child(mapPath, i), "op");
            if (op == "decode") {
                if (seen)
                    fail(at, "\"decode\" appears twice (it marks the one place of the decode)");
                if (d.source.type != "image_directory" && d.source.type != "tfrecord")
                    fail(at,
                         "\"decode\" marks where an image_directory or tfrecord source decodes "
                         "its files or records; a \"" +
                             d.source.type + "\" source is read into memory at load");
                seen = true;
            } else if (op != "cache" && !seen &&
                       std::any_of(d.pipeline.map.begin() + static_cast<std::ptrdiff_t>(i),
                                   d.pipeline.map.end(),
                                   [](const MapStep& m) { return m.op == "decode"; })) {
                fail(at, "\"" + op +
                             "\" before \"decode\" would act on encoded bytes; only \"cache\" "
                             "may come before \"decode\"");
            }
        }
    }

    DataConfig data(const Json& v, const std::string& path) const {
        requireObject(v, path);
        checkKeys(v, path, {"source", "pipeline", "validation_split", "validation_data"});
        DataConfig d;
        if (const Json* x = member(v, "source")) d.source = source(*x, child(path, "source"));
        if (const Json* x = member(v, "pipeline"))
            d.pipeline = pipeline(*x, child(path, "pipeline"));
        if (const Json* x = member(v, "validation_split"))
            d.validationSplit =
                getNumberInRange(*x, child(path, "validation_split"), 0.0, 1.0, false);
        decodeStep(d, child(child(path, "pipeline"), "map"));
        if (const Json* x = member(v, "validation_data")) {
            const std::string vpath = child(path, "validation_data");
            d.validationData = getString(*x, vpath);
            if (d.validationData != "none" && d.validationData != "test")
                fail(vpath, "expected \"none\" or \"test\", got \"" + d.validationData + "\"");
            else if (d.validationData == "test" && d.validationSplit > 0)
                fail(vpath, "\"test\" cannot be combined with validation_split > 0 (choose one)");
        }
        return d;
    }

    // ---- training ----------------------------------------------------------------------------

    static void schedule(const Json& v, const std::string& path, OptimizerConfig& o) {
        requireObject(v, path);
        checkKeys(v, path, {"class_name", "config", "module", "registered_name"});
        const Json& cn = requireMember(v, path, "class_name");
        const std::string cls = squashName(getString(cn, child(path, "class_name")));
        ScheduleConfig s;
        if (cls == "exponentialdecay") {
            s.type = "exponential_decay";
        } else if (cls == "cosinedecay") {
            s.type = "cosine_decay";
        } else {
            fail(child(path, "class_name"),
                 "unsupported learning rate schedule " + describe(cn) +
                     " (supported: ExponentialDecay, CosineDecay; or give a number)");
        }
        const Json& cfg = requireMember(v, path, "config");
        const std::string cp = child(path, "config");
        requireObject(cfg, cp);
        if (s.type == "exponential_decay") {
            checkKeys(cfg, cp,
                      {"initial_learning_rate", "decay_steps", "decay_rate", "staircase", "name"});
            s.decayRate =
                getPositiveNumber(requireMember(cfg, cp, "decay_rate"), child(cp, "decay_rate"));
            if (const Json* x = member(cfg, "staircase"))
                s.staircase = getBool(*x, child(cp, "staircase"));
        } else {
            checkKeys(cfg, cp,
                      {"initial_learning_rate", "decay_steps", "alpha", "name", "warmup_target",
                       "warmup_steps"});
            if (const Json* x = member(cfg, "alpha"))
                s.alpha = getNumberInRange(*x, child(cp, "alpha"), 0.0, 1.0, true);
            if (const Json* x = member(cfg, "warmup_target"))
                s.warmupTarget = getOptionalPositive(*x, child(cp, "warmup_target"));
            if (const Json* x = member(cfg, "warmup_steps"))
                s.warmupSteps = getNonNegativeInteger(*x, child(cp, "warmup_steps"));
        }
        o.learningRate = getPositiveNumber(requireMember(cfg, cp, "initial_learning_rate"),
                                           child(cp, "initial_learning_rate"));
        s.decaySteps =
            getPositiveInteger(requireMember(cfg, cp, "decay_steps"), child(cp, "decay_steps"));
        if (const Json* x = member(cfg, "name")) getString(*x, child(cp, "name"));
        o.schedule = s;
    }

    static OptimizerConfig optimizer(const Json& v, const std::string& path) {
        static const std::vector<std::string> classNames{"SGD", "Adam", "AdamW", "RMSprop"};
        const KerasRef ref = readKerasRef(v, path, "an optimizer name");
        const Json* cfgPtr = ref.config;
        const std::string& given = ref.name;
        const std::string& namePath = ref.namePath;
        OptimizerConfig o;
        const std::string key = squashName(given);
        if (key == "sgd" || key == "adam" || key == "adamw" || key == "rmsprop") {
            o.name = key;
        } else {
            fail(namePath, "unknown optimizer " + squote(given) +
                               " (supported: " + joinPlain(classNames) + ")");
        }
        // Keras defaults that differ from OptimizerConfig's.
        if (o.name == "sgd") o.learningRate = 0.01;
        if (o.name == "adamw") o.weightDecay = 0.004;
        if (!cfgPtr) return o;

        const Json& cfg = *cfgPtr;
        const std::string cp = child(path, "config");
        requireObject(cfg, cp);
        std::vector<std::string> valid{"learning_rate", "weight_decay", "clipnorm",
                                       "global_clipnorm", "clipvalue"};
        if (o.name == "sgd") valid.insert(valid.end(), {"momentum", "nesterov"});
        if (o.name == "adam" || o.name == "adamw")
            valid.insert(valid.end(), {"beta_1", "beta_2", "epsilon", "amsgrad"});
        if (o.name == "rmsprop")
            valid.insert(valid.end(), {"rho", "momentum", "epsilon", "centered"});
        // Written by Keras' get_config(); accepted at their defaults.
        valid.insert(valid.end(), {"name", "use_ema", "ema_momentum", "ema_overwrite_frequency",
                                   "loss_scale_factor", "gradient_accumulation_steps",
                                   "jit_compile", "is_legacy_optimizer"});
        checkKeys(cfg, cp, valid);

        if (const Json* x = member(cfg, "learning_rate")) {
            if (x->is_object())
                schedule(*x, child(cp, "learning_rate"), o);
            else
                o.learningRate = getPositiveNumber(*x, child(cp, "learning_rate"));
        }
        if (const Json* x = member(cfg, "weight_decay"); x && !x->is_null())
            o.weightDecay = getNonNegativeNumber(*x, child(cp, "weight_decay"));
        if (const Json* x = member(cfg, "clipnorm"))
            o.clipnorm = getOptionalPositive(*x, child(cp, "clipnorm"));
        if (const Json* x = member(cfg, "global_clipnorm"))
            o.globalClipnorm = getOptionalPositive(*x, child(cp, "global_clipnorm"));
        if (const Json* x = member(cfg, "clipvalue"))
            o.clipvalue = getOptionalPositive(*x, child(cp, "clipvalue"));
        if (o.clipnorm && o.globalClipnorm) fail(cp, "give clipnorm or global_clipnorm, not both");
        if (const Json* x = member(cfg, "beta_1"))
            o.beta1 = getNumberInRange(*x, child(cp, "beta_1"), 0.0, 1.0, false);
        if (const Json* x = member(cfg, "beta_2"))
            o.beta2 = getNumberInRange(*x, child(cp, "beta_2"), 0.0, 1.0, false);
        if (const Json* x = member(cfg, "epsilon"))
            o.epsilon = getPositiveNumber(*x, child(cp, "epsilon"));
        if (const Json* x = member(cfg, "amsgrad")) o.amsgrad = getBool(*x, child(cp, "amsgrad"));
        if (const Json* x = member(cfg, "momentum"))
            o.momentum = getNumberInRange(*x, child(cp, "momentum"), 0.0, 1.0, false);
        if (const Json* x = member(cfg, "nesterov"))
            o.nesterov = getBool(*x, child(cp, "nesterov"));
        if (const Json* x = member(cfg, "rho"))
            o.rho = getNumberInRange(*x, child(cp, "rho"), 0.0, 1.0, false);
        if (const Json* x = member(cfg, "centered"))
            o.centered = getBool(*x, child(cp, "centered"));
        if (const Json* x = member(cfg, "name")) getString(*x, child(cp, "name"));
        if (const Json* x = member(cfg, "use_ema"); x && !(x->is_boolean() && !x->get<bool>()))
            fail(child(cp, "use_ema"),
                 "a moving average of the weights is not supported (expected false), got " +
                     describe(*x));
        if (const Json* x = member(cfg, "is_legacy_optimizer");
            x && !(x->is_boolean() && !x->get<bool>()))
            fail(child(cp, "is_legacy_optimizer"), "expected false, got " + describe(*x));
        for (const char* k : {"loss_scale_factor", "gradient_accumulation_steps"})
            if (const Json* x = member(cfg, k); x && !x->is_null())
                fail(child(cp, k), "not supported (expected null), got " + describe(*x));
        if (const Json* x = member(cfg, "jit_compile")) getBool(*x, child(cp, "jit_compile"));
        return o;
    }

    static LossConfig loss(const Json& v, const std::string& path) {
        struct Entry {
            const char* name;
            const char* className;
        };
        static const Entry kLosses[] = {
            {"sparse_categorical_crossentropy", "SparseCategoricalCrossentropy"},
            {"categorical_crossentropy", "CategoricalCrossentropy"},
            {"binary_crossentropy", "BinaryCrossentropy"},
            {"mean_squared_error", "MeanSquaredError"},
        };
        const KerasRef ref = readKerasRef(v, path, "a loss name");
        const std::string& given = ref.name;
        const std::string& namePath = ref.namePath;
        const Json* cfg = ref.config;
        LossConfig l;
        std::string key = squashName(given);
        if (key == "mse") key = "meansquarederror";
        bool found = false;
        for (const auto& e : kLosses)
            if (key == squashName(e.name)) {
                l.name = e.name;
                found = true;
            }
        if (!found) {
            std::vector<std::string> names;
            for (const auto& e : kLosses) names.push_back(e.name);
            names.push_back("mse");
            fail(namePath, "unknown loss " + squote(given) + " (supported: " + joinPlain(names) +
                               "; or the class names SparseCategoricalCrossentropy, "
                               "CategoricalCrossentropy, BinaryCrossentropy, MeanSquaredError)");
        }
        if (!cfg) return l;
        const std::string cp = child(path, "config");
        requireObject(*cfg, cp);
        std::vector<std::string> valid{"name", "reduction", "dtype"};
        if (l.name != "mean_squared_error")
            valid.insert(valid.end(), {"from_logits", "label_smoothing", "axis"});
        if (l.name == "sparse_categorical_crossentropy") valid.push_back("ignore_class");
        checkKeys(*cfg, cp, valid);
        if (const Json* x = member(*cfg, "from_logits"))
            l.fromLogits = getBool(*x, child(cp, "from_logits"));
        if (const Json* x = member(*cfg, "reduction"); x && !x->is_null())
            getOneOf(*x, child(cp, "reduction"), {"sum_over_batch_size", "auto"});
        if (const Json* x = member(*cfg, "label_smoothing");
            x && !(x->is_number() && x->get<double>() == 0.0))
            fail(child(cp, "label_smoothing"),
                 "label smoothing is not supported (expected 0), got " + describe(*x));
        if (const Json* x = member(*cfg, "axis");
            x && !(x->is_number_integer() && x->get<int64_t>() == -1))
            fail(child(cp, "axis"), "only the last axis (-1) is supported, got " + describe(*x));
        if (const Json* x = member(*cfg, "ignore_class"); x && !x->is_null())
            fail(child(cp, "ignore_class"), "not supported (expected null), got " + describe(*x));
        if (const Json* x = member(*cfg, "name")) getString(*x, child(cp, "name"));
        return l;
    }

    static std::string metric(const Json& v, const std::string& path) {
        static const std::vector<std::string> kNames{"accuracy",
                                                     "acc",
                                                     "sparse_categorical_accuracy",
                                                     "categorical_accuracy",
                                                     "binary_accuracy",
                                                     "top_k_categorical_accuracy",
                                                     "sparse_top_k_categorical_accuracy"};
        if (v.is_string()) {
            const std::string s = v.get<std::string>();
            if (std::find(kNames.begin(), kNames.end(), s) != kNames.end()) return s;
            static const std::regex topK("(sparse_)?top_([1-9][0-9]*)_categorical_accuracy");
            if (std::smatch m; std::regex_match(s, m, topK)) {
                if (m[2].length() > 10 || std::stoll(m[2].str()) > kMaxInt32)
                    fail(path, "k in " + squote(s) + " must be at most 2147483647");
                return s;
            }
            fail(path, "unknown metric " + squote(s) + " (valid: " + joinPlain(kNames) +
                           ", top_<k>_categorical_accuracy, sparse_top_<k>_categorical_accuracy)");
        }
        if (!v.is_object())
            fail(path,
                 "expected a metric name or {\"class_name\", \"config\"}, got " + describe(v));
        checkKeys(v, path, {"class_name", "config", "module", "registered_name"});
        const std::string np = child(path, "class_name");
        const std::string cls = getString(requireMember(v, path, "class_name"), np);
        const Json emptyConfig = Json::object();
        const Json* cfg = member(v, "config");
        if (!cfg || cfg->is_null()) cfg = &emptyConfig;
        const std::string cp = child(path, "config");
        requireObject(*cfg, cp);
        const std::string key = squashName(cls);
        if (key == "sparsecategoricalaccuracy" || key == "categoricalaccuracy") {
            checkKeys(*cfg, cp, {"name", "dtype"});
            return key == "categoricalaccuracy" ? "categorical_accuracy"
                                                : "sparse_categorical_accuracy";
        }
        if (key == "binaryaccuracy") {
            checkKeys(*cfg, cp, {"name", "dtype", "threshold"});
            if (const Json* x = member(*cfg, "threshold");
                x && !(x->is_number() && x->get<double>() == 0.5))
                fail(child(cp, "threshold"), "only 0.5 is supported, got " + describe(*x));
            return "binary_accuracy";
        }
        if (key == "topkcategoricalaccuracy" || key == "sparsetopkcategoricalaccuracy") {
            checkKeys(*cfg, cp, {"name", "dtype", "k", "from_sorted_ids"});
            int64_t k = 5;
            if (const Json* x = member(*cfg, "k"))
                k = atMostInt32(getPositiveInteger(*x, child(cp, "k")), child(cp, "k"),
                                "k counts classes");
            if (const Json* x = member(*cfg, "from_sorted_ids");
                x && !(x->is_boolean() && !x->get<bool>()))
                fail(child(cp, "from_sorted_ids"), "expected false, got " + describe(*x));
            return std::string(key[0] == 's' ? "sparse_" : "") + "top_" + std::to_string(k) +
                   "_categorical_accuracy";
        }
        fail(np, "unknown metric class " + squote(cls) +
                     " (supported: SparseCategoricalAccuracy, CategoricalAccuracy, BinaryAccuracy, "
                     "TopKCategoricalAccuracy, SparseTopKCategoricalAccuracy)");
    }

    static CallbackConfig callback(const Json& v, const std::string& path) {
        const KerasRef ref = readKerasRef(v, path, "a callback name");
        const std::string& given = ref.name;
        const std::string& namePath = ref.namePath;
        const Json* cfg = ref.config;
        CallbackConfig c;
        const std::string key = squashName(given);
        if (key == "earlystopping") {
            c.type = "early_stopping";
        } else if (key == "reducelronplateau") {
            c.type = "reduce_lr_on_plateau";
            c.patience = 10;  // Keras defaults
            c.minDelta = 1e-4;
        } else if (key == "terminateonnan") {
            c.type = "terminate_on_nan";
        } else if (key == "modelcheckpoint") {
            c.type = "model_checkpoint";
        } else if (key == "backupandrestore") {
            c.type = "backup_and_restore";
        } else {
            fail(namePath, "unknown callback " + squote(given) +
                               " (supported: EarlyStopping, ReduceLROnPlateau, TerminateOnNaN, "
                               "ModelCheckpoint, BackupAndRestore)");
        }
        if (!cfg && c.type == "backup_and_restore")
            fail(child(child(path, "config"), "backup_dir"),
                 "required: the folder BackupAndRestore keeps its backup in");
        if (!cfg) return c;
        const std::string cp = child(path, "config");
        requireObject(*cfg, cp);
        if (c.type == "early_stopping")
            checkKeys(*cfg, cp,
                      {"monitor", "min_delta", "patience", "verbose", "mode", "baseline",
                       "restore_best_weights", "start_from_epoch"});
        else if (c.type == "reduce_lr_on_plateau")
            checkKeys(*cfg, cp,
                      {"monitor", "factor", "patience", "verbose", "mode", "min_delta", "cooldown",
                       "min_lr"});
        else if (c.type == "model_checkpoint")
            checkKeys(*cfg, cp,
                      {"directory", "monitor", "mode", "verbose", "save_best_only", "save_freq",
                       "keep_last"});
        else if (c.type == "backup_and_restore")
            checkKeys(*cfg, cp, {"backup_dir", "save_freq", "delete_checkpoint"});
        else
            checkKeys(*cfg, cp, {});
        auto smallInt = [&](const char* k) {
            int64_t n = getNonNegativeInteger(*member(*cfg, k), child(cp, k));
            if (n > 1000000)
                fail(child(cp, k), "expected at most 1000000, got " + std::to_string(n));
            return static_cast<int>(n);
        };
        if (const Json* x = member(*cfg, "monitor"))
            c.monitor = getNonEmptyString(*x, child(cp, "monitor"));
        if (const Json* x = member(*cfg, "min_delta"))
            c.minDelta = getNonNegativeNumber(*x, child(cp, "min_delta"));
        if (member(*cfg, "patience")) c.patience = smallInt("patience");
        if (const Json* x = member(*cfg, "mode"))
            c.mode = getOneOf(*x, child(cp, "mode"), {"auto", "min", "max"});
        if (const Json* x = member(*cfg, "verbose")) getInteger(*x, child(cp, "verbose"));
        if (const Json* x = member(*cfg, "baseline"); x && !x->is_null())
            fail(child(cp, "baseline"),
                 "a baseline is not supported (expected null), got " + describe(*x));
        if (const Json* x = member(*cfg, "restore_best_weights"))
            c.restoreBestWeights = getBool(*x, child(cp, "restore_best_weights"));
        if (member(*cfg, "start_from_epoch")) c.startFromEpoch = smallInt("start_from_epoch");
        if (const Json* x = member(*cfg, "factor")) {
            c.factor = getNumberInRange(*x, child(cp, "factor"), 0.0, 1.0, false);
            if (c.factor == 0.0) fail(child(cp, "factor"), "expected a number in (0, 1), got 0");
        }
        if (member(*cfg, "cooldown")) c.cooldown = smallInt("cooldown");
        if (const Json* x = member(*cfg, "min_lr"))
            c.minLr = getNonNegativeNumber(*x, child(cp, "min_lr"));
        checkpointFields(*cfg, cp, c);
        return c;
    }

    // ModelCheckpoint and BackupAndRestore: folder, frequency, what to keep.
    static void checkpointFields(const Json& cfg, const std::string& cp, CallbackConfig& c) {
        const char* dirKey = c.type == "backup_and_restore" ? "backup_dir" : "directory";
        if (const Json* x = member(cfg, dirKey)) {
            c.directory = getNonEmptyString(*x, child(cp, dirKey));
            if (c.directory.size() > 4096 ||
                c.directory.find_first_of(std::string("\0\n", 2)) != std::string::npos)
                fail(child(cp, dirKey), "expected a folder path of at most 4096 bytes on one line");
        } else if (c.type == "backup_and_restore") {
            fail(child(cp, dirKey), "required: the folder BackupAndRestore keeps its backup in");
        }
        if (const Json* x = member(cfg, "save_freq")) {
            const std::string fp = child(cp, "save_freq");
            if (x->is_string()) {
                getOneOf(*x, fp, {"epoch"});
                c.saveFreqSteps = 0;
            } else if (x->is_number_integer() || x->is_number_unsigned()) {
                c.saveFreqSteps = getPositiveInteger(*x, fp);
                if (c.saveFreqSteps > 1000000000)
                    fail(fp, "expected at most 1000000000 steps, got " +
                                 std::to_string(c.saveFreqSteps));
            } else {
                fail(fp, "expected \"epoch\" or a positive number of steps, got " + describe(*x));
            }
        }
        if (const Json* x = member(cfg, "save_best_only"))
            c.saveBestOnly = getBool(*x, child(cp, "save_best_only"));
        if (const Json* x = member(cfg, "keep_last")) {
            const int64_t k = getPositiveInteger(*x, child(cp, "keep_last"));
            if (k > 1000)
                fail(child(cp, "keep_last"),
                     "expected at most 1000 files, got " + std::to_string(k));
            c.keepLast = static_cast<int>(k);
        }
        if (const Json* x = member(cfg, "delete_checkpoint"))
            c.deleteCheckpoint = getBool(*x, child(cp, "delete_checkpoint"));
    }

    static TrainConfig training(const Json& v, const std::string& path) {
        requireObject(v, path);
        checkKeys(v, path,
                  {"epochs", "initial_epoch", "batch_size", "seed", "optimizer", "loss", "metrics",
                   "callbacks", "log_every_steps", "evaluate_test", "run_checkpoints"});
        TrainConfig t;
        auto intField = [&](const char* k, bool positive) {
            const std::string p = child(path, k);
            int64_t n = positive ? getPositiveInteger(*member(v, k), p)
                                 : getNonNegativeInteger(*member(v, k), p);
            if (n > 100000000) fail(p, "expected at most 100000000, got " + std::to_string(n));
            return static_cast<int>(n);
        };
        if (member(v, "epochs")) t.epochs = intField("epochs", true);
        if (member(v, "initial_epoch")) t.initialEpoch = intField("initial_epoch", false);
        if (t.initialEpoch >= t.epochs)
            fail(child(path, "initial_epoch"), "expected an epoch before training.epochs (" +
                                                   std::to_string(t.epochs) + "), got " +
                                                   std::to_string(t.initialEpoch));
        if (const Json* x = member(v, "batch_size"))
            t.batchSize = atMostInt32(getPositiveInteger(*x, child(path, "batch_size")),
                                      child(path, "batch_size"), "a batch is a set of samples");
        if (const Json* x = member(v, "seed")) t.seed = getUnsigned(*x, child(path, "seed"));
        if (const Json* x = member(v, "optimizer"))
            t.optimizer = optimizer(*x, child(path, "optimizer"));
        if (const Json* x = member(v, "loss")) t.loss = loss(*x, child(path, "loss"));
        if (const Json* x = member(v, "metrics")) {
            const std::string mp = child(path, "metrics");
            requireArray(*x, mp);
            t.metrics.clear();
            for (size_t i = 0; i < x->size(); ++i) {
                std::string m = metric((*x)[i], child(mp, i));
                if (std::find(t.metrics.begin(), t.metrics.end(), m) != t.metrics.end())
                    fail(child(mp, i), "duplicate metric " + squote(m));
                t.metrics.push_back(m);
            }
        }
        if (const Json* x = member(v, "callbacks")) {
            const std::string cp = child(path, "callbacks");
            requireArray(*x, cp);
            for (size_t i = 0; i < x->size(); ++i)
                t.callbacks.push_back(callback((*x)[i], child(cp, i)));
        }
        if (const Json* x = member(v, "log_every_steps"))
            t.logEverySteps = getPositiveInteger(*x, child(path, "log_every_steps"));
        if (const Json* x = member(v, "evaluate_test"))
            t.evaluateTest = getBool(*x, child(path, "evaluate_test"));
        if (const Json* x = member(v, "run_checkpoints"))
            t.runCheckpoints = getBool(*x, child(path, "run_checkpoints"));

        // A callback can only watch a quantity that fit() logs.
        std::vector<std::string> logged{"loss"};
        logged.insert(logged.end(), t.metrics.begin(), t.metrics.end());
        for (size_t i = 0; i < t.callbacks.size(); ++i) {
            const CallbackConfig& c = t.callbacks[i];
            if (c.type == "terminate_on_nan" || c.type == "backup_and_restore" ||
                (c.type == "model_checkpoint" && !c.saveBestOnly))
                continue;
            std::string base = c.monitor.rfind("val_", 0) == 0 ? c.monitor.substr(4) : c.monitor;
            if (std::find(logged.begin(), logged.end(), base) == logged.end()) {
                std::vector<std::string> all = logged;
                for (const auto& l : logged) all.push_back("val_" + l);
                fail(child(child(child(path, "callbacks"), i), "config.monitor"),
                     "monitor " + squote(c.monitor) +
                         " is not a logged quantity (logged: " + joinPlain(all) + ")");
            }
        }
        return t;
    }

    // ---- precision / strategy ----------------------------------------------------------------

    static PrecisionPolicy precision(const Json& v, const std::string& path) {
        const std::string s = getOneOf(v, path, {"float32", "mixed_float16", "mixed_bfloat16"});
        if (s == "mixed_float16") return PrecisionPolicy::MixedFloat16;
        if (s == "mixed_bfloat16") return PrecisionPolicy::MixedBfloat16;
        return PrecisionPolicy::Float32;
    }

    static StrategyConfig strategy(const Json& v, const std::string& path) {
        requireObject(v, path);
        checkKeys(v, path, {"type", "devices", "replicas", "timeout_seconds", "shard_policy"});
        StrategyConfig s;
        if (const Json* x = member(v, "type"))
            s.type = getOneOf(*x, child(path, "type"),
                              {"one_device", "mirrored", "multi_worker_mirrored"});
        if (const Json* x = member(v, "devices")) {
            const std::string dp = child(path, "devices");
            requireArray(*x, dp);
            static const std::regex device("(cpu|cuda|gpu):[0-9]+");
            for (size_t i = 0; i < x->size(); ++i) {
                const std::string d = (*x)[i].is_string() ? (*x)[i].get<std::string>() : "";
                if (!std::regex_match(d, device))
                    fail(child(dp, i), "expected a device id like \"cpu:0\" or \"cuda:1\", got " +
                                           describe((*x)[i]));
                // Device indices are small; a long one would wrap when read as an int.
                if (const size_t colon = d.find(':'); d.size() - colon - 1 > 4)
                    fail(child(dp, i),
                         "expected a device index of at most 4 digits, got " + describe((*x)[i]));
                if (std::find(s.devices.begin(), s.devices.end(), d) != s.devices.end())
                    fail(child(dp, i), "duplicate device " + squote(d));
                s.devices.push_back(d);
            }
        }
        if (const Json* x = member(v, "replicas")) {
            int64_t n = getNonNegativeInteger(*x, child(path, "replicas"));
            if (n > 4096)
                fail(child(path, "replicas"), "expected at most 4096, got " + std::to_string(n));
            s.replicas = static_cast<int>(n);
        }
        if (const Json* x = member(v, "timeout_seconds")) {
            const std::string tp = child(path, "timeout_seconds");
            s.timeoutSeconds = getPositiveNumber(*x, tp);
            if (s.timeoutSeconds > kMaxStrategyTimeoutSeconds)
                fail(tp, "expected at most 86400 (one day), got " + describe(*x));
        }
        if (const Json* x = member(v, "shard_policy"))
            s.shardPolicy = getOneOf(*x, child(path, "shard_policy"), {"auto", "data", "off"});
        if (s.type == "one_device") {
            if (s.devices.size() > 1)
                fail(child(path, "devices"),
                     "a one_device strategy takes at most one device, got " +
                         std::to_string(s.devices.size()));
            if (s.replicas > 1)
                fail(child(path, "replicas"), "a one_device strategy has one replica, got " +
                                                  std::to_string(s.replicas) +
                                                  " (use \"mirrored\" for more)");
        }
        return s;
    }

    // ---- project -----------------------------------------------------------------------------

    Project project(const Json& root) const {
        requireObject(root, "");
        if (!member(root, "format") && member(root, "class_name") && member(root, "config"))
            fail("",
                 "this is a Keras model JSON, not a TrainDeck project (import it as the model "
                 "of a project instead)");
        checkKeys(
            root, "",
            {"format", "version", "name", "description", "model", "data", "training", "precision",
             "loss_scale", "fusion", "disabled_passes", "strategy", "initial_weights"});
        getOneOf(requireMember(root, "", "format"), "format", {kFormat});
        if (const Json* x = member(root, "version")) {
            int64_t ver = getPositiveInteger(*x, "version");
            if (ver > kVersion)
                fail("version", "version " + std::to_string(ver) +
                                    " is newer than this TrainDeck reads (" +
                                    std::to_string(kVersion) + ")");
        }
        Project p;
        if (const Json* x = member(root, "name")) {
            p.name = freeText(*x, "name", TextKind::Name);
            if (p.name.empty()) fail("name", "expected a non-empty string, got \"\"");
        }
        if (const Json* x = member(root, "description"))
            p.description = freeText(*x, "description", TextKind::LongText);
        p.model = parseKerasModel(requireMember(root, "", "model"), "model", &p.warnings);
        if (const Json* x = member(root, "data")) p.data = data(*x, "data");
        if (const Json* x = member(root, "training")) p.training = training(*x, "training");
        if (const Json* x = member(root, "precision")) p.precision = precision(*x, "precision");
        if (const Json* x = member(root, "loss_scale")) {
            requireObject(*x, "loss_scale");
            checkKeys(*x, "loss_scale", {"initial_scale", "dynamic_growth_steps"});
            if (const Json* y = member(*x, "initial_scale")) {
                p.lossScaleInitial = getPositiveNumber(*y, "loss_scale.initial_scale");
                if (p.lossScaleInitial > 1e38)
                    fail("loss_scale.initial_scale",
                         "expected at most 1e38 (a float32), got " + describe(*y));
            }
            if (const Json* y = member(*x, "dynamic_growth_steps")) {
                p.lossScaleGrowthSteps = getPositiveInteger(*y, "loss_scale.dynamic_growth_steps");
                if (p.lossScaleGrowthSteps > std::numeric_limits<int32_t>::max())
                    fail("loss_scale.dynamic_growth_steps",
                         "expected at most 2147483647, got " + describe(*y));
            }
        }
        if (const Json* x = member(root, "fusion")) p.fusion = getBool(*x, "fusion");
        if (const Json* x = member(root, "disabled_passes")) {
            requireArray(*x, "disabled_passes");
            for (size_t i = 0; i < x->size(); ++i) {
                const std::string path = child("disabled_passes", i);
                if (!(*x)[i].is_string()) fail(path, "expected a pass name (a string)");
                const std::string name = (*x)[i].get<std::string>();
                if (std::find(p.disabledPasses.begin(), p.disabledPasses.end(), name) !=
                    p.disabledPasses.end())
                    fail(path, "duplicate pass " + squote(name));
                if (name.empty() || name.size() > 64)
                    fail(path, "expected a pass name of 1 to 64 characters");
                p.disabledPasses.push_back(name);
            }
        }
        if (const Json* x = member(root, "strategy")) p.strategy = strategy(*x, "strategy");
        if (const Json* x = member(root, "initial_weights"))
            p.initialWeights = resolvePath(getNonEmptyString(*x, "initial_weights"), baseDir);

        auto info = inferShapes(p.model);
        if (!info) fail("model", info.error());

        // Class count of a synthetic source is known: check it against the model's output.
        const auto& src = p.data.source;
        const auto& lossName = p.training.loss.name;
        if (src.type == "synthetic" && info->outputShape.size() == 1 &&
            (lossName == "sparse_categorical_crossentropy" ||
             lossName == "categorical_crossentropy") &&
            info->outputShape[0] != src.classes)
            fail("model", "the last layer outputs " + std::to_string(info->outputShape[0]) +
                              " values but data.source.classes is " + std::to_string(src.classes) +
                              " (" + lossName + " needs one output per class)");
        return p;
    }
};

Result<Project> parseProjectImpl(const std::string& text, const std::string& displayName,
                                 const std::string& baseDir) {
    if (text.size() > kMaxProjectBytes)
        return err(displayName + ": " + formatBytes(double(text.size())) +
                   " is too large for a project file (at most " +
                   formatBytes(double(kMaxProjectBytes)) + ")");
    try {
        Json root = parseText(text, "");
        Reader r{baseDir};
        return r.project(root);
    } catch (const FieldError& e) {
        return err(formatError(displayName, e));
    } catch (const std::exception& e) {
        return err(displayName + ": " + e.what());
    }
}

// ---- writing -----------------------------------------------------------------------------------

Json optionalJson(const std::optional<double>& v) {
    return v ? Json(*v) : Json(nullptr);
}

Json sourceJson(const SourceConfig& s) {
    Json j{{"type", s.type}};
    auto pair = [&](const char* a, const std::string& va, const char* b, const std::string& vb) {
        if (!va.empty()) j[a] = va;
        if (!vb.empty()) j[b] = vb;
    };
    if (s.type == "idx") {
        pair("train_images", s.trainImages, "train_labels", s.trainLabels);
        pair("test_images", s.testImages, "test_labels", s.testLabels);
    } else if (s.type == "npy") {
        pair("train_x", s.trainImages, "train_y", s.trainLabels);
        pair("test_x", s.testImages, "test_y", s.testLabels);
    } else if (s.type == "csv") {
        pair("train", s.trainPath, "test", s.testPath);
        j["label_column"] = s.labelColumn;
    }
    if (s.type == "idx" || s.type == "npy" || s.type == "csv")
        j["non_finite"] = nonFiniteName(s.nonFinite);
    else if (s.type == "image_directory") {
        const ImageDirectoryConfig& c = s.images;
        j["directory"] = c.directory;
        if (!c.testDirectory.empty()) j["test_directory"] = c.testDirectory;
        j["labels"] = c.labelsInferred ? Json("inferred") : Json(c.labels);
        j["label_mode"] = c.labelMode;
        if (!c.classNames.empty()) j["class_names"] = c.classNames;
        j["color_mode"] = c.colorMode;
        j["image_size"] = {c.height, c.width};
        j["interpolation"] = c.interpolation;
        j["crop_to_aspect_ratio"] = c.cropToAspectRatio;
        j["pad_to_aspect_ratio"] = c.padToAspectRatio;
        j["follow_links"] = c.followLinks;
        j["shuffle"] = c.shuffle;
        j["seed"] = c.seed ? Json(*c.seed) : Json(nullptr);
        j["validation_split"] = c.validationSplit;
        j["skip_bad_files"] = c.skipBadFiles;
    } else if (s.type == "tfrecord") {
        const TfRecordConfig& c = s.records;
        j["files"] = c.files;
        if (!c.testFiles.empty()) j["test_files"] = c.testFiles;
        j["compression"] = c.compression.empty() ? Json(nullptr) : Json(c.compression);
        Json x = {{"feature", c.xFeature}, {"decode", c.xDecode}};
        if (c.xDecode == "image") {
            x["color_mode"] = c.image.colorMode;
            x["image_size"] = {c.image.height, c.image.width};
            x["interpolation"] = c.image.interpolation;
            x["crop_to_aspect_ratio"] = c.image.cropToAspectRatio;
            x["pad_to_aspect_ratio"] = c.image.padToAspectRatio;
        } else {
            if (c.xDecode == "raw") x["dtype"] = c.rawDtype;
            x["shape"] = c.xShape;
        }
        j["x"] = x;
        Json y = {{"feature", c.yFeature}, {"decode", c.yDecode}};
        if (c.yDecode == "float") y["shape"] = {c.yWidth};
        j["y"] = y;
        if (c.cycleLength > 0) j["cycle_length"] = c.cycleLength;
        j["block_length"] = c.blockLength;
        j["shuffle_files"] = c.shuffleFiles;
        j["skip_bad_files"] = c.skipBadFiles;
    } else if (s.type == "synthetic") {
        j["samples"] = s.samples;
        j["test_samples"] = s.testSamples;
        j["shape"] = s.sampleShape;
        j["classes"] = s.classes;
        j["seed"] = s.seed;
    }
    return j;
}

Json autotuneJson(int64_t v) {
    return v == kAutotune ? Json("autotune") : Json(v);
}

Json dataJson(const DataConfig& d) {
    Json map = Json::array();
    for (const MapStep& m : d.pipeline.map) {
        Json s{{"op", m.op}};
        if (m.op == "scale") s["factor"] = m.factor;
        if (m.op == "normalize") {
            s["mean"] = m.mean;
            s["std"] = m.stddev;
        }
        if (m.op == "one_hot") s["depth"] = m.depth;
        map.push_back(s);
    }
    const PipelineConfig& p = d.pipeline;
    Json pipe{{"map", map},
              {"cache", p.cache},
              {"shuffle_buffer", p.shuffleBuffer},
              {"shuffle_seed", p.shuffleSeed ? Json(*p.shuffleSeed) : Json(nullptr)},
              {"reshuffle_each_iteration", p.reshuffleEachIteration},
              {"drop_remainder", p.dropRemainder},
              {"prefetch", autotuneJson(p.prefetch)},
              {"parallel_calls", autotuneJson(p.parallelCalls)}};
    return Json{{"source", sourceJson(d.source)},
                {"pipeline", pipe},
                {"validation_split", d.validationSplit},
                {"validation_data", d.validationData}};
}

const char* optimizerClassName(const std::string& name) {
    if (name == "sgd") return "SGD";
    if (name == "adamw") return "AdamW";
    if (name == "rmsprop") return "RMSprop";
    return "Adam";
}

Json optimizerJson(const OptimizerConfig& o) {
    Json cfg = Json::object();
    const ScheduleConfig& s = o.schedule;
    if (s.type == "exponential_decay") {
        cfg["learning_rate"] = Json{{"class_name", "ExponentialDecay"},
                                    {"config",
                                     {{"initial_learning_rate", o.learningRate},
                                      {"decay_steps", s.decaySteps},
                                      {"decay_rate", s.decayRate},
                                      {"staircase", s.staircase}}}};
    } else if (s.type == "cosine_decay") {
        cfg["learning_rate"] = Json{{"class_name", "CosineDecay"},
                                    {"config",
                                     {{"initial_learning_rate", o.learningRate},
                                      {"decay_steps", s.decaySteps},
                                      {"alpha", s.alpha},
                                      {"warmup_target", optionalJson(s.warmupTarget)},
                                      {"warmup_steps", s.warmupSteps}}}};
    } else {
        cfg["learning_rate"] = o.learningRate;
    }
    if (o.name == "sgd") {
        cfg["momentum"] = o.momentum;
        cfg["nesterov"] = o.nesterov;
    } else if (o.name == "rmsprop") {
        cfg["rho"] = o.rho;
        cfg["momentum"] = o.momentum;
        cfg["epsilon"] = o.epsilon;
        cfg["centered"] = o.centered;
    } else {
        cfg["beta_1"] = o.beta1;
        cfg["beta_2"] = o.beta2;
        cfg["epsilon"] = o.epsilon;
        cfg["amsgrad"] = o.amsgrad;
    }
    cfg["weight_decay"] = o.weightDecay;
    cfg["clipnorm"] = optionalJson(o.clipnorm);
    cfg["global_clipnorm"] = optionalJson(o.globalClipnorm);
    cfg["clipvalue"] = optionalJson(o.clipvalue);
    return Json{{"class_name", optimizerClassName(o.name)}, {"config", cfg}};
}

Json lossJson(const LossConfig& l) {
    const char* cls = "SparseCategoricalCrossentropy";
    if (l.name == "categorical_crossentropy") cls = "CategoricalCrossentropy";
    if (l.name == "binary_crossentropy") cls = "BinaryCrossentropy";
    if (l.name == "mean_squared_error")
        return Json{{"class_name", "MeanSquaredError"}, {"config", Json::object()}};
    return Json{{"class_name", cls}, {"config", {{"from_logits", l.fromLogits}}}};
}

Json callbackJson(const CallbackConfig& c) {
    if (c.type == "early_stopping")
        return Json{{"class_name", "EarlyStopping"},
                    {"config",
                     {{"monitor", c.monitor},
                      {"min_delta", c.minDelta},
                      {"patience", c.patience},
                      {"mode", c.mode},
                      {"restore_best_weights", c.restoreBestWeights},
                      {"start_from_epoch", c.startFromEpoch}}}};
    if (c.type == "reduce_lr_on_plateau")
        return Json{{"class_name", "ReduceLROnPlateau"},
                    {"config",
                     {{"monitor", c.monitor},
                      {"factor", c.factor},
                      {"patience", c.patience},
                      {"mode", c.mode},
                      {"min_delta", c.minDelta},
                      {"cooldown", c.cooldown},
                      {"min_lr", c.minLr}}}};
    if (c.type == "model_checkpoint") {
        Json cfg = {{"monitor", c.monitor},
                    {"mode", c.mode},
                    {"save_best_only", c.saveBestOnly},
                    {"save_freq", c.saveFreqSteps > 0 ? Json(c.saveFreqSteps) : Json("epoch")},
                    {"keep_last", c.keepLast}};
        if (!c.directory.empty()) cfg["directory"] = c.directory;
        return Json{{"class_name", "ModelCheckpoint"}, {"config", cfg}};
    }
    if (c.type == "backup_and_restore")
        return Json{{"class_name", "BackupAndRestore"},
                    {"config",
                     {{"backup_dir", c.directory},
                      {"save_freq", c.saveFreqSteps > 0 ? Json(c.saveFreqSteps) : Json("epoch")},
                      {"delete_checkpoint", c.deleteCheckpoint}}}};
    return Json{{"class_name", "TerminateOnNaN"}};
}

Json trainingJson(const TrainConfig& t) {
    Json callbacks = Json::array();
    for (const auto& c : t.callbacks) callbacks.push_back(callbackJson(c));
    return Json{{"epochs", t.epochs},
                {"initial_epoch", t.initialEpoch},
                {"batch_size", t.batchSize},
                {"seed", t.seed},
                {"optimizer", optimizerJson(t.optimizer)},
                {"loss", lossJson(t.loss)},
                {"metrics", t.metrics},
                {"callbacks", callbacks},
                {"log_every_steps", t.logEverySteps},
                {"evaluate_test", t.evaluateTest},
                {"run_checkpoints", t.runCheckpoints}};
}

std::string errnoText() {
    return std::strerror(errno);
}

}  // namespace

Result<Project> parseProject(const std::string& jsonText, const std::string& fileName) {
    return parseProjectImpl(jsonText, fileName, fs::path(fileName).parent_path().string());
}

Result<Project> loadProject(const std::string& path) {
    std::error_code ec;
    if (fs::is_directory(path, ec))
        return err("cannot open project file '" + path + "': it is a directory");
    if (const auto bytes = fs::file_size(path, ec); !ec && bytes > kMaxProjectBytes)
        return err(path + ": " + formatBytes(double(bytes)) +
                   " is too large for a project file (at most " +
                   formatBytes(double(kMaxProjectBytes)) + ")");
    std::ifstream in(path, std::ios::binary);
    if (!in) return err("cannot open project file '" + path + "': " + errnoText());
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad()) return err("cannot read project file '" + path + "': " + errnoText());
    fs::path abs = fs::absolute(fs::path(path), ec);
    if (ec) abs = fs::path(path);
    return parseProjectImpl(text.str(), path, abs.lexically_normal().parent_path().string());
}

std::string projectToJson(const Project& p) {
    Json j;
    j["format"] = kFormat;
    j["version"] = kVersion;
    j["name"] = p.name;
    j["description"] = p.description;
    j["model"] = kerasModelToJson(p.model);
    j["data"] = dataJson(p.data);
    j["training"] = trainingJson(p.training);
    j["precision"] = precisionName(p.precision);
    if (p.lossScaleInitial != Project{}.lossScaleInitial ||
        p.lossScaleGrowthSteps != Project{}.lossScaleGrowthSteps)
        j["loss_scale"] = Json{{"initial_scale", p.lossScaleInitial},
                               {"dynamic_growth_steps", p.lossScaleGrowthSteps}};
    j["fusion"] = p.fusion;
    if (!p.disabledPasses.empty()) j["disabled_passes"] = p.disabledPasses;
    j["strategy"] = Json{{"type", p.strategy.type},
                         {"devices", p.strategy.devices},
                         {"replicas", p.strategy.replicas},
                         {"timeout_seconds", p.strategy.timeoutSeconds},
                         {"shard_policy", p.strategy.shardPolicy}};
    if (!p.initialWeights.empty()) j["initial_weights"] = p.initialWeights;
    return prettyJson(j) + "\n";
}

Status saveProject(const Project& p, const std::string& path) {
    std::error_code ec;
    fs::path target = fs::absolute(fs::path(path), ec);
    if (ec) return err("cannot save project to '" + path + "': " + ec.message());
    target = target.lexically_normal();
    const fs::path dir = target.parent_path();

    // Data files inside the project's folder are stored relative to it, so the folder can move.
    Project copy = p;
    SourceConfig& s = copy.data.source;
    for (std::string* f : {&s.trainImages, &s.trainLabels, &s.testImages, &s.testLabels,
                           &s.trainPath, &s.testPath, &s.images.directory, &s.images.testDirectory})
        *f = relativePath(*f, dir);
    for (auto* list : {&s.records.files, &s.records.testFiles})
        for (std::string& f : *list) f = relativePath(f, dir);
    if (copy.data.pipeline.cache.rfind("file:", 0) == 0)
        copy.data.pipeline.cache = "file:" + relativePath(copy.data.pipeline.cache.substr(5), dir);
    copy.initialWeights = relativePath(copy.initialWeights, dir);
    const std::string text = projectToJson(copy);

    const std::string tmp =
        (dir / ("." + target.filename().string() + ".tmp" + std::to_string(::getpid()))).string();
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return err("cannot save project to '" + path + "': " + errnoText());
    size_t done = 0;
    while (done < text.size()) {
        ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            std::string why = errnoText();
            ::close(fd);
            ::unlink(tmp.c_str());
            return err("cannot save project to '" + path + "': " + why);
        }
        done += static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
        std::string why = errnoText();
        ::unlink(tmp.c_str());
        return err("cannot save project to '" + path + "': " + why);
    }
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
        std::string why = errnoText();
        ::unlink(tmp.c_str());
        return err("cannot save project to '" + path + "': " + why);
    }
    return Status::success();
}

// ---- comparison
// ----------------------------------------------------------------------------------

std::string projectDifference(const Project& a, const Project& b) {
#define TD_DIFF(path, field) \
    if (!(a.field == b.field)) return path
    TD_DIFF("name", name);
    TD_DIFF("description", description);
    TD_DIFF("initial_weights", initialWeights);
    TD_DIFF("model.config.name", model.name);
    if (a.model.layers.size() != b.model.layers.size()) return "model.config.layers";
    for (size_t i = 0; i < a.model.layers.size(); ++i)
        if (!(a.model.layers[i] == b.model.layers[i]))
            return "model.config.layers[" + std::to_string(i) + "]";
    TD_DIFF("data.source.type", data.source.type);
    TD_DIFF("data.source.train_images", data.source.trainImages);
    TD_DIFF("data.source.train_labels", data.source.trainLabels);
    TD_DIFF("data.source.test_images", data.source.testImages);
    TD_DIFF("data.source.test_labels", data.source.testLabels);
    TD_DIFF("data.source.train", data.source.trainPath);
    TD_DIFF("data.source.test", data.source.testPath);
    TD_DIFF("data.source.label_column", data.source.labelColumn);
    TD_DIFF("data.source.non_finite", data.source.nonFinite);
    TD_DIFF("data.source.samples", data.source.samples);
    TD_DIFF("data.source.test_samples", data.source.testSamples);
    TD_DIFF("data.source.shape", data.source.sampleShape);
    TD_DIFF("data.source.classes", data.source.classes);
    TD_DIFF("data.source.seed", data.source.seed);
    TD_DIFF("data.source (image_directory)", data.source.images);
    TD_DIFF("data.source (tfrecord)", data.source.records);
    if (a.data.pipeline.map.size() != b.data.pipeline.map.size()) return "data.pipeline.map";
    for (size_t i = 0; i < a.data.pipeline.map.size(); ++i) {
        const MapStep& x = a.data.pipeline.map[i];
        const MapStep& y = b.data.pipeline.map[i];
        if (x.op != y.op || x.factor != y.factor || x.mean != y.mean || x.stddev != y.stddev ||
            x.depth != y.depth)
            return "data.pipeline.map[" + std::to_string(i) + "]";
    }
    TD_DIFF("data.pipeline.cache", data.pipeline.cache);
    TD_DIFF("data.pipeline.shuffle_buffer", data.pipeline.shuffleBuffer);
    TD_DIFF("data.pipeline.shuffle_seed", data.pipeline.shuffleSeed);
    TD_DIFF("data.pipeline.reshuffle_each_iteration", data.pipeline.reshuffleEachIteration);
    TD_DIFF("data.pipeline.drop_remainder", data.pipeline.dropRemainder);
    TD_DIFF("data.pipeline.prefetch", data.pipeline.prefetch);
    TD_DIFF("data.pipeline.parallel_calls", data.pipeline.parallelCalls);
    TD_DIFF("data.validation_split", data.validationSplit);
    TD_DIFF("data.validation_data", data.validationData);
    TD_DIFF("training.epochs", training.epochs);
    TD_DIFF("training.initial_epoch", training.initialEpoch);
    TD_DIFF("training.batch_size", training.batchSize);
    TD_DIFF("training.seed", training.seed);
    TD_DIFF("training.optimizer.class_name", training.optimizer.name);
    TD_DIFF("training.optimizer.config.learning_rate", training.optimizer.learningRate);
    const ScheduleConfig& sa = a.training.optimizer.schedule;
    const ScheduleConfig& sb = b.training.optimizer.schedule;
    if (sa.type != sb.type || sa.decaySteps != sb.decaySteps || sa.decayRate != sb.decayRate ||
        sa.staircase != sb.staircase || sa.alpha != sb.alpha || sa.warmupSteps != sb.warmupSteps ||
        sa.warmupTarget != sb.warmupTarget)
        return "training.optimizer.config.learning_rate.config";
    TD_DIFF("training.optimizer.config.beta_1", training.optimizer.beta1);
    TD_DIFF("training.optimizer.config.beta_2", training.optimizer.beta2);
    TD_DIFF("training.optimizer.config.epsilon", training.optimizer.epsilon);
    TD_DIFF("training.optimizer.config.amsgrad", training.optimizer.amsgrad);
    TD_DIFF("training.optimizer.config.weight_decay", training.optimizer.weightDecay);
    TD_DIFF("training.optimizer.config.momentum", training.optimizer.momentum);
    TD_DIFF("training.optimizer.config.nesterov", training.optimizer.nesterov);
    TD_DIFF("training.optimizer.config.rho", training.optimizer.rho);
    TD_DIFF("training.optimizer.config.centered", training.optimizer.centered);
    TD_DIFF("training.optimizer.config.clipnorm", training.optimizer.clipnorm);
    TD_DIFF("training.optimizer.config.global_clipnorm", training.optimizer.globalClipnorm);
    TD_DIFF("training.optimizer.config.clipvalue", training.optimizer.clipvalue);
    TD_DIFF("training.loss.class_name", training.loss.name);
    TD_DIFF("training.loss.config.from_logits", training.loss.fromLogits);
    TD_DIFF("training.metrics", training.metrics);
    if (a.training.callbacks.size() != b.training.callbacks.size()) return "training.callbacks";
    for (size_t i = 0; i < a.training.callbacks.size(); ++i) {
        const CallbackConfig& x = a.training.callbacks[i];
        const CallbackConfig& y = b.training.callbacks[i];
        if (x.type != y.type || x.monitor != y.monitor || x.mode != y.mode ||
            x.minDelta != y.minDelta || x.patience != y.patience ||
            x.restoreBestWeights != y.restoreBestWeights || x.startFromEpoch != y.startFromEpoch ||
            x.factor != y.factor || x.cooldown != y.cooldown || x.minLr != y.minLr ||
            x.directory != y.directory || x.saveFreqSteps != y.saveFreqSteps ||
            x.saveBestOnly != y.saveBestOnly || x.keepLast != y.keepLast ||
            x.deleteCheckpoint != y.deleteCheckpoint)
            return "training.callbacks[" + std::to_string(i) + "]";
    }
    TD_DIFF("training.log_every_steps", training.logEverySteps);
    TD_DIFF("training.evaluate_test", training.evaluateTest);
    TD_DIFF("training.run_checkpoints", training.runCheckpoints);
    TD_DIFF("precision", precision);
    TD_DIFF("loss_scale.initial_scale", lossScaleInitial);
    TD_DIFF("loss_scale.dynamic_growth_steps", lossScaleGrowthSteps);
    TD_DIFF("fusion", fusion);
    TD_DIFF("disabled_passes", disabledPasses);
    TD_DIFF("strategy.type", strategy.type);
    TD_DIFF("strategy.devices", strategy.devices);
    TD_DIFF("strategy.replicas", strategy.replicas);
    TD_DIFF("strategy.timeout_seconds", strategy.timeoutSeconds);
    TD_DIFF("strategy.shard_policy", strategy.shardPolicy);
#undef TD_DIFF
    return {};
}

Status checkProjectResources(const Project& p, const ModelInfo& info) {
    MemoryPlan plan;
    const TrainConfig& t = p.training;
    const OptimizerConfig& o = t.optimizer;
    // Slots per parameter, as Optimizer::build allocates them.
    int slots = 0;
    if (o.name == "sgd")
        slots = o.momentum > 0 ? 1 : 0;
    else if (o.name == "adam" || o.name == "adamw")
        slots = o.amsgrad ? 3 : 2;
    else if (o.name == "rmsprop")
        slots = 1 + (o.momentum > 0 ? 1 : 0) + (o.centered ? 1 : 0);

    // info.layers leaves out a leading InputLayer; field paths count it.
    const size_t offset = p.model.layers.size() - info.layers.size();
    const auto layerName = [&](size_t i) {
        return "layer " + std::to_string(i + offset) + " '" + info.layers[i].name + "'";
    };
    size_t mostParams = 0, widest = 0;
    for (size_t i = 0; i < info.layers.size(); ++i) {
        if (info.layers[i].params > info.layers[mostParams].params) mostParams = i;
        if (numElements(info.layers[i].outputShape) > numElements(info.layers[widest].outputShape))
            widest = i;
    }
    if (!info.layers.empty() && info.totalParams > 0)
        plan.add("model.config.layers[" + std::to_string(mostParams + offset) + "]",
                 std::to_string(info.totalParams) + " parameters with their gradients and " +
                     std::to_string(slots) + " " + o.name + " slot" + (slots == 1 ? "" : "s") +
                     " each (largest: " + layerName(mostParams) + ", " +
                     std::to_string(info.layers[mostParams].params) + " parameters)",
                 double(info.totalParams) * 4 * (2 + slots));

    // A training step keeps the activations and their gradients; the evaluation program, built
    // for the same batch size, its own activations. Input and label buffers come with each.
    const auto batch = double(t.batchSize);
    const double inputBytes = double(numElements(info.inputShape)) * 4;
    const double outputBytes = double(numElements(info.outputShape)) * 4;
    // Blame the batch size when it is out of the ordinary, else the layer whose output is widest
    // (a Dense of 1e9 units at batch 32).
    constexpr int64_t kLargeBatch = 65536;
    const std::string activationField =
        t.batchSize > kLargeBatch ? "training.batch_size"
                                  : "model.config.layers[" + std::to_string(widest + offset) + "]";
    if (!info.layers.empty())
        plan.add(
            activationField,
            "activations and their gradients for batches of " + std::to_string(t.batchSize) +
                " samples, " + formatBytes(double(info.activationBytesPerSample)) +
                " per sample (largest: " + layerName(widest) + ", " +
                std::to_string(numElements(info.layers[widest].outputShape)) + " values)",
            batch * (3 * double(info.activationBytesPerSample) + 2 * (inputBytes + outputBytes)));

    planSource(p.data.source, "data.source", plan);

    PipelineShape shape;
    shape.batchSize = t.batchSize;
    // File sources: the sample count is known once read (Pipeline::create checks it then).
    shape.samples = p.data.source.type == "synthetic" ? p.data.source.samples : 0;
    shape.sampleValues = numElements(info.inputShape);
    shape.labelValues =
        t.loss.name == "sparse_categorical_crossentropy" ? 1 : numElements(info.outputShape);
    shape.pipelines = 2;  // training, and the validation that runs while it is alive
    shape.prefix = "data.pipeline";
    shape.batchField = "training.batch_size";
    TD_RETURN_IF_ERROR(planPipeline(p.data.pipeline, shape, plan));
    return plan.check();
}

}  // namespace td
