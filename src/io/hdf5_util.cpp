#include "stratagem/hdf5_util.hpp"

#include <stdexcept>
#include <string>
#include <vector>

namespace stratagem::io {

void write_string_attr(hid_t obj, const char* name, const std::string& value) {
  H5Handle type(STRATAGEM_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  STRATAGEM_H5_CHECK(H5Tset_size(type, value.empty() ? 1 : value.size()));
  H5Handle space(STRATAGEM_H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  H5Handle attr(STRATAGEM_H5_CHECK(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT)),
                H5Aclose);
  std::string v = value.empty() ? std::string(1, '\0') : value;
  STRATAGEM_H5_CHECK(H5Awrite(attr, type, v.data()));
}

namespace {
// H5Aread fills the attribute's whole dataspace: a damaged file's attribute may claim many
// values where one is read (it would write past the buffer).
void require_one_value(hid_t attr, const char* name) {
  H5Handle space(STRATAGEM_H5_CHECK(H5Aget_space(attr)), H5Sclose);
  if (H5Sget_simple_extent_npoints(space) != 1)
    throw std::runtime_error(std::string("attribute ") + name + " does not hold one value");
}
}  // namespace

std::string read_string_attr(hid_t obj, const char* name) {
  H5Handle attr(STRATAGEM_H5_CHECK(H5Aopen(obj, name, H5P_DEFAULT)), H5Aclose);
  H5Handle type(STRATAGEM_H5_CHECK(H5Aget_type(attr)), H5Tclose);
  require_one_value(attr, name);
  // As write_string_attr writes them: one fixed-length string, no larger than the file.
  if (H5Tget_class(type) != H5T_STRING || H5Tis_variable_str(type) != 0)
    throw std::runtime_error(std::string("attribute ") + name + " is not a fixed-length string");
  const size_t n = H5Tget_size(type);
  hsize_t file_bytes = 0;
  {
    H5Handle file(STRATAGEM_H5_CHECK(H5Iget_file_id(obj)), H5Fclose);
    STRATAGEM_H5_CHECK(H5Fget_filesize(file, &file_bytes));
  }
  if (n == 0 || n > file_bytes)
    throw std::runtime_error(std::string("attribute ") + name + " has a bad size");
  std::vector<char> buf(n + 1, '\0');
  STRATAGEM_H5_CHECK(H5Aread(attr, type, buf.data()));
  return std::string(buf.data());
}

void silence_hdf5_errors() {
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

std::string check_1d_layout(hid_t dataset, hsize_t n) {
  H5Handle space(H5Dget_space(dataset), H5Sclose);
  H5Handle type(H5Dget_type(dataset), H5Tclose);
  H5Handle dcpl(H5Dget_create_plist(dataset), H5Pclose);
  if (!space.valid() || !type.valid() || !dcpl.valid()) return "unreadable dataset header";
  if (H5Sget_simple_extent_ndims(space) != 1) return "not a 1-D dataset";
  hsize_t dim = 0, max_dim = 0;
  if (H5Sget_simple_extent_dims(space, &dim, &max_dim) < 0 || dim != n) return "bad dataspace";
  const size_t elem = H5Tget_size(type);
  if (elem == 0 || elem > 4096) return "bad element size";
  // A compound's members must lie inside it (libhdf5 1.10 converts them without checking).
  if (H5Tget_class(type) == H5T_COMPOUND) {
    const int members = H5Tget_nmembers(type);
    if (members < 1 || members > 256) return "bad number of table columns";
    for (int i = 0; i < members; ++i) {
      H5Handle mt(H5Tget_member_type(type, unsigned(i)), H5Tclose);
      const size_t size = mt.valid() ? H5Tget_size(mt) : 0;
      if (size == 0 || H5Tget_member_offset(type, unsigned(i)) + size > elem)
        return "a table column outside its row";
    }
  }
  // What the header says is stored cannot exceed the file (a damaged one may claim exabytes).
  H5Handle file(H5Iget_file_id(dataset), H5Fclose);
  hsize_t file_bytes = 0;
  if (!file.valid() || H5Fget_filesize(file, &file_bytes) < 0) return "unreadable file size";
  if (H5Dget_storage_size(dataset) > file_bytes) return "more data claimed than the file holds";
  switch (H5Pget_layout(dcpl)) {
    case H5D_COMPACT:
      if (H5Dget_storage_size(dataset) < n * elem) return "compact data shorter than its elements";
      return "";
    case H5D_CONTIGUOUS:
      return "";
    case H5D_CHUNKED: {
      hsize_t chunk = 0;
      if (H5Pget_chunk(dcpl, 1, &chunk) != 1 || chunk == 0) return "bad chunk shape";
      if (max_dim != H5S_UNLIMITED && chunk > max_dim) return "chunk larger than the dataset";
      if (chunk * elem > (hsize_t(64) << 20)) return "chunk larger than 64 MiB";
      return "";
    }
    default:
      return "unknown storage layout";
  }
}

void write_int64_attr(hid_t obj, const char* name, int64_t value) {
  H5Handle space(STRATAGEM_H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  H5Handle attr(
      STRATAGEM_H5_CHECK(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT)),
      H5Aclose);
  STRATAGEM_H5_CHECK(H5Awrite(attr, H5T_NATIVE_INT64, &value));
}

int64_t read_int64_attr(hid_t obj, const char* name) {
  H5Handle attr(STRATAGEM_H5_CHECK(H5Aopen(obj, name, H5P_DEFAULT)), H5Aclose);
  require_one_value(attr, name);
  {
    H5Handle type(STRATAGEM_H5_CHECK(H5Aget_type(attr)), H5Tclose);
    if (H5Tget_class(type) != H5T_INTEGER)
      throw std::runtime_error(std::string("attribute ") + name + " is not an integer");
    // libhdf5 1.10 converts an integer of more bits than its bytes hold by reading past its
    // own buffer (H5T__bit_find): a damaged type is refused first.
    const size_t bytes = H5Tget_size(type), bits = H5Tget_precision(type);
    const int offset = H5Tget_offset(type);
    if (bytes == 0 || bytes > 8 || bits == 0 || offset < 0 || size_t(offset) + bits > 8 * bytes)
      throw std::runtime_error(std::string("attribute ") + name + " has a damaged integer type");
  }
  int64_t v = 0;
  STRATAGEM_H5_CHECK(H5Aread(attr, H5T_NATIVE_INT64, &v));
  return v;
}

bool has_attr(hid_t obj, const char* name) {
  return H5Aexists(obj, name) > 0;
}

void ensure_groups(hid_t file, const std::string& path) {
  size_t at = 0;
  while (at < path.size()) {
    size_t slash = path.find('/', at);
    std::string prefix = path.substr(0, slash == std::string::npos ? path.size() : slash);
    if (!prefix.empty() && H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) {
      H5Handle g(STRATAGEM_H5_CHECK(
                     H5Gcreate2(file, prefix.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
                 H5Gclose);
    }
    if (slash == std::string::npos) break;
    at = slash + 1;
  }
}

}  // namespace stratagem::io
