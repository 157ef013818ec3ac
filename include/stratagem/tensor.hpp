// Tensor: a contiguous, row-major array in some backend's memory (host for the CPU backend,
// device for CUDA). Only a Backend allocates; views share the storage they slice.
// Elements are fp32 (the CPU backend, master weights, optimizer states, and every tensor the
// executor holds) or bf16 (the CUDA backend's compute copies). `data` points at the first
// element as float* for fp32 tensors; a bf16 tensor is read through bf16_data().
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>

namespace stratagem {

// The element type of a Tensor. (Plan-level precision is `Dtype` in cluster.hpp, which also
// names tf32 and fp16 for the cost model; tensors only ever hold these two.)
enum class ScalarType : uint8_t { fp32, bf16 };
// Where the elements live: host memory, or the memory of the current CUDA device.
enum class Device : uint8_t { host, cuda };

inline size_t element_bytes(ScalarType t) {
  return t == ScalarType::bf16 ? 2 : 4;
}
inline const char* to_string(ScalarType t) {
  return t == ScalarType::bf16 ? "bf16" : "fp32";
}

// Fixed-capacity shape: (B,NH,T,T) is the largest rank used, and keeping dims inline means
// that views and shape checks in the training loop never touch the heap.
class Shape {
 public:
  static constexpr int kMaxDims = 4;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) {
    if (dims.size() > kMaxDims) throw std::invalid_argument("Shape: more than 4 dimensions");
    for (int64_t d : dims) {
      if (d < 0) throw std::invalid_argument("Shape: negative dimension");
      dims_[ndim_++] = d;
    }
  }

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim_; ++i) n *= dims_[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (ndim_ != o.ndim_) return false;
    for (int i = 0; i < ndim_; ++i)
      if (dims_[i] != o.dims_[i]) return false;
    return true;
  }
  std::string str() const {
    std::string s = "(";
    for (int i = 0; i < ndim_; ++i) s += (i ? "," : "") + std::to_string(dims_[i]);
    return s + ")";
  }

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

struct Tensor {
  float* data = nullptr;  // first element (for bf16 tensors: its address; use bf16_data())
  Shape shape;
  std::shared_ptr<void> storage;  // keeps the allocation alive; shared by every view of it
  ScalarType dtype = ScalarType::fp32;
  Device device = Device::host;

  bool defined() const { return data != nullptr; }
  int ndim() const { return shape.ndim(); }
  int64_t dim(int i) const { return shape[i < 0 ? shape.ndim() + i : i]; }
  int64_t numel() const { return defined() ? shape.numel() : 0; }
  size_t element_size() const { return element_bytes(dtype); }
  size_t bytes() const { return static_cast<size_t>(numel()) * element_size(); }
  void* raw() const { return data; }
  // The bf16 elements as their bit patterns (bf16 is the upper half of an fp32).
  uint16_t* bf16_data() const {
    if (dtype != ScalarType::bf16)
      throw std::logic_error("Tensor::bf16_data: the tensor holds " +
                             std::string(to_string(dtype)));
    return reinterpret_cast<uint16_t*>(data);
  }

  // The same elements under another shape.
  Tensor view(Shape s) const {
    if (s.numel() != numel())
      throw std::invalid_argument("Tensor::view: " + shape.str() + " cannot be viewed as " +
                                  s.str());
    return Tensor{data, s, storage, dtype, device};
  }
  // `s.numel()` consecutive elements starting at flat element `offset`.
  Tensor slice(int64_t offset, Shape s) const {
    if (offset < 0 || offset + s.numel() > numel())
      throw std::invalid_argument("Tensor::slice: " + s.str() + " at offset " +
                                  std::to_string(offset) + " exceeds " + shape.str());
    return Tensor{at(offset), s, storage, dtype, device};
  }
  // Rows [begin, end) of the leading dimension, other dims unchanged.
  Tensor rows(int64_t begin, int64_t end) const {
    if (ndim() < 1 || begin < 0 || end < begin || end > dim(0))
      throw std::invalid_argument("Tensor::rows: [" + std::to_string(begin) + "," +
                                  std::to_string(end) + ") of " + shape.str());
    const int64_t row = dim(0) == 0 ? 0 : numel() / dim(0);
    return Tensor{at(begin * row), with_leading(shape, end - begin), storage, dtype, device};
  }

 private:
  // Element `offset` counted in this tensor's elements, whatever their size.
  float* at(int64_t offset) const {
    return reinterpret_cast<float*>(reinterpret_cast<char*>(data) +
                                    offset * static_cast<int64_t>(element_size()));
  }
  static Shape with_leading(const Shape& s, int64_t lead) {
    switch (s.ndim()) {
      case 1:
        return Shape{lead};
      case 2:
        return Shape{lead, s[1]};
      case 3:
        return Shape{lead, s[1], s[2]};
      default:
        return Shape{lead, s[1], s[2], s[3]};
    }
  }
};

// Throws std::invalid_argument("<where>: <what> has shape (..), expected (..)") on mismatch.
inline void expect_shape(const Tensor& t, const Shape& expected, const char* where,
                         const char* what) {
  if (!t.defined())
    throw std::invalid_argument(std::string(where) + ": " + what + " is undefined, expected " +
                                expected.str());
  if (!(t.shape == expected))
    throw std::invalid_argument(std::string(where) + ": " + what + " has shape " + t.shape.str() +
                                ", expected " + expected.str());
}

}  // namespace stratagem
