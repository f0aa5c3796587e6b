// Tensor: one dense, row-major, host-memory array with a dtype and a shape. The one tensor type of
// the engine's host side (data pipeline, parameters, checkpoints, predictions). Device buffers are
// the backend's business (engine/backend/backend.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/half.h"
#include "engine/core/result.h"

namespace td {

enum class DType : uint8_t { F32, F16, BF16, I32, U8, F64 };

const char* dtypeName(DType t);                // "f32", "f16", "bf16", "i32", "u8", "f64"
Result<DType> parseDType(const std::string&);  // inverse of dtypeName (also "float32", ...)
size_t dtypeSize(DType t);

using Shape = std::vector<int64_t>;
int64_t numElements(const Shape& s);        // product of dims (1 for a scalar)
std::string shapeToString(const Shape& s);  // "[32,784]"

// 16-bit float conversions (round to nearest even).
uint16_t floatToHalf(float f);
float halfToFloat(uint16_t h);
// floatToBf16 / bf16ToFloat: engine/core/half.h (included above).

class Tensor {
  public:
    Tensor() = default;
    // Allocates zero-filled, 64-byte aligned storage.
    Tensor(DType dtype, Shape shape);
    // A tensor over memory the caller provides (a file mapping, say): `storage` keeps it alive
    // and releases it when the last tensor sharing it goes. `data` must be 64-byte aligned and
    // hold the shape's bytes.
    static Tensor wrap(DType dtype, Shape shape, std::shared_ptr<void> storage, void* data);

    DType dtype() const { return dtype_; }
    const Shape& shape() const { return shape_; }
    int64_t dim(size_t i) const { return shape_[i]; }
    size_t rank() const { return shape_.size(); }
    int64_t size() const { return numElements(shape_); }
    size_t bytes() const { return static_cast<size_t>(size()) * dtypeSize(dtype_); }
    bool empty() const { return !storage_; }

    void* raw() { return data_; }
    const void* raw() const { return data_; }
    template <typename T>
    T* data() {
        return static_cast<T*>(data_);
    }
    template <typename T>
    const T* data() const {
        return static_cast<const T*>(data_);
    }

    // Same storage, new shape with the same element count.
    Tensor reshaped(Shape shape) const;
    // Deep copy.
    Tensor clone() const;
    // Converted copy (any dtype to any dtype; float->int truncates toward zero).
    Tensor to(DType dtype) const;
    // Rows [begin, end) of the leading dimension, sharing storage.
    Tensor slice(int64_t begin, int64_t end) const;

  private:
    DType dtype_ = DType::F32;
    Shape shape_;
    std::shared_ptr<void> storage_;
    void* data_ = nullptr;
};

}  // namespace td
