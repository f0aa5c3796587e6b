// The image_directory source (engine/data/image_folder.h): Keras' file order, labels and split
// (against numpy's shuffle and, where the benchmark environment has Keras, against Keras' own file
// lists and images), decoding of each format, TensorFlow's resize, and the errors for bad input.
// Fixtures are written here with the format libraries' encoders (BMP by hand, GIF as bytes).
// clang-format off
#include <cstdio>
#include <jpeglib.h>
// clang-format on
#include <png.h>

#include <QDir>
#include <QFile>
#include <QProcess>
#include <QStandardPaths>
#include <QTemporaryDir>
#include <QtTest>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/data/image_folder.h"
#include "engine/data/pipeline.h"
#include "tests/scoped_env.h"
#include "tests/source_dir.h"

namespace fs = std::filesystem;
using namespace td;

namespace {

// w x h x channels 8-bit pixels with a pattern that varies by position and `seed`.
std::vector<uint8_t> pattern(int w, int h, int channels, int seed) {
    std::vector<uint8_t> p(static_cast<size_t>(w * h * channels));
    for (size_t i = 0; i < p.size(); ++i)
        p[i] = static_cast<uint8_t>((i * 37 + static_cast<size_t>(seed) * 91 + i / 7 * 13) % 256);
    return p;
}

void writePng(const std::string& path, int w, int h, int channels, const std::vector<uint8_t>& px) {
    png_image image{};
    image.version = PNG_IMAGE_VERSION;
    image.width = static_cast<png_uint_32>(w);
    image.height = static_cast<png_uint_32>(h);
    image.format = channels == 1   ? PNG_FORMAT_GRAY
                   : channels == 3 ? PNG_FORMAT_RGB
                                   : PNG_FORMAT_RGBA;
    QVERIFY(png_image_write_to_file(&image, path.c_str(), 0, px.data(), 0, nullptr));
}

void writeJpeg(const std::string& path, int w, int h, const std::vector<uint8_t>& rgb) {
    jpeg_compress_struct c{};
    jpeg_error_mgr e{};
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    FILE* f = std::fopen(path.c_str(), "wb");
    QVERIFY(f);
    jpeg_stdio_dest(&c, f);
    c.image_width = static_cast<JDIMENSION>(w);
    c.image_height = static_cast<JDIMENSION>(h);
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 95, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        auto* row = const_cast<JSAMPROW>(rgb.data() + c.next_scanline * w * 3);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    std::fclose(f);
}

// A 24-bit BMP: the header, then rows bottom-up in BGR, each padded to 4 bytes.
void writeBmp(const std::string& path, int w, int h, const std::vector<uint8_t>& rgb) {
    const int stride = (w * 3 + 3) / 4 * 4;
    const uint32_t size = 54 + static_cast<uint32_t>(stride * h);
    std::vector<uint8_t> b(size, 0);
    auto put32 = [&](size_t at, uint32_t v) {
        for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
    };
    b[0] = 'B';
    b[1] = 'M';
    put32(2, size);
    put32(10, 54);
    put32(14, 40);
    put32(18, static_cast<uint32_t>(w));
    put32(22, static_cast<uint32_t>(h));
    b[26] = 1;
    b[28] = 24;
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            for (int c = 0; c < 3; ++c)
                b[54 + static_cast<size_t>((h - 1 - y) * stride + x * 3 + c)] =
                    rgb[static_cast<size_t>((y * w + x) * 3 + (2 - c))];
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), size);
}

void writeText(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
}

std::string readBytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), {});
}

std::string joined(const std::vector<std::string>& lines) {
    std::string s;
    for (const std::string& l : lines) s += l + "\n";
    return s;
}

bool noteWith(const std::vector<std::string>& notes, const std::string& part) {
    for (const std::string& n : notes)
        if (n.find(part) != std::string::npos) return true;
    return false;
}

// Every batch of `epochs` epochs of two pipelines is the same, bit for bit (x and y); `what` names
// the comparison in failures. Returns the batches' labels, epoch after epoch.
std::vector<int32_t> sameBatches(Pipeline& a, Pipeline& b, int epochs, const std::string& what) {
    std::vector<int32_t> labels;
    for (int epoch = 0; epoch < epochs; ++epoch) {
        if (!a.beginEpoch(epoch).ok() || !b.beginEpoch(epoch).ok()) {
            QTest::qFail(("beginEpoch: " + what).c_str(), __FILE__, __LINE__);
            return {};
        }
        for (int64_t k = 0;; ++k) {
            auto ba = a.next();
            auto bb = b.next();
            const std::string at =
                what + " epoch " + std::to_string(epoch) + " batch " + std::to_string(k);
            if (!ba.ok() || !bb.ok()) {
                QTest::qFail((at + ": " + (ba.ok() ? bb.error() : ba.error())).c_str(), __FILE__,
                             __LINE__);
                return {};
            }
            if ((*ba == nullptr) != (*bb == nullptr)) {
                QTest::qFail((at + ": one pipeline ended before the other").c_str(), __FILE__,
                             __LINE__);
                return {};
            }
            if (!*ba) break;
            if ((*ba)->x.shape() != (*bb)->x.shape() ||
                std::memcmp((*ba)->x.raw(), (*bb)->x.raw(), (*ba)->x.bytes()) != 0 ||
                std::memcmp((*ba)->y.raw(), (*bb)->y.raw(), (*ba)->y.bytes()) != 0) {
                QTest::qFail((at + ": the batches differ").c_str(), __FILE__, __LINE__);
                return {};
            }
            if ((*ba)->y.dtype() == DType::I32)
                labels.insert(labels.end(), (*ba)->y.data<int32_t>(),
                              (*ba)->y.data<int32_t>() + (*ba)->size);
        }
    }
    return labels;
}

// Noise pixels (PNG cannot compress them much): `seed` picks the noise.
std::vector<uint8_t> noise(int w, int h, int channels, uint32_t seed) {
    std::vector<uint8_t> p(static_cast<size_t>(w * h * channels));
    uint32_t v = seed * 2654435761u + 1;
    for (uint8_t& b : p) {
        v = v * 1664525u + 1013904223u;
        b = static_cast<uint8_t>(v >> 24);
    }
    return p;
}

// The Python with Keras that installer/bench.sh sets up, or $TRAINDECK_KERAS_PYTHON.
QString kerasPython() {
    const QByteArray env = qgetenv("TRAINDECK_KERAS_PYTHON");
    if (!env.isEmpty()) return QString::fromLocal8Bit(env);
    const QString venv = QDir::homePath() + "/.cache/traindeck/bench-venv/bin/python";
    return QFile::exists(venv) ? venv : QString();
}

struct PyRun {
    int code = -1;
    QString out, err;
};
PyRun runPython(const QString& python, const QString& script) {
    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("TF_CPP_MIN_LOG_LEVEL", "3");
    p.setProcessEnvironment(env);
    p.start(python, {"-c", script});
    p.waitForFinished(240000);
    return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1,
            QString::fromUtf8(p.readAllStandardOutput()),
            QString::fromUtf8(p.readAllStandardError())};
}

// A class folder tree as Keras meets them in practice: classes out of order, a nested folder, an
// upper-case extension, a hidden file and folder, a file that is not an image by its name.
void makeTree(const fs::path& root) {
    int seed = 0;
    for (const char* cls : {"zebra", "ant", "moth"}) {
        fs::create_directories(root / cls);
        for (int i = 0; i < 5; ++i)
            writePng((root / cls / ("img" + std::to_string(9 - i) + ".png")).string(), 12, 10, 1,
                     pattern(12, 10, 1, ++seed));
    }
    fs::create_directories(root / "ant" / "more");
    writePng((root / "ant" / "more" / "b.PNG").string(), 7, 15, 1, pattern(7, 15, 1, ++seed));
    writePng((root / "ant" / ".hidden.png").string(), 9, 9, 1, pattern(9, 9, 1, ++seed));
    writePng((root / "moth" / "img3.png").string(), 30, 20, 1, pattern(30, 20, 1, ++seed));
    writeText((root / "moth" / "notes.txt").string(), "not an image");
    fs::create_directories(root / ".cache");
    writePng((root / ".cache" / "x.png").string(), 4, 4, 1, pattern(4, 4, 1, ++seed));
}

}  // namespace

class TestImageFolder : public QObject {
    Q_OBJECT

  private slots:
    // numpy.random.RandomState(seed).shuffle, the permutation Keras applies to the file list.
    void shuffleMatchesNumpy() {
        // Debian's python3, where python3-numpy installs (not a python3 earlier on PATH).
        const QString python = QFile::exists("/usr/bin/python3")
                                   ? QString("/usr/bin/python3")
                                   : QStandardPaths::findExecutable("python3");
        if (python.isEmpty()) QSKIP("no python3 to compare with");
        const PyRun check = runPython(python, "import numpy");
        if (check.code != 0) QSKIP("python3 has no numpy (installer/deps.sh --test installs it)");
        const std::vector<std::pair<int64_t, uint32_t>> cases{
            {1, 7}, {2, 0}, {10, 1337}, {71, 123}, {1000, 4294967295u}, {70000, 42}};
        QString script = "import numpy as np, json\nout = []\n";
        for (auto [n, seed] : cases)
            script += QString(
                          "x = list(range(%1)); np.random.RandomState(%2).shuffle(x); "
                          "out.append(x)\n")
                          .arg(n)
                          .arg(seed);
        script += "print(json.dumps(out))\n";
        const PyRun r = runPython(python, script);
        QVERIFY2(r.code == 0, qPrintable(r.err));
        const nlohmann::json want = nlohmann::json::parse(r.out.toStdString());
        for (size_t k = 0; k < cases.size(); ++k) {
            const std::vector<int64_t> got = numpyLegacyShuffle(cases[k].first, cases[k].second);
            QVERIFY2(want[k].get<std::vector<int64_t>>() == got,
                     qPrintable(QString("n %1 seed %2").arg(cases[k].first).arg(cases[k].second)));
        }
    }

    // Keras' order without shuffling: classes by sorted folder name (hidden folders out), each
    // class's files by sorted folder path, then name, every image extension in any case.
    void listsAsKerasDoes() {
        QTemporaryDir dir;
        const fs::path root = dir.path().toStdString();
        makeTree(root);
        ImageDirectoryConfig cfg;
        cfg.shuffle = false;
        auto list = listImageFiles(cfg, root.string(), "directory");
        QVERIFY2(list.ok(), list.ok() ? "" : list.error().c_str());
        QCOMPARE(list->classNames, (std::vector<std::string>{"ant", "moth", "zebra"}));
        std::vector<std::string> names;
        for (const std::string& f : list->files) names.push_back(fs::relative(f, root).string());
        const std::vector<std::string> want{"ant/.hidden.png", "ant/img5.png",   "ant/img6.png",
                                            "ant/img7.png",    "ant/img8.png",   "ant/img9.png",
                                            "ant/more/b.PNG",  "moth/img3.png",  "moth/img5.png",
                                            "moth/img6.png",   "moth/img7.png",  "moth/img8.png",
                                            "moth/img9.png",   "zebra/img5.png", "zebra/img6.png",
                                            "zebra/img7.png",  "zebra/img8.png", "zebra/img9.png"};
        QCOMPARE(names, want);
        QCOMPARE(list->labels,
                 (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2}));
        // class_names picks and orders the classes.
        cfg.classNames = {"zebra", "ant"};
        list = listImageFiles(cfg, root.string(), "directory");
        QVERIFY(list.ok());
        QCOMPARE(list->classNames, cfg.classNames);
        QCOMPARE(list->files.size(), size_t(12));
        QCOMPARE(list->labels.front(), 0);
        QVERIFY(list->files.front().find("/zebra/") != std::string::npos);
    }

    // Against Keras itself: the training and validation files of image_dataset_from_directory
    // with a seed, and the images it yields (grayscale and RGB, resized bilinear and nearest,
    // cropped and padded to the aspect ratio), from the same folder.
    void matchesKeras() {
        const QString python = kerasPython();
        if (python.isEmpty())
            QSKIP(
                "no Python with Keras (installer/bench.sh sets one up, or set "
                "TRAINDECK_KERAS_PYTHON)");
        if (runPython(python, "import keras, tensorflow").code != 0)
            QSKIP("the Python found has no Keras with TensorFlow");
        QTemporaryDir dir;
        const fs::path root = fs::path(dir.path().toStdString()) / "data";
        makeTree(root);
        fs::create_directories(root / "zebra" / "rgb");
        writePng((root / "zebra" / "rgb" / "c.png").string(), 16, 9, 3, pattern(16, 9, 3, 99));
        struct Case {
            const char* color;
            int h, w;
            const char* interpolation;
            bool crop, pad;
            uint32_t seed;
            double split;
        };
        const std::vector<Case> cases{{"grayscale", 10, 12, "bilinear", false, false, 1337, 0.25},
                                      {"rgb", 20, 16, "bilinear", false, false, 7, 0.3},
                                      {"grayscale", 6, 9, "nearest", false, false, 3, 0.2},
                                      {"grayscale", 8, 8, "bilinear", true, false, 5, 0.5},
                                      {"rgb", 9, 14, "bilinear", false, true, 11, 0.1}};
        QString script = "import os, json, numpy as np, keras\nout = []\n";
        for (size_t k = 0; k < cases.size(); ++k) {
            const Case& c = cases[k];
            // The image options both reads share.
            const QString images = QString(
                                       "color_mode='%1', image_size=(%2, %3), "
                                       "interpolation='%4', crop_to_aspect_ratio=%5, "
                                       "pad_to_aspect_ratio=%6, batch_size=None, verbose=False")
                                       .arg(c.color)
                                       .arg(c.h)
                                       .arg(c.w)
                                       .arg(c.interpolation)
                                       .arg(c.crop ? "True" : "False")
                                       .arg(c.pad ? "True" : "False");
            const QString folder = QString::fromStdString(root.string());
            script += QString(
                          "tr, va = keras.utils.image_dataset_from_directory('%1', "
                          "validation_split=%2, subset='both', seed=%3, %4)\n")
                          .arg(folder)
                          .arg(c.split)
                          .arg(c.seed)
                          .arg(images);
            // Iterating a shuffled dataset reshuffles it: the images and labels by file, read
            // again unshuffled with the same options.
            script += QString(
                          "al = keras.utils.image_dataset_from_directory('%1', shuffle=False, "
                          "%2)\n")
                          .arg(folder, images);
            script += "by = {p: (x.numpy(), int(y)) for p, (x, y) in zip(al.file_paths, al)}\n";
            script += QString(
                          "order = tr.file_paths + va.file_paths; "
                          "np.save('%1/case%2.npy', np.stack([by[p][0] for p in order])"
                          ".astype(np.float32))\n")
                          .arg(dir.path())
                          .arg(k);
            script +=
                "out.append([tr.file_paths, va.file_paths, [by[p][1] for p in "
                "tr.file_paths], tr.class_names])\n";
        }
        script += "print(json.dumps(out))\n";
        const PyRun r = runPython(python, script);
        QVERIFY2(r.code == 0, qPrintable(r.err.right(3000)));
        const nlohmann::json want =
            nlohmann::json::parse(r.out.trimmed().split('\n').last().toStdString());
        for (size_t k = 0; k < cases.size(); ++k) {
            const Case& c = cases[k];
            ImageDirectoryConfig cfg;
            cfg.directory = root.string();
            cfg.colorMode = c.color;
            cfg.height = c.h;
            cfg.width = c.w;
            cfg.interpolation = c.interpolation;
            cfg.cropToAspectRatio = c.crop;
            cfg.padToAspectRatio = c.pad;
            cfg.seed = c.seed;
            cfg.validationSplit = c.split;
            auto list = listImageFiles(cfg, cfg.directory, "directory");
            QVERIFY(list.ok());
            const auto n = static_cast<int64_t>(list->files.size());
            const auto numVal = static_cast<int64_t>(c.split * static_cast<double>(n));
            const std::vector<std::string> train(list->files.begin(), list->files.end() - numVal),
                val(list->files.end() - numVal, list->files.end());
            const QString what = QString("case %1").arg(k);
            QVERIFY2(want[k][0].get<std::vector<std::string>>() == train, qPrintable(what));
            QVERIFY2(want[k][1].get<std::vector<std::string>>() == val, qPrintable(what));
            QVERIFY2(want[k][3].get<std::vector<std::string>>() == list->classNames,
                     qPrintable(what));
            auto splits = loadImageDirectory(cfg);
            QVERIFY2(splits.ok(), splits.ok() ? "" : splits.error().c_str());
            QVERIFY(splits->validation);
            std::vector<int32_t> labels(splits->train.y.data<int32_t>(),
                                        splits->train.y.data<int32_t>() + splits->train.size());
            QVERIFY2(want[k][2].get<std::vector<int32_t>>() == labels, qPrintable(what));
            auto keras = readNpy(QString("%1/case%2.npy").arg(dir.path()).arg(k).toStdString());
            QVERIFY2(keras.ok(), keras.ok() ? "" : keras.error().c_str());
            const int64_t per = splits->train.x.size() / splits->train.size();
            QCOMPARE(keras->size(), per * n);
            double worst = 0;
            for (int64_t i = 0; i < n; ++i) {
                const Dataset& d = i < n - numVal ? splits->train : *splits->validation;
                const int64_t j = i < n - numVal ? i : i - (n - numVal);
                for (int64_t e = 0; e < per; ++e) {
                    const double diff = std::fabs(double{d.x.data<float>()[j * per + e]} -
                                                  double{keras->data<float>()[i * per + e]});
                    if (diff > worst && diff > 1e-3)
                        qWarning("%s element %lld: %g vs keras %g",
                                 list->files[static_cast<size_t>(i)].c_str(),
                                 static_cast<long long>(e), double{d.x.data<float>()[j * per + e]},
                                 double{keras->data<float>()[i * per + e]});
                    worst = std::max(worst, diff);
                }
            }
            // The same arithmetic in float (the RGB file read as gray with TensorFlow's weights).
            QVERIFY2(worst <= 1e-3, qPrintable(what + QString(": worst difference %1").arg(worst)));
        }
    }

    // Each format decodes to its pixels: PNG (gray, RGB, RGBA) and BMP exactly, JPEG within its
    // loss, GIF's first frame; the format is read from the bytes, not the name.
    void decodesEachFormat() {
        QTemporaryDir dir;
        const std::string d = dir.path().toStdString();
        const std::vector<uint8_t> gray = pattern(5, 4, 1, 1), rgb = pattern(5, 4, 3, 2),
                                   rgba = pattern(5, 4, 4, 3);
        writePng(d + "/g.png", 5, 4, 1, gray);
        writePng(d + "/c.png", 5, 4, 3, rgb);
        writePng(d + "/a.png", 5, 4, 4, rgba);
        writeBmp(d + "/b.bmp", 5, 4, rgb);
        writePng(d + "/named.jpg", 5, 4, 1, gray);  // a PNG under a JPEG name
        auto g = decodeImageFile(d + "/g.png", 1);
        QVERIFY2(g.ok(), g.ok() ? "" : g.error().c_str());
        QCOMPARE(g->height, int64_t(4));
        QCOMPARE(g->width, int64_t(5));
        QVERIFY(g->pixels == gray);
        auto c = decodeImageFile(d + "/c.png", 3);
        QVERIFY(c.ok() && c->pixels == rgb);
        auto a = decodeImageFile(d + "/a.png", 4);
        QVERIFY(a.ok() && a->pixels == rgba);
        auto b = decodeImageFile(d + "/b.bmp", 3);
        QVERIFY2(b.ok(), b.ok() ? "" : b.error().c_str());
        QVERIFY(b->pixels == rgb);
        auto named = decodeImageFile(d + "/named.jpg", 1);
        QVERIFY(named.ok() && named->pixels == gray);
        // JPEG: a smooth image survives quality 95 within a few levels.
        std::vector<uint8_t> smooth(16 * 8 * 3);
        for (int y = 0; y < 8; ++y)
            for (int x = 0; x < 16; ++x)
                for (int k = 0; k < 3; ++k)
                    smooth[static_cast<size_t>((y * 16 + x) * 3 + k)] =
                        static_cast<uint8_t>(40 + 8 * x + 5 * y + 30 * k);
        writeJpeg(d + "/s.jpg", 16, 8, smooth);
        auto j = decodeImageFile(d + "/s.jpg", 3);
        QVERIFY2(j.ok(), j.ok() ? "" : j.error().c_str());
        QCOMPARE(j->width, int64_t(16));
        int worst = 0;
        for (size_t i = 0; i < smooth.size(); ++i)
            worst = std::max(worst, std::abs(int{j->pixels[i]} - int{smooth[i]}));
        QVERIFY2(worst <= 8, qPrintable(QString::number(worst)));
        auto jg = decodeImageFile(d + "/s.jpg", 1);
        QVERIFY(jg.ok() && jg->channels == 1 && jg->pixels.size() == 16 * 8);
        // GIF: a 1x1 image whose one colour is (255, 0, 0).
        const unsigned char gif[] = {'G', 'I',  'F', '8', '9', 'a', 1, 0,    1,    0, 0x80, 0,
                                     0,   0xff, 0,   0,   0,   0,   0, ',',  0,    0, 0,    0,
                                     1,   0,    1,   0,   0,   2,   2, 0x44, 0x01, 0, ';'};
        std::ofstream(d + "/r.gif", std::ios::binary)
            .write(reinterpret_cast<const char*>(gif), sizeof gif);
        auto r = decodeImageFile(d + "/r.gif", 3);
        QVERIFY2(r.ok(), r.ok() ? "" : r.error().c_str());
        QCOMPARE(r->pixels, (std::vector<uint8_t>{255, 0, 0}));
    }

    // tf.image.resize's bilinear with half-pixel centers, worked out by hand: [[0, 1], [2, 3]]
    // to 4x4 samples each axis at -0.25, 0.25, 0.75, 1.25 (clamped), weights 0, .25, .75, 1.
    void resizesAsTensorFlow() {
        const float in[4] = {0, 1, 2, 3};
        float out[16];
        resizeImage(in, 2, 2, 1, out, 4, 4, false);
        const float c[4] = {0, 0.25f, 0.75f, 1};
        for (int y = 0; y < 4; ++y)
            for (int x = 0; x < 4; ++x) QCOMPARE(out[y * 4 + x], c[x] + 2 * c[y]);
        float near[16];
        resizeImage(in, 2, 2, 1, near, 4, 4, true);
        for (int y = 0; y < 4; ++y)
            for (int x = 0; x < 4; ++x) QCOMPARE(near[y * 4 + x], in[(y / 2) * 2 + x / 2]);
        // The same size: the image itself.
        float same[4];
        resizeImage(in, 2, 2, 1, same, 2, 2, false);
        for (int i = 0; i < 4; ++i) QCOMPARE(same[i], in[i]);
    }

    // The source's splits and labels: validation from the shuffled list's tail, a test folder,
    // categorical and binary labels, explicit labels.
    void loadsSplitsAndLabels() {
        QTemporaryDir dir;
        const fs::path root = dir.path().toStdString();
        for (const char* split : {"train", "test"})
            for (const char* cls : {"cat", "dog"}) {
                fs::create_directories(root / split / cls);
                for (int i = 0; i < (std::string(split) == "train" ? 10 : 3); ++i)
                    writePng((root / split / cls / (std::to_string(i) + ".png")).string(), 6, 6, 1,
                             pattern(6, 6, 1, i));
            }
        SourceConfig s;
        s.type = "image_directory";
        s.images.directory = (root / "train").string();
        s.images.testDirectory = (root / "test").string();
        s.images.height = 6;
        s.images.width = 6;
        s.images.colorMode = "grayscale";
        s.images.seed = 42;
        s.images.validationSplit = 0.25;
        auto splits = loadSource(s);
        QVERIFY2(splits.ok(), splits.ok() ? "" : splits.error().c_str());
        QCOMPARE(splits->train.size(), int64_t(15));
        QCOMPARE(splits->validation->size(), int64_t(5));
        QCOMPARE(splits->test->size(), int64_t(6));
        QCOMPARE(splits->train.x.shape(), (Shape{15, 6, 6, 1}));
        QCOMPARE(splits->train.numClasses, int64_t(2));
        QCOMPARE(splits->train.classNames, (std::vector<std::string>{"cat", "dog"}));
        // The test folder in sorted order: three cats, then three dogs.
        QCOMPARE(splits->test->y.data<int32_t>()[0], 0);
        QCOMPARE(splits->test->y.data<int32_t>()[5], 1);
        s.images.labelMode = "categorical";
        splits = loadSource(s);
        QVERIFY(splits.ok());
        QCOMPARE(splits->train.y.shape(), (Shape{15, 2}));
        s.images.labelMode = "binary";
        splits = loadSource(s);
        QVERIFY(splits.ok());
        QCOMPARE(splits->train.y.shape(), (Shape{15, 1}));
        // Explicit labels: one per file of the folder, in sorted path order.
        SourceConfig e = s;
        e.images.testDirectory.clear();
        e.images.validationSplit = 0;
        e.images.labelMode = "int";
        e.images.labelsInferred = false;
        e.images.shuffle = false;
        for (int i = 0; i < 20; ++i) e.images.labels.push_back(i % 3);
        splits = loadSource(e);
        QVERIFY2(splits.ok(), splits.ok() ? "" : splits.error().c_str());
        QCOMPARE(splits->train.numClasses, int64_t(3));
        QCOMPARE(splits->train.y.data<int32_t>()[4], 1);
    }

    // Bad input: each a clear error naming the file or folder and what was expected; with
    // skip_bad_files the files that do not decode are left out and counted.
    void badInputNamesTheFile() {
        QTemporaryDir dir;
        const fs::path root = dir.path().toStdString();
        fs::create_directories(root / "a");
        fs::create_directories(root / "b");
        for (int i = 0; i < 3; ++i)
            writePng((root / "a" / (std::to_string(i) + ".png")).string(), 4, 4, 1,
                     pattern(4, 4, 1, i));
        ImageDirectoryConfig cfg;
        cfg.directory = root.string();
        cfg.height = cfg.width = 4;
        auto expectError = [&](const ImageDirectoryConfig& c, const std::string& part) {
            auto r = loadImageDirectory(c);
            QVERIFY2(!r.ok(), part.c_str());
            QVERIFY2(r.error().find(part) != std::string::npos, r.error().c_str());
        };
        expectError(cfg, "the class folder " + (root / "b").string() + " holds no images");
        writePng((root / "b" / "0.png").string(), 4, 4, 1, pattern(4, 4, 1, 9));
        // A truncated PNG, and a text file under an image's name.
        {
            std::ifstream f((root / "a" / "0.png").string(), std::ios::binary);
            std::string bytes((std::istreambuf_iterator<char>(f)), {});
            writeText((root / "a" / "cut.png").string(), bytes.substr(0, bytes.size() / 2));
        }
        expectError(cfg, (root / "a" / "cut.png").string() + ": not a readable PNG image");
        fs::remove(root / "a" / "cut.png");
        writeText((root / "b" / "fake.jpg").string(), "hello");
        expectError(cfg, (root / "b" / "fake.jpg").string() + ": not an image (expected a JPEG");
        ImageDirectoryConfig skip = cfg;
        skip.skipBadFiles = true;
        auto skipped = loadImageDirectory(skip);
        QVERIFY2(skipped.ok(), skipped.ok() ? "" : skipped.error().c_str());
        QCOMPARE(skipped->train.size(), int64_t(4));
        // The count, the file and why, in the run's log.
        QVERIFY2(
            noteWith(skipped->notes,
                     "data.source.skip_bad_files: left out 1 of 5 training "
                     "images: " +
                         (root / "b" / "fake.jpg").string() + ": not an image (expected a JPEG"),
            joined(skipped->notes).c_str());
        fs::remove(root / "b" / "fake.jpg");
        ImageDirectoryConfig binary = cfg;
        fs::create_directories(root / "c");
        writePng((root / "c" / "0.png").string(), 4, 4, 1, pattern(4, 4, 1, 5));
        binary.labelMode = "binary";
        expectError(binary, "\"binary\" needs exactly 2 classes, the data has 3 (a, b, c)");
        ImageDirectoryConfig split = cfg;
        split.validationSplit = 0.1;
        split.seed = 1;
        expectError(split, "0.100000 of 5 images leaves 5 for training and 0 for validation");
        ImageDirectoryConfig missing = cfg;
        missing.directory = (root / "nope").string();
        expectError(missing, (root / "nope").string() + " does not exist");
        ImageDirectoryConfig names = cfg;
        names.classNames = {"a", "zz"};
        expectError(names, "\"zz\" is not a sub-folder of " + root.string());
        ImageDirectoryConfig labels = cfg;
        labels.labelsInferred = false;
        labels.labels = {0, 1};
        expectError(labels, "2 labels for the 5 images");
        const fs::path empty = root / "empty";
        fs::create_directories(empty / "x");
        ImageDirectoryConfig none = cfg;
        none.directory = empty.string();
        none.labelsInferred = false;
        expectError(none, "no images in " + empty.string());
        fs::remove_all(empty);
        // A BMP cut short (stb_image would read the missing rows as black).
        std::vector<uint8_t> rgb(8 * 8 * 3, 200);
        writeBmp((root / "a" / "whole.bmp").string(), 8, 8, rgb);
        {
            std::ifstream f((root / "a" / "whole.bmp").string(), std::ios::binary);
            std::string bytes((std::istreambuf_iterator<char>(f)), {});
            writeText((root / "a" / "cut.bmp").string(), bytes.substr(0, 100));
        }
        expectError(cfg, (root / "a" / "cut.bmp").string() +
                             ": truncated BMP file: its header says 246 bytes, the file has 100");
        // Streamed, a file that does not decode is met when a batch reads it, and named there;
        // skip_bad_files finds it at load.
        auto streamed = loadImageDirectory(cfg, /*stream=*/true);
        QVERIFY2(streamed.ok(), streamed.ok() ? "" : streamed.error().c_str());
        QVERIFY(streamed->train.streamed());
        auto pipe = Pipeline::create(streamed->train, PipelineConfig{.cache = "none"}, 2, false, 1);
        QVERIFY2(pipe.ok(), pipe.ok() ? "" : pipe.error().c_str());
        QVERIFY((*pipe)->beginEpoch(0).ok());
        std::string failure;
        for (int b = 0; b < 10 && failure.empty(); ++b) {
            auto batch = (*pipe)->next();
            if (!batch.ok())
                failure = batch.error();
            else if (!*batch)
                break;
        }
        QVERIFY2(failure.find((root / "a" / "cut.bmp").string() + ": truncated BMP file") !=
                     std::string::npos,
                 failure.c_str());
        QVERIFY2(failure.find("skip_bad_files") != std::string::npos, failure.c_str());
        ImageDirectoryConfig skipStreamed = cfg;
        skipStreamed.skipBadFiles = true;
        auto kept = loadImageDirectory(skipStreamed, /*stream=*/true);
        QVERIFY2(kept.ok(), kept.ok() ? "" : kept.error().c_str());
        QCOMPARE(kept->train.size(), int64_t(6));  // a: 0-2, whole.bmp; b: 0; c: 0
    }

    // The shipped script's colour variant (tinted RGB JPEG files, as a user makes them for the
    // decode and resize figures), read back: every class keeps its tint through JPEG's loss, in
    // the order Keras lists the classes, resized from 40x40 to 24x24.
    void colourJpegFoldersFromTheScript() {
        const QString python = QFile::exists("/usr/bin/python3")
                                   ? QString("/usr/bin/python3")
                                   : QStandardPaths::findExecutable("python3");
        if (python.isEmpty()) QSKIP("no python3");
        if (runPython(python, "import PIL").code != 0)
            QSKIP("python3 has no Pillow (installer/deps.sh --test installs python3-pil)");
        QTemporaryDir dir;
        QProcess script;
        script.start(python,
                     {QString(td::dev::kSourceDir) + "/projects/make_image_folders.py", "--color",
                      "--size", "40", "--format", "jpeg", "--limit", "3", "--out", dir.path()});
        QVERIFY(script.waitForFinished(120000));
        QVERIFY2(script.exitCode() == 0, script.readAllStandardError().constData());
        SourceConfig s;
        s.type = "image_directory";
        s.images.directory = (dir.path() + "/train").toStdString();
        s.images.height = s.images.width = 24;
        s.images.shuffle = false;
        auto splits = loadSource(s);
        QVERIFY2(splits.ok(), splits.ok() ? "" : splits.error().c_str());
        QCOMPARE(splits->train.size(), int64_t(30));
        QCOMPARE(splits->train.classNames.size(), size_t(10));
        // In Keras' sorted order t_shirt_top is class 8 (the script's tint (1.0, 0.55, 0.55)) and
        // trouser class 9 ((0.55, 1.0, 0.55)): their images lean to red and to green.
        QCOMPARE(splits->train.classNames[8], std::string("t_shirt_top"));
        QCOMPARE(splits->train.classNames[9], std::string("trouser"));
        auto channelSums = [&](int64_t sample) {
            const float* px = splits->train.x.data<float>() + sample * 24 * 24 * 3;
            double sum[3] = {0, 0, 0};
            for (int i = 0; i < 24 * 24; ++i)
                for (int c = 0; c < 3; ++c) sum[c] += px[i * 3 + c];
            return std::vector<double>{sum[0], sum[1], sum[2]};
        };
        for (int64_t i = 0; i < 3; ++i) {
            QCOMPARE(splits->train.y.data<int32_t>()[24 + i], 8);
            QCOMPARE(splits->train.y.data<int32_t>()[27 + i], 9);
            const auto red = channelSums(24 + i);
            QVERIFY2(red[0] > 1.5 * red[1] && red[0] > 1.5 * red[2],
                     qPrintable(QString("%1 %2 %3").arg(red[0]).arg(red[1]).arg(red[2])));
            const auto green = channelSums(27 + i);
            QVERIFY2(green[1] > 1.5 * green[0] && green[1] > 1.5 * green[2],
                     qPrintable(QString("%1 %2 %3").arg(green[0]).arg(green[1]).arg(green[2])));
        }
    }

    // The same folder streamed (each file decoded when a batch reads it, on the map workers) and
    // decoded at load give the same batches: shuffled, with each cache, across epochs, through a
    // validation split of the stream.
    void streamedBatchesEqualDecodedOnes() {
        QTemporaryDir dir;
        const fs::path root = dir.path().toStdString();
        int seed = 0;
        for (const char* cls : {"x", "y", "z"}) {
            fs::create_directories(root / cls);
            for (int i = 0; i < 23; ++i)
                writePng((root / cls / (std::to_string(i) + ".png")).string(), 9, 7, 3,
                         pattern(9, 7, 3, ++seed));
        }
        SourceConfig s;
        s.type = "image_directory";
        s.images.directory = root.string();
        s.images.height = 5;
        s.images.width = 6;
        s.images.seed = 3;
        auto decoded = loadSource(s);
        auto streamed = loadSource(s, /*stream=*/true);
        QVERIFY2(decoded.ok() && streamed.ok(), decoded.ok() ? "" : decoded.error().c_str());
        QVERIFY(!decoded->train.streamed() && streamed->train.streamed());
        QCOMPARE(streamed->train.sampleShape(), (Shape{5, 6, 3}));
        auto materialized = materialize(streamed->train, "folder");
        QVERIFY(materialized.ok());
        QCOMPARE(std::memcmp(materialized->data.x.raw(), decoded->train.x.raw(),
                             decoded->train.x.bytes()),
                 0);
        const std::string cacheFile = (root / "cache.bin").string();
        for (const std::string& cache :
             {std::string("none"), std::string("memory"), "file:" + cacheFile}) {
            for (bool drop : {false, true}) {
                PipelineConfig pc;
                pc.cache = cache;
                pc.shuffleBuffer = 17;
                // With drop_remainder a streamed fill pass reads the rows no batch takes at its
                // end.
                pc.dropRemainder = drop;
                pc.map = {MapStep{.op = "scale", .factor = 1.0 / 255}};
                auto [dTrain, dVal] = splitTail(decoded->train, 0.2);
                auto [sTrain, sVal] = splitTail(streamed->train, 0.2);
                QVERIFY(sVal.streamed());
                for (auto [d, st] : {std::pair{dTrain, sTrain}, std::pair{dVal, sVal}}) {
                    fs::remove(cacheFile);
                    fs::remove(cacheFile + "-streamed");
                    PipelineConfig streamedPc = pc;
                    if (cache != "none" && cache != "memory") streamedPc.cache += "-streamed";
                    auto a = Pipeline::create(d, pc, 8, true, 5);
                    auto b = Pipeline::create(st, streamedPc, 8, true, 5);
                    QVERIFY2(a.ok() && b.ok(), b.ok() ? cache.c_str() : b.error().c_str());
                    for (int epoch = 0; epoch < 3; ++epoch) {
                        QVERIFY((*a)->beginEpoch(epoch).ok() && (*b)->beginEpoch(epoch).ok());
                        for (int64_t k = 0;; ++k) {
                            auto ba = (*a)->next();
                            auto bb = (*b)->next();
                            QVERIFY2(ba.ok() && bb.ok(), bb.ok() ? "" : bb.error().c_str());
                            QCOMPARE(*ba == nullptr, *bb == nullptr);
                            if (!*ba) break;
                            QCOMPARE((*bb)->x.shape(), (*ba)->x.shape());
                            QVERIFY2(
                                std::memcmp((*ba)->x.raw(), (*bb)->x.raw(), (*ba)->x.bytes()) == 0,
                                qPrintable(QString::fromStdString(cache) +
                                           QString(" epoch %1 batch %2").arg(epoch).arg(k)));
                            QVERIFY(std::memcmp((*ba)->y.raw(), (*bb)->y.raw(), (*ba)->y.bytes()) ==
                                    0);
                        }
                        const PipelineStats st2 = (*b)->stats();
                        const int64_t batched = drop ? st.size() / 8 * 8 : st.size();
                        if (cache == "none" || epoch == 0)
                            QCOMPARE(st2.epochSourceElements, batched);
                        else
                            QCOMPARE(st2.epochCacheElements, batched);
                    }
                }
            }
        }
    }

    // skip_bad_files: the same files left out decoded at load and streamed (found by decoding
    // every file once), so the same batches, shuffled, across epochs, through a validation split;
    // the log line counts them and names each with its error. Without the option each is an
    // error naming the file.
    void skippedFilesGiveTheSameBatchesStreamedAndDecoded() {
        QTemporaryDir dir;
        const fs::path root = dir.path().toStdString();
        int seed = 0;
        for (const char* cls : {"p", "q", "r"}) {
            fs::create_directories(root / cls);
            for (int i = 0; i < 14; ++i)
                writePng((root / cls / (std::to_string(i) + ".png")).string(), 7, 6, 3,
                         pattern(7, 6, 3, ++seed));
        }
        // A PNG cut in half, text under a PNG's name, a BMP cut short; and a text file with
        // another extension, which is not an image at all and never read.
        const std::string cut = (root / "p" / "3.png").string();
        const std::string text = (root / "q" / "5.png").string();
        const std::string bmp = (root / "r" / "x.bmp").string();
        writeText(cut, readBytes(cut).substr(0, 40));
        writeText(text, "not a picture");
        writeBmp(bmp, 8, 8, std::vector<uint8_t>(8 * 8 * 3, 90));
        writeText(bmp, readBytes(bmp).substr(0, 100));
        writeText((root / "r" / "notes.txt").string(), "ignored");
        SourceConfig s;
        s.type = "image_directory";
        s.images.directory = root.string();
        s.images.height = 5;
        s.images.width = 4;
        s.images.seed = 11;
        for (bool stream : {false, true}) {
            auto refused = loadSource(s, stream);
            if (!stream) {
                QVERIFY(!refused.ok());
                QVERIFY2(refused.error().find("skip_bad_files") != std::string::npos,
                         refused.error().c_str());
                QVERIFY2(refused.error().find(cut) != std::string::npos ||
                             refused.error().find(text) != std::string::npos ||
                             refused.error().find(bmp) != std::string::npos,
                         refused.error().c_str());
            }
        }
        s.images.skipBadFiles = true;
        auto decoded = loadSource(s);
        auto streamed = loadSource(s, /*stream=*/true);
        QVERIFY2(decoded.ok(), decoded.ok() ? "" : decoded.error().c_str());
        QVERIFY2(streamed.ok(), streamed.ok() ? "" : streamed.error().c_str());
        QVERIFY(streamed->train.streamed() && !decoded->train.streamed());
        QCOMPARE(decoded->train.size(), int64_t(40));
        QCOMPARE(streamed->train.size(), int64_t(40));
        for (const auto* splits : {&*decoded, &*streamed}) {
            const std::string notes = joined(splits->notes);
            QVERIFY2(notes.find("data.source.skip_bad_files: left out 3 of 43 training images: ") !=
                         std::string::npos,
                     notes.c_str());
            QVERIFY2(notes.find(cut + ": not a readable PNG image") != std::string::npos,
                     notes.c_str());
            QVERIFY2(notes.find(text + ": not an image") != std::string::npos, notes.c_str());
            QVERIFY2(notes.find(bmp + ": truncated BMP file") != std::string::npos, notes.c_str());
            QVERIFY2(notes.find("notes.txt") == std::string::npos, notes.c_str());
        }
        QCOMPARE(
            std::memcmp(decoded->train.y.raw(), streamed->train.y.raw(), decoded->train.y.bytes()),
            0);
        PipelineConfig pc;
        pc.shuffleBuffer = 16;
        pc.map = {MapStep{.op = "scale", .factor = 1.0 / 255}};
        PipelineConfig streamedPc = pc;
        streamedPc.cache = "none";
        auto [dTrain, dVal] = splitTail(decoded->train, 0.25);
        auto [sTrain, sVal] = splitTail(streamed->train, 0.25);
        for (auto [d, st] : {std::pair{dTrain, sTrain}, std::pair{dVal, sVal}}) {
            auto a = Pipeline::create(d, pc, 6, true, 3);
            auto b = Pipeline::create(st, streamedPc, 6, true, 3);
            QVERIFY2(a.ok() && b.ok(), b.ok() ? "" : b.error().c_str());
            const std::vector<int32_t> labels = sameBatches(**a, **b, 3, "skipped files");
            QCOMPARE(static_cast<int64_t>(labels.size()), 3 * d.size());
        }
        // No bad file with the option on: a line says so.
        fs::remove(cut);
        fs::remove(text);
        fs::remove(bmp);
        auto clean = loadSource(s, /*stream=*/true);
        QVERIFY2(clean.ok(), clean.ok() ? "" : clean.error().c_str());
        QVERIFY2(noteWith(clean->notes, "left out 0 of 40 training images (every one reads)"),
                 joined(clean->notes).c_str());
    }

    // A cache before the decode ({"op": "cache"}, {"op": "decode"}) keeps the files' bytes and
    // decodes them every epoch: the batches are those of the decoded cache, bit for bit, from a
    // memory cache and a file cache (written, then read by a second pipeline from its first
    // epoch), shuffled, with and without drop_remainder, through a validation split.
    void encodedCacheGivesTheDecodedBatches() {
        QTemporaryDir dir;
        const fs::path root = dir.path().toStdString();
        int seed = 0;
        for (const char* cls : {"a", "b"}) {
            fs::create_directories(root / cls);
            for (int i = 0; i < 19; ++i) {
                const std::string stem = (root / cls / std::to_string(i)).string();
                if (i % 3 == 0)
                    writeJpeg(stem + ".jpg", 11, 9, pattern(11, 9, 3, ++seed));
                else
                    writePng(stem + ".png", 10, 8, 3, pattern(10, 8, 3, ++seed));
            }
        }
        SourceConfig s;
        s.type = "image_directory";
        s.images.directory = root.string();
        s.images.height = 6;
        s.images.width = 7;
        s.images.seed = 5;
        auto decoded = loadSource(s);
        auto streamed = loadSource(s, /*stream=*/true);
        QVERIFY2(decoded.ok() && streamed.ok(), decoded.ok() ? "" : decoded.error().c_str());
        const std::string cacheFile = (root / "encoded.cache").string();
        for (bool drop : {false, true}) {
            PipelineConfig pc;
            pc.shuffleBuffer = 9;
            pc.dropRemainder = drop;
            pc.map = {MapStep{.op = "normalize", .mean = 100, .stddev = 50}};
            PipelineConfig enc = pc;
            enc.map.insert(enc.map.begin(), {MapStep{.op = "cache"}, MapStep{.op = "decode"}});
            QVERIFY(cachesEncoded(enc));
            auto [dTrain, dVal] = splitTail(decoded->train, 0.2);
            auto [sTrain, sVal] = splitTail(streamed->train, 0.2);
            for (auto [d, st] : {std::pair{dTrain, sTrain}, std::pair{dVal, sVal}}) {
                for (const std::string& cache : {std::string("memory"), "file:" + cacheFile}) {
                    fs::remove(cacheFile);
                    enc.cache = cache;
                    const std::string what = cache + (drop ? " drop" : "");
                    auto a = Pipeline::create(d, pc, 4, true, 9);
                    auto b = Pipeline::create(st, enc, 4, true, 9);
                    QVERIFY2(a.ok() && b.ok(), b.ok() ? "" : b.error().c_str());
                    sameBatches(**a, **b, 3, what);
                    const int64_t batched = drop ? st.size() / 4 * 4 : st.size();
                    const PipelineStats stats = (*b)->stats();
                    QVERIFY(stats.cacheComplete);
                    QCOMPARE(stats.epochCacheElements, batched);  // the last epoch, from the cache
                    QVERIFY(stats.readSecondsPerBatch > 0);       // decoded again
                    if (cache == "memory") continue;
                    // The file is trusted by a later pipeline: every epoch from the cache.
                    QVERIFY(fs::exists(cacheFile));
                    auto again = Pipeline::create(st, enc, 4, true, 9);
                    auto a2 = Pipeline::create(d, pc, 4, true, 9);
                    QVERIFY2(again.ok() && a2.ok(), again.ok() ? "" : again.error().c_str());
                    QVERIFY2((*again)->messages().empty(), joined((*again)->messages()).c_str());
                    sameBatches(**a2, **again, 2, what + " reread");
                    QCOMPARE((*again)->stats().epochSourceElements, int64_t(0));
                    QVERIFY((*again)->stats().readingCacheFile);
                    // A decoded-cache file at the same path is not taken for it, nor it for one.
                    PipelineConfig decodedFile = pc;
                    decodedFile.cache = cache;
                    auto other = Pipeline::create(st, decodedFile, 4, true, 9);
                    QVERIFY2(other.ok(), other.ok() ? "" : other.error().c_str());
                    QCOMPARE((*other)->messages().size(), size_t(1));
                }
            }
        }
        // Samples already in memory have no encoded form to cache.
        PipelineConfig enc;
        enc.map = {MapStep{.op = "cache"}, MapStep{.op = "decode"}};
        auto refused = Pipeline::create(decoded->train, enc, 4, true, 9);
        QVERIFY(!refused.ok());
        QVERIFY2(refused.error().find("a cache before 'decode' keeps the encoded files") !=
                     std::string::npos,
                 refused.error().c_str());
        // Only the cache may come before the decode.
        enc.map = {MapStep{.op = "scale", .factor = 2}, MapStep{.op = "decode"}};
        refused = Pipeline::create(streamed->train, enc, 4, true, 9);
        QVERIFY(!refused.ok());
        QVERIFY2(refused.error().find("'decode' must come before every step but 'cache'") !=
                     std::string::npos,
                 refused.error().c_str());
    }

    // The memory budget counts an encoded memory cache by its encoded bytes: accepted where the
    // decoded samples would not fit (both refused with their sizes), refused with its own sizes
    // when the encoded bytes do not fit either.
    void encodedMemoryCacheMeetsTheBudget() {
        QTemporaryDir dir;
        const fs::path root = dir.path().toStdString();
        // 60 PNGs of noise, 64x64 RGB: about 12 KiB each encoded (740 KiB in all), 48 KiB each
        // decoded to float32 (2.8 MiB in all).
        int64_t encodedBytes = 0;
        for (int c = 0; c < 2; ++c) {
            fs::create_directories(root / std::to_string(c));
            for (int i = 0; i < 30; ++i) {
                const std::string path =
                    (root / std::to_string(c) / (std::to_string(i) + ".png")).string();
                writePng(path, 64, 64, 3, noise(64, 64, 3, static_cast<uint32_t>(c * 100 + i)));
                encodedBytes += static_cast<int64_t>(fs::file_size(path));
            }
        }
        QVERIFY2(encodedBytes > 600 * 1024 && encodedBytes < 900 * 1024,
                 qPrintable(QString::number(encodedBytes)));
        SourceConfig s;
        s.type = "image_directory";
        s.images.directory = root.string();
        s.images.height = s.images.width = 64;
        s.images.seed = 2;
        auto streamed = loadSource(s, /*stream=*/true);
        QVERIFY2(streamed.ok(), streamed.ok() ? "" : streamed.error().c_str());
        PipelineConfig enc;
        enc.map = {MapStep{.op = "cache"}, MapStep{.op = "decode"},
                   MapStep{.op = "scale", .factor = 1.0 / 255}};
        enc.prefetch = 0;
        enc.shuffleBuffer = 60;
        PipelineConfig dec = enc;
        dec.map.erase(dec.map.begin(), dec.map.begin() + 2);
        {
            const td::test::ScopedEnv budget("TRAINDECK_MEMORY_BUDGET", "2M");
            // Decoded: refused at load and as a memory cache of the stream, with the sizes.
            auto atLoad = loadSource(s);
            QVERIFY(!atLoad.ok());
            QVERIFY2(atLoad.error().find("60 decoded samples of [64,64,3] f32 values") !=
                             std::string::npos &&
                         atLoad.error().find("over the budget of 2.0 MiB") != std::string::npos,
                     atLoad.error().c_str());
            auto decodedCache = Pipeline::create(streamed->train, dec, 2, true, 1);
            QVERIFY(!decodedCache.ok());
            QVERIFY2(decodedCache.error().find("data.pipeline.cache") != std::string::npos,
                     decodedCache.error().c_str());
            // Encoded: fits, and trains two epochs, the second from the cache.
            auto fits = Pipeline::create(streamed->train, enc, 2, true, 1);
            QVERIFY2(fits.ok(), fits.ok() ? "" : fits.error().c_str());
            for (int epoch = 0; epoch < 2; ++epoch) {
                QVERIFY((*fits)->beginEpoch(epoch).ok());
                int64_t rows = 0;
                while (true) {
                    auto b = (*fits)->next();
                    QVERIFY2(b.ok(), b.ok() ? "" : b.error().c_str());
                    if (!*b) break;
                    rows += (*b)->size;
                }
                QCOMPARE(rows, int64_t(60));
            }
            QCOMPARE((*fits)->stats().epochCacheElements, int64_t(60));
        }
        {
            const td::test::ScopedEnv budget("TRAINDECK_MEMORY_BUDGET", "512K");
            auto over = Pipeline::create(streamed->train, enc, 2, true, 1);
            QVERIFY(!over.ok());
            QVERIFY2(
                over.error().find("data.pipeline.cache: needs about") != std::string::npos &&
                    over.error().find("over the budget of 512.0 KiB") != std::string::npos &&
                    over.error().find("a memory cache of 60 encoded samples") != std::string::npos,
                over.error().c_str());
        }
    }
};

QTEST_GUILESS_MAIN(TestImageFolder)
#include "test_image_folder.moc"
