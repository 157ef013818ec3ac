// Small RAII and error helpers over the HDF5 C API.
#pragma once
#include <hdf5.h>

#include <stdexcept>
#include <string>

namespace stratagem::io {

// One checked-call macro for HDF5, reporting file and line.
#define STRATAGEM_H5_CHECK(expr)                                                        \
  ([&]() {                                                                              \
    auto v_ = (expr);                                                                   \
    if (v_ < 0)                                                                         \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                               ": HDF5 call failed: " #expr);                           \
    return v_;                                                                          \
  }())

class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer c) : id_(id), close_(c) {}
  H5Handle(H5Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  H5Handle& operator=(H5Handle&& o) noexcept {
    reset();
    id_ = o.id_, close_ = o.close_;
    o.id_ = -1;
    return *this;
  }
  ~H5Handle() { reset(); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  // Gives the id up without closing it (a caller that must check the close itself).
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// Silences HDF5's own error stack printing while alive (we report errors ourselves).
class H5Quiet {
 public:
  H5Quiet() {
    H5Eget_auto2(H5E_DEFAULT, &fn_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~H5Quiet() { H5Eset_auto2(H5E_DEFAULT, fn_, data_); }

 private:
  H5E_auto2_t fn_ = nullptr;
  void* data_ = nullptr;
};

void write_string_attr(hid_t obj, const char* name, const std::string& value);
std::string read_string_attr(hid_t obj, const char* name);
void write_int64_attr(hid_t obj, const char* name, int64_t value);
int64_t read_int64_attr(hid_t obj, const char* name);
bool has_attr(hid_t obj, const char* name);
// Turns HDF5's automatic error printing off for the whole process, once: every HDF5 failure is
// reported by the caller as one line, and HDF5 prints its "infinite loop closing library" at
// exit (after a damaged file) only while automatic printing is on.
void silence_hdf5_errors();

// For a 1-D dataset of `n` elements about to be read: "" when its storage description is
// consistent, else what is not. HDF5 1.10 trusts these fields and reads past its buffers when
// a damaged file contradicts them (found by fuzzing): a chunk larger than a fixed dataspace, a
// compact dataset shorter than its elements, or chunks too large to be plausible.
std::string check_1d_layout(hid_t dataset, hsize_t n);
// Creates every missing group along "a/b/c".
void ensure_groups(hid_t file, const std::string& path);

}  // namespace stratagem::io
