// Checks of a loaded source against the model it feeds (loadSource itself is in pipeline.h).
#pragma once

#include <cstdint>

#include "engine/core/data_config.h"
#include "engine/core/result.h"
#include "engine/data/pipeline.h"

namespace td {

// For a loss that takes class ids (sparse_categorical_crossentropy): labels must be integers
// (float labels are refused, naming the file and the value) below the last layer's `units`. The
// error names the labels file (or the CSV file and its label column), the sample index in that file
// and the label value, e.g. "train-labels.idx: sample 57 has label 200: the data has 201 classes
// but the last layer has 10 units (class ids 0..9)".
Status checkLabelsFit(const SourceConfig& cfg, const DataSplits& splits, int64_t units);

}  // namespace td
