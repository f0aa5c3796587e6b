#include "engine/core/tensor.h"

#include <cmath>
#include <cstdlib>

namespace td {

const char* dtypeName(DType t) {
    switch (t) {
        case DType::F32:
            return "f32";
        case DType::F16:
            return "f16";
        case DType::BF16:
            return "bf16";
        case DType::I32:
            return "i32";
        case DType::U8:
            return "u8";
        case DType::F64:
            return "f64";
    }
    return "?";
}

Result<DType> parseDType(const std::string& s) {
    if (s == "f32" || s == "float32") return DType::F32;
    if (s == "f16" || s == "float16") return DType::F16;
    if (s == "bf16" || s == "bfloat16") return DType::BF16;
    if (s == "i32" || s == "int32") return DType::I32;
    if (s == "u8" || s == "uint8") return DType::U8;
    if (s == "f64" || s == "float64") return DType::F64;
    return err("unknown dtype '" + s + "' (expected f32, f16, bf16, i32, u8 or f64)");
}

size_t dtypeSize(DType t) {
    switch (t) {
        case DType::F32:
        case DType::I32:
            return 4;
        case DType::F16:
        case DType::BF16:
            return 2;
        case DType::U8:
            return 1;
        case DType::F64:
            return 8;
    }
    return 0;
}

int64_t numElements(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
}

std::string shapeToString(const Shape& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) {
        if (i) out += ",";
        out += s[i] < 0 ? std::string("?") : std::to_string(s[i]);
    }
    return out + "]";
}

uint16_t floatToHalf(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t mant = x & 0x7fffffu;
    int32_t exp = static_cast<int32_t>((x >> 23) & 0xff);
    if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
    int32_t e = exp - 127 + 15;
    if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return static_cast<uint16_t>(sign);
        mant |= 0x800000u;
        uint32_t shift = static_cast<uint32_t>(14 - e);
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) ++half;
        return static_cast<uint16_t>(sign | half);
    }
    uint32_t half = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
}

float halfToFloat(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t x;
    if (exp == 0) {
        if (mant == 0) {
            x = sign;
        } else {
            float f = std::ldexp(static_cast<float>(mant), -24);
            std::memcpy(&x, &f, 4);
            x |= sign;
        }
    } else if (exp == 0x1f) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
    size_t n = bytes();
    size_t alloc = ((n + 63) / 64) * 64;
    if (alloc == 0) alloc = 64;
    void* p = std::aligned_alloc(64, alloc);
    TD_ASSERT_MSG(p != nullptr, "out of host memory");
    std::memset(p, 0, alloc);
    storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
    data_ = p;
}

Tensor Tensor::wrap(DType dtype, Shape shape, std::shared_ptr<void> storage, void* data) {
    TD_ASSERT(storage != nullptr && data != nullptr && reinterpret_cast<uintptr_t>(data) % 64 == 0);
    Tensor t;
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    t.storage_ = std::move(storage);
    t.data_ = data;
    return t;
}

Tensor Tensor::reshaped(Shape shape) const {
    TD_ASSERT(numElements(shape) == size());
    Tensor t = *this;
    t.shape_ = std::move(shape);
    return t;
}

Tensor Tensor::clone() const {
    Tensor t(dtype_, shape_);
    if (bytes()) std::memcpy(t.data_, data_, bytes());
    return t;
}

namespace {
template <typename Src>
float loadAsFloat(const Src* p, int64_t i, DType t) {
    if constexpr (std::is_same_v<Src, uint16_t>) {
        return t == DType::F16 ? halfToFloat(p[i]) : bf16ToFloat(p[i]);
    } else {
        return static_cast<float>(p[i]);
    }
}
}  // namespace

Tensor Tensor::to(DType dtype) const {
    if (dtype == dtype_) return clone();
    Tensor out(dtype, shape_);
    const int64_t n = size();
    for (int64_t i = 0; i < n; ++i) {
        float v = 0;
        switch (dtype_) {
            case DType::F32:
                v = data<float>()[i];
                break;
            case DType::F16:
            case DType::BF16:
                v = loadAsFloat(data<uint16_t>(), i, dtype_);
                break;
            case DType::I32:
                v = static_cast<float>(data<int32_t>()[i]);
                break;
            case DType::U8:
                v = static_cast<float>(data<uint8_t>()[i]);
                break;
            case DType::F64:
                v = static_cast<float>(data<double>()[i]);
                break;
        }
        switch (dtype) {
            case DType::F32:
                out.data<float>()[i] = v;
                break;
            case DType::F16:
                out.data<uint16_t>()[i] = floatToHalf(v);
                break;
            case DType::BF16:
                out.data<uint16_t>()[i] = floatToBf16(v);
                break;
            case DType::I32:
                out.data<int32_t>()[i] =
                    dtype_ == DType::I32 ? data<int32_t>()[i] : static_cast<int32_t>(v);
                break;
            case DType::U8:
                out.data<uint8_t>()[i] = static_cast<uint8_t>(v);
                break;
            case DType::F64:
                out.data<double>()[i] =
                    dtype_ == DType::F64 ? data<double>()[i] : static_cast<double>(v);
                break;
        }
    }
    return out;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
    TD_ASSERT(rank() >= 1 && begin >= 0 && begin <= end && end <= shape_[0]);
    Tensor t = *this;
    int64_t row = shape_[0] ? size() / shape_[0] : 0;
    t.shape_[0] = end - begin;
    t.data_ = static_cast<char*>(data_) + begin * row * static_cast<int64_t>(dtypeSize(dtype_));
    return t;
}

}  // namespace td
