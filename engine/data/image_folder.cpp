// The image_directory source (image_folder.h): Keras' listing, order and split, decoding with the
// format libraries, TensorFlow's resize, and the parallel load into one f32 array.
#include "engine/data/image_folder.h"

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <jpeglib.h>
// clang-format on
#include <png.h>
#include <stb/stb_image.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "engine/data/resource_plan.h"

namespace td {
namespace fs = std::filesystem;

namespace {

bool hasImageExtension(const std::string& name) {
    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (const char* ext : {".bmp", ".gif", ".jpeg", ".jpg", ".png"})
        if (lower.size() >= std::strlen(ext) &&
            lower.compare(lower.size() - std::strlen(ext), std::string::npos, ext) == 0)
            return true;
    return false;
}

// The image files under `dir`, as Keras' iter_valid_files yields them: every folder the walk
// reaches (symbolic links to folders followed only with follow_links), sorted by its path, and
// in each its files sorted by name.
Result<std::vector<std::string>> walkImages(const fs::path& dir, bool followLinks) {
    std::map<std::string, std::vector<std::string>> byFolder;  // sorted by the folder's path
    std::vector<fs::path> pending{dir};
    std::set<fs::path> seen;  // a link cycle is walked once
    while (!pending.empty()) {
        const fs::path folder = pending.back();
        pending.pop_back();
        std::error_code ec;
        const fs::path canonical = fs::canonical(folder, ec);
        if (!ec && !seen.insert(canonical).second) continue;
        auto& files = byFolder[folder.string()];
        fs::directory_iterator it(folder, ec);
        if (ec) return err(folder.string() + ": cannot list the folder: " + ec.message());
        for (const fs::directory_entry& e : it) {
            std::error_code ec2;
            const bool link = e.is_symlink(ec2);
            if (e.is_directory(ec2)) {
                if (!link || followLinks) pending.push_back(e.path());
            } else if (hasImageExtension(e.path().filename().string())) {
                files.push_back(e.path().filename().string());
            }
        }
    }
    std::vector<std::string> out;
    for (auto& [folder, files] : byFolder) {
        std::sort(files.begin(), files.end());
        for (const std::string& f : files) out.push_back((fs::path(folder) / f).string());
    }
    return out;
}

std::string joinNames(const std::vector<std::string>& names) {
    std::string s;
    for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
    return s;
}

Result<std::vector<uint8_t>> readWholeFile(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return err(path + ": cannot open: " + std::strerror(errno));
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)),
                               std::istreambuf_iterator<char>());
    if (f.bad()) return err(path + ": cannot read: " + std::strerror(errno));
    return bytes;
}

// libjpeg reports errors through error_exit, which must not return: back to decodeJpeg.
struct JpegError {
    jpeg_error_mgr mgr;
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

void jpegErrorExit(j_common_ptr c) {
    auto* e = reinterpret_cast<JpegError*>(c->err);
    (*c->err->format_message)(c, e->message);
    std::longjmp(e->jump, 1);
}

void jpegNoWarning(j_common_ptr, int) {}

Result<DecodedImage> decodeJpeg(const std::string& path, const std::vector<uint8_t>& bytes,
                                int channels) {
    jpeg_decompress_struct info{};
    JpegError error{};
    info.err = jpeg_std_error(&error.mgr);
    error.mgr.error_exit = &jpegErrorExit;
    error.mgr.emit_message = &jpegNoWarning;
    DecodedImage img;
    // Only trivially destructible locals live across the setjmp; the pixels are allocated after.
    if (setjmp(error.jump)) {
        jpeg_destroy_decompress(&info);
        return err(path + ": not a readable JPEG image: " + error.message);
    }
    jpeg_create_decompress(&info);
    jpeg_mem_src(&info, bytes.data(), static_cast<unsigned long>(bytes.size()));
    jpeg_read_header(&info, TRUE);
    info.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&info);
    const int64_t h = info.output_height, w = info.output_width, got = info.output_components;
    img.height = h;
    img.width = w;
    img.channels = channels;
    img.pixels.resize(static_cast<size_t>(h * w * channels));
    std::vector<uint8_t> row(static_cast<size_t>(w * got));
    while (info.output_scanline < info.output_height) {
        const int64_t y = info.output_scanline;
        JSAMPROW r = row.data();
        jpeg_read_scanlines(&info, &r, 1);
        uint8_t* out = img.pixels.data() + y * w * channels;
        for (int64_t x = 0; x < w; ++x)
            for (int c = 0; c < channels; ++c)
                out[x * channels + c] = c < got ? row[static_cast<size_t>(x * got + c)] : 255;
    }
    jpeg_finish_decompress(&info);
    jpeg_destroy_decompress(&info);
    return img;
}

// libpng's own read, with the conversions TensorFlow's decode_png asks of it (so gray from a
// colour image has its weights: 0.299 R + 0.587 G + 0.114 B on the stored values): palettes and
// low bit depths expanded, 16 bits stripped to 8, transparency to alpha, then alpha stripped or
// added and gray made colour or colour gray as `channels` asks.
struct PngReader {
    const std::vector<uint8_t>* bytes;
    size_t at = 0;
    std::jmp_buf jump;
    char message[256] = {};
};

void pngRead(png_structp png, png_bytep out, png_size_t n) {
    auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
    if (r->bytes->size() - r->at < n) png_error(png, "the file ends early");
    std::memcpy(out, r->bytes->data() + r->at, n);
    r->at += n;
}

void pngError(png_structp png, png_const_charp msg) {
    auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
    std::snprintf(r->message, sizeof r->message, "%s", msg);
    std::longjmp(r->jump, 1);
}

void pngWarning(png_structp, png_const_charp) {}

Result<DecodedImage> decodePng(const std::string& path, const std::vector<uint8_t>& bytes,
                               int channels) {
    PngReader reader;
    reader.bytes = &bytes;
    png_structp png =
        png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, &pngError, &pngWarning);
    if (!png) return err(path + ": cannot start libpng");
    png_infop info = png_create_info_struct(png);
    DecodedImage img;
    std::vector<png_bytep> rows;
    if (!info || setjmp(reader.jump)) {
        png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
        return err(path + ": not a readable PNG image: " + reader.message);
    }
    png_set_read_fn(png, &reader, &pngRead);
    png_read_info(png, info);
    const int type = png_get_color_type(png, info);
    const int depth = png_get_bit_depth(png, info);
    const bool color = (type & PNG_COLOR_MASK_COLOR) != 0;
    bool alpha = (type & PNG_COLOR_MASK_ALPHA) != 0;
    if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (png_get_valid(png, info, PNG_INFO_tRNS)) {
        png_set_tRNS_to_alpha(png);
        alpha = true;
    }
    if (depth == 16) png_set_strip_16(png);
    if (alpha && (channels == 1 || channels == 3)) png_set_strip_alpha(png);
    if (color && channels < 3) png_set_rgb_to_gray_fixed(png, 1, 29900, 58700);  // 0.299, 0.587
    if (!color && channels >= 3) png_set_gray_to_rgb(png);
    if (!alpha && channels == 4) png_set_add_alpha(png, 0xff, PNG_FILLER_AFTER);
    png_read_update_info(png, info);
    img.width = png_get_image_width(png, info);
    img.height = png_get_image_height(png, info);
    img.channels = channels;
    if (png_get_rowbytes(png, info) != static_cast<size_t>(img.width * channels))
        png_error(png, "unexpected row size after conversion");
    img.pixels.resize(static_cast<size_t>(img.height * img.width * channels));
    rows.resize(static_cast<size_t>(img.height));
    for (int64_t y = 0; y < img.height; ++y)
        rows[static_cast<size_t>(y)] = img.pixels.data() + y * img.width * channels;
    png_read_image(png, rows.data());
    png_read_end(png, nullptr);
    png_destroy_read_struct(&png, &info, nullptr);
    return img;
}

uint32_t le32(const uint8_t* p) {
    return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// stb_image reads past the end of an uncompressed BMP as zeros: a truncated file would decode
// with black rows. The header says how many pixel bytes follow; fewer is an error.
Status checkBmpComplete(const std::string& path, const std::vector<uint8_t>& bytes) {
    if (bytes.size() < 30)
        return err(path + ": truncated BMP file (" + std::to_string(bytes.size()) +
                   " bytes, no whole header)");
    const uint32_t offset = le32(&bytes[10]), headerSize = le32(&bytes[14]);
    if (headerSize < 40 || bytes.size() < 34) return Status::success();  // OS/2 headers: stb's
    const auto width = static_cast<int32_t>(le32(&bytes[18]));
    const auto height = static_cast<int32_t>(le32(&bytes[22]));
    const unsigned bits = bytes[28] | bytes[29] << 8;
    const uint32_t compression = le32(&bytes[30]);
    if (compression != 0 && compression != 3) return Status::success();  // RLE: stb checks
    const uint64_t stride =
        (uint64_t{bits} * static_cast<uint64_t>(std::abs(int64_t{width})) + 31) / 32 * 4;
    const uint64_t need =
        uint64_t{offset} + stride * static_cast<uint64_t>(std::abs(int64_t{height}));
    if (bytes.size() < need)
        return err(path + ": truncated BMP file: its header says " + std::to_string(need) +
                   " bytes, the file has " + std::to_string(bytes.size()));
    return Status::success();
}

Result<DecodedImage> decodeWithStb(const std::string& path, const std::vector<uint8_t>& bytes,
                                   int channels, const char* kind) {
    if (std::strcmp(kind, "BMP") == 0) TD_RETURN_IF_ERROR(checkBmpComplete(path, bytes));
    int w = 0, h = 0, n = 0;
    stbi_uc* data =
        stbi_load_from_memory(bytes.data(), static_cast<int>(bytes.size()), &w, &h, &n, channels);
    if (!data) return err(path + ": not a readable " + kind + " image: " + stbi_failure_reason());
    DecodedImage img;
    img.height = h;
    img.width = w;
    img.channels = channels;
    img.pixels.assign(data, data + static_cast<size_t>(w) * h * channels);
    stbi_image_free(data);
    return img;
}

float sample(const float* in, int64_t w, int64_t c, int64_t y, int64_t x, int64_t ch) {
    return in[(y * w + x) * c + ch];
}

// Keras' smart_resize: the largest centered box of the target's aspect ratio (in float32, as in
// its tf.data graph), at least one pixel each way.
void cropBox(int64_t h, int64_t w, int64_t th, int64_t tw, int64_t& y0, int64_t& x0, int64_t& ch,
             int64_t& cw) {
    ch = std::max<int64_t>(
        1, std::min(h, static_cast<int64_t>(static_cast<float>(w * th) / static_cast<float>(tw))));
    cw = std::max<int64_t>(
        1, std::min(w, static_cast<int64_t>(static_cast<float>(h * tw) / static_cast<float>(th))));
    y0 = static_cast<int64_t>(static_cast<float>(h - ch) / 2);
    x0 = static_cast<int64_t>(static_cast<float>(w - cw) / 2);
}

}  // namespace

Status decodeToSize(const ImageDirectoryConfig& cfg, const std::string& path,
                    const std::vector<uint8_t>& bytes, float* out) {
    const int channels = channelsOf(cfg.colorMode);
    TD_ASSIGN_OR_RETURN(DecodedImage img, decodeImageFile(path, channels, bytes));
    if (img.height < 1 || img.width < 1) return err(path + ": the image has no pixels");
    const int64_t th = cfg.height, tw = cfg.width, c = channels;
    int64_t y0 = 0, x0 = 0, h = img.height, w = img.width;
    if (cfg.cropToAspectRatio) cropBox(img.height, img.width, th, tw, y0, x0, h, w);
    std::vector<float> src(static_cast<size_t>(h * w * c));
    for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w * c; ++x)
            src[static_cast<size_t>(y * w * c + x)] =
                img.pixels[static_cast<size_t>(((y0 + y) * img.width + x0) * c + x)];
    const bool nearest = cfg.interpolation == "nearest";
    if (!cfg.padToAspectRatio) {
        resizeImage(src.data(), h, w, c, out, th, tw, nearest);
        return Status::success();
    }
    // tf.image.resize_with_pad: scaled to fit, centered on zeros; its arithmetic in float32, as
    // TensorFlow's (in double, 16 / (16 / 14.0) floors to 13).
    const float fh = static_cast<float>(h), fw = static_cast<float>(w);
    const float ratio = std::max(fw / static_cast<float>(tw), fh / static_cast<float>(th));
    const float rh = fh / ratio, rw = fw / ratio;
    const int64_t fitH = std::max<int64_t>(1, static_cast<int64_t>(std::floor(rh)));
    const int64_t fitW = std::max<int64_t>(1, static_cast<int64_t>(std::floor(rw)));
    const int64_t padY =
        std::max<int64_t>(0, static_cast<int64_t>(std::floor((static_cast<float>(th) - rh) / 2)));
    const int64_t padX =
        std::max<int64_t>(0, static_cast<int64_t>(std::floor((static_cast<float>(tw) - rw) / 2)));
    std::vector<float> fitted(static_cast<size_t>(fitH * fitW * c));
    resizeImage(src.data(), h, w, c, fitted.data(), fitH, fitW, nearest);
    std::fill(out, out + th * tw * c, 0.0f);
    for (int64_t y = 0; y < fitH && padY + y < th; ++y)
        for (int64_t x = 0; x < fitW && padX + x < tw; ++x)
            for (int64_t k = 0; k < c; ++k)
                out[((padY + y) * tw + padX + x) * c + k] =
                    fitted[static_cast<size_t>((y * fitW + x) * c + k)];
    return Status::success();
}

int channelsOf(const std::string& colorMode) {
    return colorMode == "grayscale" ? 1 : colorMode == "rgba" ? 4 : 3;
}

namespace {

// One file to the target size.
Status loadOne(const ImageDirectoryConfig& cfg, const std::string& path, float* out) {
    TD_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, readWholeFile(path));
    return decodeToSize(cfg, path, bytes, out);
}

// The listed files of one split as a reader: each sample decoded, cropped or padded and resized
// when read.
class ImageFolderReader final : public ElementReader {
  public:
    ImageFolderReader(const ImageDirectoryConfig& cfg, std::vector<std::string> files)
        : cfg_(cfg), files_(std::move(files)), channels_(channelsOf(cfg.colorMode)) {}
    int64_t size() const override { return static_cast<int64_t>(files_.size()); }
    Shape sampleShape() const override { return {cfg_.height, cfg_.width, channels_}; }
    DType dtype() const override { return DType::F32; }
    Status read(int64_t i, void* dst) const override {
        return withHint(loadOne(cfg_, files_[static_cast<size_t>(i)], static_cast<float*>(dst)));
    }
    bool hasEncoded() const override { return true; }
    std::string elementName(int64_t i) const override { return files_[static_cast<size_t>(i)]; }
    Result<std::vector<int64_t>> encodedSizes() const override {
        std::vector<int64_t> sizes;
        sizes.reserve(files_.size());
        for (const std::string& f : files_) {
            std::error_code ec;
            const auto bytes = fs::file_size(f, ec);
            if (ec) return err(f + ": cannot read its size: " + ec.message());
            sizes.push_back(static_cast<int64_t>(bytes));
        }
        return sizes;
    }
    Status readEncoded(int64_t i, std::vector<uint8_t>& out) const override {
        auto bytes = readWholeFile(files_[static_cast<size_t>(i)]);
        if (!bytes.ok()) return withHint(statusOf(bytes));
        out = std::move(bytes).value();
        return Status::success();
    }
    Status decode(int64_t i, const uint8_t* bytes, size_t size, void* dst) const override {
        thread_local std::vector<uint8_t> copy;
        copy.assign(bytes, bytes + size);
        return withHint(
            decodeToSize(cfg_, files_[static_cast<size_t>(i)], copy, static_cast<float*>(dst)));
    }
    std::string identity() const override {
        std::string id = "image_directory " + std::to_string(cfg_.height) + "x" +
                         std::to_string(cfg_.width) + "x" + std::to_string(channels_) + " " +
                         cfg_.interpolation + (cfg_.cropToAspectRatio ? " crop" : "") +
                         (cfg_.padToAspectRatio ? " pad" : "") + "\n";
        for (const std::string& f : files_) {
            std::error_code ec;
            const auto bytes = fs::file_size(f, ec);
            const auto time = fs::last_write_time(f, ec).time_since_epoch().count();
            id += f + " " + std::to_string(ec ? 0 : bytes) + " " + std::to_string(time) + "\n";
        }
        return id;
    }

  private:
    // A file that does not read, without skip_bad_files: the error says how to leave it out.
    Status withHint(Status s) const {
        if (s.ok() || cfg_.skipBadFiles) return s;
        return err(s.error() + " (set data.source.skip_bad_files to leave such files out)");
    }

    ImageDirectoryConfig cfg_;
    std::vector<std::string> files_;
    int64_t channels_;
};

// One split: the picked files as a streamed dataset, labels as label_mode says.
Dataset splitOf(const ImageDirectoryConfig& cfg, const ImageFileList& list,
                const std::vector<size_t>& pick, int64_t numClasses) {
    const auto m = static_cast<int64_t>(pick.size());
    std::vector<std::string> files;
    files.reserve(pick.size());
    for (size_t i : pick) files.push_back(list.files[i]);
    Tensor y;
    if (cfg.labelMode == "int") {
        y = Tensor(DType::I32, {m});
        for (int64_t j = 0; j < m; ++j)
            y.data<int32_t>()[j] = list.labels[pick[static_cast<size_t>(j)]];
    } else {
        const int64_t k = cfg.labelMode == "binary" ? 1 : numClasses;
        y = Tensor(DType::F32, {m, k});
        std::fill(y.data<float>(), y.data<float>() + m * k, 0.0f);
        for (int64_t j = 0; j < m; ++j) {
            const int32_t label = list.labels[pick[static_cast<size_t>(j)]];
            if (k == 1)
                y.data<float>()[j] = static_cast<float>(label);
            else
                y.data<float>()[j * k + label] = 1.0f;
        }
    }
    Dataset d;
    d.reader = std::make_shared<ImageFolderReader>(cfg, std::move(files));
    d.y = std::move(y);
    d.numClasses = cfg.labelMode == "int" ? numClasses : 0;
    d.classNames = list.classNames;
    return d;
}

// A split as it will be used: decoded into memory (no `stream`), or streamed. Files that do not
// decode are an error or, with skip_bad_files, left out; a streamed split finds them by decoding
// every file once (into nothing), so that no batch meets one during training, and the same files
// are left out, with the same order, as when decoded at load.
Result<Materialized> prepareSplit(const ImageDirectoryConfig& cfg, Dataset d,
                                  const std::string& where, bool stream) {
    if (!stream) return materialize(d, where, cfg.skipBadFiles);
    if (cfg.skipBadFiles) return dropUnreadable(d, where);
    return Materialized{std::move(d), 0, {}};
}

}  // namespace

std::vector<int64_t> numpyLegacyShuffle(int64_t n, uint32_t seed) {
    std::vector<int64_t> v(static_cast<size_t>(std::max<int64_t>(n, 0)));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
    // numpy's RandomState(seed) seeds MT19937 as init_genrand does, as std::mt19937 does; its
    // bounded integer in [0, max] masks 32-bit draws to the smallest covering power of two and
    // draws again above max.
    std::mt19937 mt(seed);
    for (int64_t i = n - 1; i >= 1; --i) {
        auto max = static_cast<uint64_t>(i);
        uint64_t mask = max;
        for (int s : {1, 2, 4, 8, 16, 32}) mask |= mask >> s;
        uint64_t j = 0;
        do {
            j = static_cast<uint64_t>(mt()) & mask;
        } while (j > max);
        std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(j)]);
    }
    return v;
}

Result<ImageFileList> listImageFiles(const ImageDirectoryConfig& cfg, const std::string& directory,
                                     const std::string& field) {
    std::error_code ec;
    if (!fs::is_directory(directory, ec))
        return err(field + ": " + directory +
                   (fs::exists(directory, ec) ? " is not a folder" : " does not exist"));
    ImageFileList list;
    if (cfg.labelsInferred) {
        std::vector<std::string> subdirs;
        for (const fs::directory_entry& e : fs::directory_iterator(directory, ec)) {
            const std::string name = e.path().filename().string();
            std::error_code ec2;
            if (!name.empty() && name[0] != '.' && e.is_directory(ec2)) subdirs.push_back(name);
        }
        if (ec) return err(field + ": cannot list " + directory + ": " + ec.message());
        std::sort(subdirs.begin(), subdirs.end());
        if (subdirs.empty())
            return err(field + ": " + directory +
                       " has no class folders (with labels \"inferred\" each class's images are "
                       "in a sub-folder named after it)");
        if (!cfg.classNames.empty()) {
            for (const std::string& c : cfg.classNames)
                if (std::find(subdirs.begin(), subdirs.end(), c) == subdirs.end())
                    return err("data.source.class_names: \"" + c + "\" is not a sub-folder of " +
                               directory + " (its sub-folders: " + joinNames(subdirs) + ")");
            subdirs = cfg.classNames;
        }
        for (size_t k = 0; k < subdirs.size(); ++k) {
            const fs::path sub = fs::path(directory) / subdirs[k];
            TD_ASSIGN_OR_RETURN(std::vector<std::string> files, walkImages(sub, cfg.followLinks));
            if (files.empty())
                return err(field + ": the class folder " + sub.string() +
                           " holds no images (.bmp, .gif, .jpeg, .jpg or .png)");
            for (std::string& f : files) {
                list.files.push_back(std::move(f));
                list.labels.push_back(static_cast<int32_t>(k));
            }
        }
        list.classNames = subdirs;
    } else {
        TD_ASSIGN_OR_RETURN(list.files, walkImages(directory, cfg.followLinks));
        if (cfg.labels.size() != list.files.size())
            return err("data.source.labels: " + std::to_string(cfg.labels.size()) +
                       " labels for the " + std::to_string(list.files.size()) + " images in " +
                       directory + " (one per image file, in sorted path order)");
        for (int64_t l : cfg.labels) list.labels.push_back(static_cast<int32_t>(l));
    }
    if (list.files.empty())
        return err(field + ": no images in " + directory +
                   " (allowed formats: .bmp, .gif, .jpeg, .jpg, .png)");
    if (cfg.shuffle && cfg.seed) {
        const std::vector<int64_t> order =
            numpyLegacyShuffle(static_cast<int64_t>(list.files.size()), *cfg.seed);
        ImageFileList shuffled = list;
        for (size_t i = 0; i < order.size(); ++i) {
            shuffled.files[i] = list.files[static_cast<size_t>(order[i])];
            shuffled.labels[i] = list.labels[static_cast<size_t>(order[i])];
        }
        list = std::move(shuffled);
    }
    return list;
}

Result<DecodedImage> decodeImageFile(const std::string& path, int channels,
                                     const std::vector<uint8_t>& bytes) {
    TD_ASSERT(channels == 1 || channels == 3 || channels == 4);
    if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()))
        return err(path + ": the file is larger than 2 GiB");
    auto starts = [&](std::initializer_list<uint8_t> magic) {
        if (bytes.size() < magic.size()) return false;
        return std::equal(magic.begin(), magic.end(), bytes.begin());
    };
    if (starts({0xff, 0xd8, 0xff})) return decodeJpeg(path, bytes, channels);
    if (starts({0x89, 'P', 'N', 'G'})) return decodePng(path, bytes, channels);
    if (starts({'G', 'I', 'F', '8'})) return decodeWithStb(path, bytes, channels, "GIF");
    if (starts({'B', 'M'})) return decodeWithStb(path, bytes, channels, "BMP");
    return err(path + ": not an image (expected a JPEG, PNG, GIF or BMP file; " +
               (bytes.empty() ? std::string("the file is empty") : "it starts otherwise") + ")");
}

Result<DecodedImage> decodeImageFile(const std::string& path, int channels) {
    TD_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, readWholeFile(path));
    return decodeImageFile(path, channels, bytes);
}

void resizeImage(const float* in, int64_t height, int64_t width, int64_t channels, float* out,
                 int64_t outHeight, int64_t outWidth, bool nearest) {
    const float sy = static_cast<float>(height) / static_cast<float>(outHeight);
    const float sx = static_cast<float>(width) / static_cast<float>(outWidth);
    if (nearest) {
        for (int64_t y = 0; y < outHeight; ++y) {
            const int64_t iy = std::min(
                height - 1, static_cast<int64_t>(std::floor((static_cast<float>(y) + 0.5f) * sy)));
            for (int64_t x = 0; x < outWidth; ++x) {
                const int64_t ix =
                    std::min(width - 1,
                             static_cast<int64_t>(std::floor((static_cast<float>(x) + 0.5f) * sx)));
                for (int64_t c = 0; c < channels; ++c)
                    out[(y * outWidth + x) * channels + c] = sample(in, width, channels, iy, ix, c);
            }
        }
        return;
    }
    // Bilinear as TensorFlow computes it: source position (i + 0.5) * scale - 0.5, lower index
    // floor (at least 0), upper ceil (at most size - 1), weight the fractional part.
    struct Weight {
        int64_t lo, hi;
        float frac;
    };
    auto weights = [](int64_t outSize, int64_t inSize, float scale) {
        std::vector<Weight> w(static_cast<size_t>(outSize));
        for (int64_t i = 0; i < outSize; ++i) {
            const float p = (static_cast<float>(i) + 0.5f) * scale - 0.5f;
            const float f = std::floor(p);
            w[static_cast<size_t>(i)] = {
                std::max<int64_t>(static_cast<int64_t>(f), 0),
                std::min<int64_t>(static_cast<int64_t>(std::ceil(p)), inSize - 1), p - f};
        }
        return w;
    };
    const std::vector<Weight> wy = weights(outHeight, height, sy),
                              wx = weights(outWidth, width, sx);
    for (int64_t y = 0; y < outHeight; ++y) {
        const Weight& a = wy[static_cast<size_t>(y)];
        for (int64_t x = 0; x < outWidth; ++x) {
            const Weight& b = wx[static_cast<size_t>(x)];
            for (int64_t c = 0; c < channels; ++c) {
                const float tl = sample(in, width, channels, a.lo, b.lo, c);
                const float tr = sample(in, width, channels, a.lo, b.hi, c);
                const float bl = sample(in, width, channels, a.hi, b.lo, c);
                const float br = sample(in, width, channels, a.hi, b.hi, c);
                const float top = tl + (tr - tl) * b.frac;
                const float bottom = bl + (br - bl) * b.frac;
                out[(y * outWidth + x) * channels + c] = top + (bottom - top) * a.frac;
            }
        }
    }
}

Result<DataSplits> loadImageDirectory(const ImageDirectoryConfig& cfg, bool stream) {
    TD_ASSIGN_OR_RETURN(ImageFileList list,
                        listImageFiles(cfg, cfg.directory, "data.source.directory"));
    int64_t numClasses = static_cast<int64_t>(list.classNames.size());
    if (!cfg.labelsInferred) {
        numClasses = 0;
        for (int32_t l : list.labels) numClasses = std::max<int64_t>(numClasses, int64_t{l} + 1);
    }
    if (cfg.labelMode == "binary" && numClasses != 2)
        return err(
            "data.source.label_mode: \"binary\" needs exactly 2 classes, the data has " +
            std::to_string(numClasses) +
            (list.classNames.empty() ? std::string() : " (" + joinNames(list.classNames) + ")"));
    const auto n = static_cast<int64_t>(list.files.size());
    const auto numVal = static_cast<int64_t>(cfg.validationSplit * static_cast<double>(n));
    if (cfg.validationSplit > 0 && (numVal == 0 || numVal == n))
        return err("data.source.validation_split: " + std::to_string(cfg.validationSplit) + " of " +
                   std::to_string(n) + " images leaves " + std::to_string(n - numVal) +
                   " for training and " + std::to_string(numVal) +
                   " for validation (Keras takes the last int(validation_split * images)); "
                   "expected at least one on each side");
    std::vector<size_t> train, val;
    for (int64_t i = 0; i < n; ++i)
        (i < n - numVal ? train : val).push_back(static_cast<size_t>(i));

    DataSplits out;
    TD_ASSIGN_OR_RETURN(Materialized t, prepareSplit(cfg, splitOf(cfg, list, train, numClasses),
                                                     cfg.directory, stream));
    // With skip_bad_files, always a line with the count (none left out is said too).
    auto noteSkipped = [&](const Materialized& l, size_t of, const std::string& what) {
        if (cfg.skipBadFiles)
            out.notes.push_back(skippedNote("data.source.skip_bad_files", l,
                                            static_cast<int64_t>(of), what + " images"));
    };
    noteSkipped(t, train.size(), "training");
    out.train = std::move(t.data);
    if (!val.empty()) {
        TD_ASSIGN_OR_RETURN(Materialized v, prepareSplit(cfg, splitOf(cfg, list, val, numClasses),
                                                         cfg.directory, stream));
        noteSkipped(v, val.size(), "validation");
        out.validation = std::move(v.data);
    }
    if (!cfg.testDirectory.empty()) {
        ImageDirectoryConfig testCfg = cfg;
        testCfg.shuffle = false;  // the test split in Keras' sorted order
        TD_ASSIGN_OR_RETURN(ImageFileList testList, listImageFiles(testCfg, cfg.testDirectory,
                                                                   "data.source.test_directory"));
        if (cfg.labelsInferred && testList.classNames != list.classNames)
            return err("data.source.test_directory: its class folders (" +
                       joinNames(testList.classNames) + ") differ from the training folder's (" +
                       joinNames(list.classNames) + ")");
        std::vector<size_t> all(testList.files.size());
        for (size_t i = 0; i < all.size(); ++i) all[i] = i;
        TD_ASSIGN_OR_RETURN(Materialized te,
                            prepareSplit(testCfg, splitOf(testCfg, testList, all, numClasses),
                                         cfg.testDirectory, stream));
        noteSkipped(te, all.size(), "test");
        out.test = std::move(te.data);
    }
    out.notes.push_back("data.source: " + std::to_string(out.train.size()) + " training, " +
                        std::to_string(out.validation ? out.validation->size() : 0) +
                        " validation and " + std::to_string(out.test ? out.test->size() : 0) +
                        " test images of " + std::to_string(numClasses) + " classes from " +
                        cfg.directory);
    return out;
}

}  // namespace td
