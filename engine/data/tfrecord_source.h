// The tfrecord source: TFRecord shards of tf.train.Example (tfrecord.h) as a dataset, read as
//     files = sorted(glob(pattern) for each pattern)
//     tf.data.Dataset.from_tensor_slices(files)
//         .interleave(lambda f: tf.data.TFRecordDataset(f, compression),
//                     cycle_length, block_length)          # deterministic order
//         .map(parse the x and y features, decode x)
// with the shard list shuffled each epoch when training shuffles (shuffle_files).
//
// Loading walks every record once: both CRCs are checked (a bad record is an error naming the
// file and the record's offset), every label is read into memory, and each record's place is
// kept. Sample i is the i-th record of the unshuffled interleave; streamed, reading it reads the
// record again (checked again) and decodes its x feature, on the pipeline's map workers.
// With skip_bad_files, what does not read (a shard that does not open, a record whose data CRC
// does not match, the rest of a shard after a framing error, a record without its features, an x
// that does not decode) is left out of the split instead, keeping its place in the interleave:
// an epoch's order is the full interleave with those records taken out, decoded at load or
// streamed (found at load by decoding every record once).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/data_config.h"
#include "engine/core/result.h"
#include "engine/data/pipeline.h"

namespace td {

// tf.data's deterministic interleave of files with these record counts, taken in `fileOrder`:
// cycle_length files open at once; block_length records from each in turn; a file that ends
// frees its place in the cycle for the next file, which starts when its turn comes. Returns
// (file, record) pairs in order.
std::vector<std::pair<int32_t, int64_t>> interleaveOrder(const std::vector<int64_t>& counts,
                                                         const std::vector<int32_t>& fileOrder,
                                                         int64_t cycleLength, int64_t blockLength);

// The training split (files) and the test split (testFiles, when given). With `stream`, the x
// features are read and decoded when the pipeline reads a sample; without, all of them here.
Result<DataSplits> loadTfRecords(const TfRecordConfig& cfg, bool stream);

}  // namespace td
