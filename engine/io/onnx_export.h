// ONNX export of a Sequential model with its weights: an inference graph (dropout removed),
// opset 17, IR version 8, every weight an initializer, one input "input" of shape
// [batch, ...input shape] with a symbolic batch dimension and one output "output". Written in
// the protobuf wire format of onnx/onnx.proto (protobuf_wire.h).
//
// Layer by layer (onnxLayerNodes in the .cpp): Dense -> Gemm (MatMul without bias) + its
// activation; Flatten -> Flatten(axis 1); Reshape -> Reshape to [-1, target]; Activation -> the
// ONNX op (gelu as its erf form, which opset 17 lacks as one op); Dropout -> nothing; Conv2D ->
// Conv (kernel transposed to [filters, in / groups, kh, kw], explicit pads for "same") + its
// activation; MaxPooling2D / AveragePooling2D -> MaxPool / AveragePool (padding excluded from
// the average, as Keras does); GlobalAveragePooling2D -> GlobalAveragePool + Flatten;
// ZeroPadding2D -> Pad; Rescaling -> Mul and Add by scalars; BatchNormalization ->
// BatchNormalization with the moving statistics (gamma 1, beta 0 where the layer has none);
// LayerNormalization -> LayerNormalization(axis -1); Resizing, CenterCrop and RandomCrop (its
// inference crop) -> Slice and Pad of the part resized, then Resize (linear with half-pixel
// centres, or nearest as TensorFlow rounds) where the size changes; the Random* augmentation
// layers -> nothing (the identity at inference, as Dropout). Images are channels-last in TrainDeck
// and channels-first for ONNX's Conv, pooling and BatchNormalization: a run of such layers sits
// between one Transpose in and one out. Any other layer type is refused by name.
#pragma once

#include <string>

#include "engine/core/result.h"
#include "engine/io/model_weights.h"

namespace td {

constexpr int kOnnxOpset = 17;
constexpr int kOnnxIrVersion = 8;  // the IR version of opset 17 (ONNX 1.12)

// The serialized ModelProto. Errors name the layer that cannot be exported.
Result<std::string> onnxModelBytes(const ModelWeights& weights);
// Atomic write; errors name `path`.
Status saveOnnxModel(const ModelWeights& weights, const std::string& path);

}  // namespace td
