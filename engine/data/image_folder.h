// The image_directory source: a folder of images, one sub-folder per class, read as Keras'
// image_dataset_from_directory reads it (the same files, labels, order, split and image sizes),
// decoded with libjpeg-turbo (JPEG), libpng (PNG) and stb_image (BMP, GIF's first frame) into
// float32 [N, height, width, channels] with values 0..255, as Keras yields them: when the pipeline
// reads a sample (streamed), or all at load.
//
// Keras' order: the class names are the sorted sub-folder names (or `class_names`, in its order);
// each class's files are listed recursively, folders in sorted order and the files of each in
// sorted order, keeping those whose lower-case name ends in .bmp, .gif, .jpeg, .jpg or .png; the
// classes' lists are joined in class order. With shuffle and a seed the list is shuffled as
// numpy.random.RandomState(seed).shuffle does; the validation subset is then the last
// int(validation_split * N) files and training the rest.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "engine/core/data_config.h"
#include "engine/core/result.h"
#include "engine/data/pipeline.h"

namespace td {

// The files of one folder (the training folder or the test folder) and their class ids.
struct ImageFileList {
    std::vector<std::string> files;
    std::vector<int32_t> labels;
    std::vector<std::string> classNames;  // empty for explicit labels
};

// Lists `directory` as Keras does (shuffled when cfg.shuffle and cfg.seed). `field` names the
// project field for errors ("data.source.directory").
Result<ImageFileList> listImageFiles(const ImageDirectoryConfig& cfg, const std::string& directory,
                                     const std::string& field);

// numpy.random.RandomState(seed).shuffle applied to 0, 1, ..., n - 1 (MT19937 seeded as numpy's
// legacy seeding does, then Fisher-Yates from the end with numpy's bounded integers).
std::vector<int64_t> numpyLegacyShuffle(int64_t n, uint32_t seed);

// One image file decoded to 8-bit pixels, height x width x channels (1: grayscale, 3: RGB, 4:
// RGBA; the decoder converts to what is asked). The format is read from the file's first bytes.
struct DecodedImage {
    int64_t height = 0, width = 0, channels = 0;
    std::vector<uint8_t> pixels;
};
Result<DecodedImage> decodeImageFile(const std::string& path, int channels);
// The same from the file's bytes, already read (`path` names it in errors).
Result<DecodedImage> decodeImageFile(const std::string& path, int channels,
                                     const std::vector<uint8_t>& bytes);

// An encoded image (any format decodeImageFile reads) to cfg's image_size and color_mode as
// image_directory makes its samples: decoded, cropped or padded to the aspect ratio when asked,
// resized; f32 height x width x channels, values 0..255. `name` names it in errors.
Status decodeToSize(const ImageDirectoryConfig& cfg, const std::string& name,
                    const std::vector<uint8_t>& bytes, float* out);
// The channels of a color_mode: 1 (grayscale), 3 (rgb), 4 (rgba).
int channelsOf(const std::string& colorMode);

// TensorFlow's tf.image.resize of an f32 HWC image (half-pixel centers, no antialiasing):
// bilinear, or nearest.
void resizeImage(const float* in, int64_t height, int64_t width, int64_t channels, float* out,
                 int64_t outHeight, int64_t outWidth, bool nearest);

// The source: training (Keras' "training" subset), the validation subset when validation_split
// is set (DataSplits::validation) and the test folder's images when test_directory is set. With
// `stream`, each split is a reader that decodes a file when the pipeline reads its sample;
// without, the files are decoded here, in parallel, into one array per split.
Result<DataSplits> loadImageDirectory(const ImageDirectoryConfig& cfg, bool stream = false);

}  // namespace td
