// HDF5 trace files (schema in include/stratagem/trace.hpp and sim/README.md), written and read
// serially with the HDF5 C API. A trace's user block holds the digest of its bytes
// (src/io/file_digest.hpp), written on close and checked before libhdf5 opens the file.
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <type_traits>

#include "src/io/atomic_file.hpp"
#include "src/io/file_digest.hpp"
#include "stratagem/error.hpp"
#include "stratagem/hdf5_guard.hpp"
#include "stratagem/hdf5_util.hpp"
#include "stratagem/input_file.hpp"
#include "stratagem/output_file.hpp"
#include "stratagem/trace.hpp"

namespace stratagem::trace {
namespace {

constexpr hsize_t kDigestBlockBytes = 4096;

// HDF5 prints its own error stack unless told not to; we report errors ourselves.
class QuietHdf5 {
 public:
  QuietHdf5() {
    H5Eget_auto2(H5E_DEFAULT, &fn_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, fn_, data_); }

 private:
  H5E_auto2_t fn_ = nullptr;
  void* data_ = nullptr;
};

// Closes an HDF5 handle on scope exit.
struct Handle {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  Handle(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~Handle() {
    if (id >= 0 && close) close(id);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  operator hid_t() const { return id; }
};

// A trace being written: libhdf5 does not pass errno on, so a full disk is told by the file
// system's free space (the one message for it: stratagem/output_file.hpp).
[[noreturn]] void write_failed(const std::string& what, const std::string& path) {
  io::note_failed_hdf5_write();
  if (io::no_space_left(path)) io::throw_write_error("trace", path, ENOSPC);
  throw std::runtime_error("trace " + path + ": HDF5 failed to " + what);
}
hid_t check(hid_t id, const std::string& what, const std::string& path) {
  if (id < 0) write_failed(what, path);
  return id;
}
void check(herr_t e, const char* what, const std::string& path) {
  if (e < 0) write_failed(what, path);
}
// A trace being read is input: a part that cannot be read is a damaged file (exit 2).
[[noreturn]] void damaged(const std::string& path, const std::string& what) {
  throw InputError("trace: " + path + " is damaged: " + what);
}
hid_t check_read(hid_t id, const std::string& what, const std::string& path) {
  if (id < 0) damaged(path, "cannot " + what);
  return id;
}

// An attribute read into one value must hold exactly one (a damaged one may claim many).
void require_one_value(hid_t attr, const std::string& name, const std::string& path) {
  Handle space(check_read(H5Aget_space(attr), "read the shape of attribute " + name, path),
               H5Sclose);
  if (H5Sget_simple_extent_npoints(space) != 1)
    damaged(path, "attribute " + name + " does not hold one value");
}

// Values read back from a file: bounded so that differences and sums of a few never overflow.
constexpr int64_t kMaxTraceValue = int64_t(1) << 62;
bool sane(int64_t v) {
  return v >= -kMaxTraceValue && v <= kMaxTraceValue;
}
void validate_rows(const std::vector<OpRecord>& rows, const std::string& where,
                   const std::string& path) {
  for (size_t i = 0; i < rows.size(); ++i) {
    const OpRecord& r = rows[i];
    const std::string at = where + " row " + std::to_string(i);
    if (r.kind > static_cast<uint8_t>(OpKind::free)) damaged(path, at + ": unknown op kind");
    if (r.stream >= kNumStreams) damaged(path, at + ": unknown stream");
    if (!sane(r.start_ns) || !sane(r.end_ns) || r.end_ns < r.start_ns)
      damaged(path, at + ": end_ns before start_ns or out of range");
    if (!sane(r.bytes) || !std::isfinite(r.flops))
      damaged(path, at + ": bytes or flops out of range");
  }
}
void validate_rows(const std::vector<MemorySample>& rows, const std::string& where,
                   const std::string& path) {
  for (size_t i = 0; i < rows.size(); ++i) {
    const MemorySample& m = rows[i];
    bool ok = sane(m.time_ns) && sane(m.total_bytes) && sane(m.high_water_bytes);
    for (int c = 0; c < kNumMemCategories; ++c)
      ok = ok && m.bytes[c] >= 0 && m.bytes[c] <= kMaxTraceValue / kNumMemCategories;
    if (!ok) damaged(path, where + " row " + std::to_string(i) + ": a value out of range");
  }
}

hid_t enum_type(const char* const* names, int n) {
  hid_t t = H5Tenum_create(H5T_NATIVE_UINT8);
  for (int i = 0; i < n; ++i) {
    uint8_t v = uint8_t(i);
    H5Tenum_insert(t, names[i], &v);
  }
  return t;
}

hid_t op_type() {
  const char* kinds[kNumOpKinds];
  for (int k = 0; k < kNumOpKinds; ++k) kinds[k] = to_string(OpKind(k));
  const char* streams[kNumStreams];
  for (int s = 0; s < kNumStreams; ++s) streams[s] = to_string(Stream(s));
  hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(OpRecord));
  hid_t s = H5Tcopy(H5T_C_S1);
  H5Tset_size(s, kNameBytes);
  H5Tset_strpad(s, H5T_STR_NULLPAD);
  H5Tinsert(t, "name", HOFFSET(OpRecord, name), s);
  H5Tclose(s);
  hid_t k = enum_type(kinds, kNumOpKinds), st = enum_type(streams, kNumStreams);
  H5Tinsert(t, "kind", HOFFSET(OpRecord, kind), k);
  H5Tinsert(t, "stream", HOFFSET(OpRecord, stream), st);
  H5Tclose(k);
  H5Tclose(st);
  H5Tinsert(t, "start_ns", HOFFSET(OpRecord, start_ns), H5T_NATIVE_INT64);
  H5Tinsert(t, "end_ns", HOFFSET(OpRecord, end_ns), H5T_NATIVE_INT64);
  H5Tinsert(t, "bytes", HOFFSET(OpRecord, bytes), H5T_NATIVE_INT64);
  H5Tinsert(t, "flops", HOFFSET(OpRecord, flops), H5T_NATIVE_DOUBLE);
  H5Tinsert(t, "microbatch", HOFFSET(OpRecord, microbatch), H5T_NATIVE_INT32);
  H5Tinsert(t, "layer", HOFFSET(OpRecord, layer), H5T_NATIVE_INT32);
  H5Tinsert(t, "iteration", HOFFSET(OpRecord, iteration), H5T_NATIVE_INT32);
  return t;
}

hid_t memory_type() {
  hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(MemorySample));
  H5Tinsert(t, "time_ns", HOFFSET(MemorySample, time_ns), H5T_NATIVE_INT64);
  for (int c = 0; c < kNumMemCategories; ++c) {
    const std::string name = std::string(to_string(MemCategory(c))) + "_bytes";
    H5Tinsert(t, name.c_str(), HOFFSET(MemorySample, bytes) + c * sizeof(int64_t),
              H5T_NATIVE_INT64);
  }
  H5Tinsert(t, "total_bytes", HOFFSET(MemorySample, total_bytes), H5T_NATIVE_INT64);
  H5Tinsert(t, "high_water_bytes", HOFFSET(MemorySample, high_water_bytes), H5T_NATIVE_INT64);
  return t;
}

hid_t open_or_create_group(hid_t parent, const std::string& name, const std::string& path) {
  if (H5Lexists(parent, name.c_str(), H5P_DEFAULT) > 0)
    return check(H5Gopen2(parent, name.c_str(), H5P_DEFAULT), "open group " + name, path);
  return check(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
               "create group " + name, path);
}

// Appends rows to /ranks/<rank>/<name>, creating a chunked, extendible dataset on first use.
void append(hid_t file, int rank, const char* name, hid_t type, const void* rows, size_t n,
            const std::string& path) {
  QuietHdf5 quiet;
  Handle ranks(open_or_create_group(file, "ranks", path), H5Gclose);
  Handle grp(open_or_create_group(ranks, std::to_string(rank), path), H5Gclose);
  hid_t ds;
  if (H5Lexists(grp, name, H5P_DEFAULT) > 0) {
    ds = check(H5Dopen2(grp, name, H5P_DEFAULT), std::string("open ") + name, path);
  } else {
    hsize_t zero = 0, unlimited = H5S_UNLIMITED, chunk = 4096;
    Handle space(H5Screate_simple(1, &zero, &unlimited), H5Sclose);
    Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_chunk(dcpl, 1, &chunk);
    if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0) {
      H5Pset_shuffle(dcpl);
      H5Pset_deflate(dcpl, 1);
    }
    ds = check(H5Dcreate2(grp, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
               std::string("create ") + name, path);
  }
  Handle dset(ds, H5Dclose);
  if (n == 0) return;
  Handle old(H5Dget_space(dset), H5Sclose);
  hsize_t have = 0;
  H5Sget_simple_extent_dims(old, &have, nullptr);
  hsize_t total = have + n, count = n;
  check(H5Dset_extent(dset, &total), "extend a table", path);
  Handle fs(H5Dget_space(dset), H5Sclose);
  H5Sselect_hyperslab(fs, H5S_SELECT_SET, &have, nullptr, &count, nullptr);
  Handle ms(H5Screate_simple(1, &count, nullptr), H5Sclose);
  check(H5Dwrite(dset, type, ms, fs, H5P_DEFAULT, rows), "write rows", path);
}

template <class T>
std::vector<T> read_table(hid_t file, int rank, const char* name, hid_t type,
                          const std::string& path) {
  QuietHdf5 quiet;
  const std::string where = "/ranks/" + std::to_string(rank) + "/" + name;
  std::vector<T> out;
  // A missing table is an empty one (a rank without memory samples); a table that exists but
  // cannot be read is damage.
  auto exists = [&](hid_t parent, const char* link) {
    const htri_t e = H5Lexists(parent, link, H5P_DEFAULT);
    if (e < 0) damaged(path, "cannot look up " + where);
    return e > 0;
  };
  if (!exists(file, "ranks")) return out;
  Handle ranks(check_read(H5Gopen2(file, "ranks", H5P_DEFAULT), "open /ranks", path), H5Gclose);
  const std::string r = std::to_string(rank);
  if (!exists(ranks, r.c_str())) return out;
  Handle grp(check_read(H5Gopen2(ranks, r.c_str(), H5P_DEFAULT), "open /ranks/" + r, path),
             H5Gclose);
  if (!exists(grp, name)) return out;
  Handle dset(check_read(H5Dopen2(grp, name, H5P_DEFAULT), "open " + where, path), H5Dclose);
  Handle space(check_read(H5Dget_space(dset), "read the shape of " + where, path), H5Sclose);
  if (H5Sget_simple_extent_ndims(space) != 1) damaged(path, where + " is not a table (1-D)");
  hsize_t n = 0;
  if (H5Sget_simple_extent_dims(space, &n, nullptr) < 0)
    damaged(path, "cannot read the length of " + where);
  if (const std::string bad = io::check_1d_layout(dset, n); !bad.empty())
    damaged(path, where + ": " + bad);
  // The length comes from the file: refuse one that could not have been written, rather than
  // try to allocate it (a damaged header may claim 2^60 rows).
  const hsize_t storage = H5Dget_storage_size(dset);
  if (n > (hsize_t(1) << 40) / sizeof(T) || n * sizeof(T) > 64 * storage + (1 << 20))
    damaged(path, where + " claims " + std::to_string(n) + " rows, more than its " +
                      std::to_string(storage) + " stored bytes can hold");
  out.resize(n);
  if (n && H5Dread(dset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
    damaged(path, "cannot read " + where);
  validate_rows(out, where, path);
  return out;
}

}  // namespace

OpRecord make_record(const Op& op, int iteration, int64_t start_ns, int64_t end_ns) {
  OpRecord r;
  const std::string name = op_name(op);
  std::memcpy(r.name, name.data(), std::min<size_t>(name.size(), kNameBytes - 1));
  r.kind = uint8_t(op.kind);
  r.stream = uint8_t(op.stream);
  r.microbatch = op.microbatch;
  r.layer = op.layer;
  r.iteration = iteration;
  r.start_ns = start_ns;
  r.end_ns = end_ns;
  r.bytes = op.bytes;
  r.flops = op.flops;
  return r;
}

Writer::Writer(const std::string& path) : path_(path) {
  io::silence_hdf5_errors();
  QuietHdf5 quiet;
  // Room for the digest: a trace larger than 32 GB is hashed in chunks over 64 MiB.
  Handle fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  if (fcpl.id < 0 || H5Pset_userblock(fcpl.id, kDigestBlockBytes) < 0)
    throw std::runtime_error("trace: cannot set up the file creation of " + path);
  io::check_output_path("trace", path);
  tmp_ = io::temporary_path_for(path);
  file_ = H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, fcpl.id, H5P_DEFAULT);
  if (file_ < 0) {
    ::unlink(tmp_.c_str());  // libhdf5 may have created it before failing
    if (io::no_space_left(path)) io::throw_write_error("trace", path, ENOSPC);
    throw InputError("trace: cannot create HDF5 file " + path);
  }
  set_attribute("schema_version", int64_t(kSchemaVersion));
}

Writer::~Writer() {
  if (file_ >= 0) H5Fclose(file_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void Writer::close() {
  if (file_ < 0) return;
  const herr_t e = H5Fclose(file_);
  file_ = -1;
  check(e, "close the file", path_);
  try {
    io::seal_file_digest(MPI_COMM_NULL, tmp_, kDigestBlockBytes);  // and fsyncs it
  } catch (const std::runtime_error&) {
    if (io::no_space_left(path_)) io::throw_write_error("trace", path_, ENOSPC);
    throw;
  }
  // Checked again at the last moment, as OutputFile::commit does: a device node or folder that
  // appeared at the name meanwhile is not replaced.
  io::check_output_path("trace", path_);
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw std::runtime_error("trace " + path_ + ": cannot rename the finished trace into place (" +
                             std::strerror(errno) + ")");
  tmp_.clear();
}

void Writer::set_attribute(const std::string& name, const std::string& value) {
  QuietHdf5 quiet;
  if (H5Aexists(file_, name.c_str()) > 0) H5Adelete(file_, name.c_str());
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(check(H5Acreate2(file_, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT),
                    "create attribute " + name, path_),
              H5Aclose);
  const char* s = value.c_str();
  check(H5Awrite(attr, type, &s), "write attribute", path_);
}

void Writer::set_attribute(const std::string& name, int64_t value) {
  QuietHdf5 quiet;
  if (H5Aexists(file_, name.c_str()) > 0) H5Adelete(file_, name.c_str());
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(
      check(H5Acreate2(file_, name.c_str(), H5T_NATIVE_INT64, space, H5P_DEFAULT, H5P_DEFAULT),
            "create attribute " + name, path_),
      H5Aclose);
  check(H5Awrite(attr, H5T_NATIVE_INT64, &value), "write attribute", path_);
}

void Writer::add_rank_ops(int rank, const std::vector<OpRecord>& ops) {
  Handle t(op_type(), H5Tclose);
  append(file_, rank, "ops", t, ops.data(), ops.size(), path_);
}

void Writer::add_memory_samples(int rank, const std::vector<MemorySample>& samples) {
  Handle t(memory_type(), H5Tclose);
  append(file_, rank, "memory", t, samples.data(), samples.size(), path_);
}

namespace {
// What the Reader reads, as functions of an open file: run in the process on a verified trace,
// in a child process on an unverified one (Reader::read).
bool has_attribute_in(hid_t file, const std::string& name) {
  QuietHdf5 quiet;
  return H5Aexists(file, name.c_str()) > 0;
}

int64_t int_attribute_in(hid_t file, const std::string& name, const std::string& path) {
  QuietHdf5 quiet;
  if (H5Aexists(file, name.c_str()) <= 0) return 0;
  Handle attr(check_read(H5Aopen(file, name.c_str(), H5P_DEFAULT), "open attribute " + name, path),
              H5Aclose);
  require_one_value(attr, name, path);
  Handle ftype(check_read(H5Aget_type(attr), "read the type of attribute " + name, path), H5Tclose);
  if (H5Tget_class(ftype) != H5T_INTEGER) damaged(path, "attribute " + name + " is not an integer");
  int64_t v = 0;
  if (H5Aread(attr, H5T_NATIVE_INT64, &v) < 0) damaged(path, "cannot read attribute " + name);
  return v;
}

std::string attribute_in(hid_t file, const std::string& name, const std::string& path) {
  QuietHdf5 quiet;
  if (H5Aexists(file, name.c_str()) <= 0) return "";
  Handle attr(check_read(H5Aopen(file, name.c_str(), H5P_DEFAULT), "open attribute " + name, path),
              H5Aclose);
  Handle ftype(check_read(H5Aget_type(attr), "read the type of attribute " + name, path), H5Tclose);
  require_one_value(attr, name, path);
  if (H5Tget_class(ftype) != H5T_STRING) return "";
  if (H5Tis_variable_str(ftype) > 0) {
    Handle mtype(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mtype, H5T_VARIABLE);
    H5Tset_cset(mtype, H5Tget_cset(ftype));
    char* s = nullptr;
    if (H5Aread(attr, mtype, &s) < 0) damaged(path, "cannot read attribute " + name);
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  const size_t n = H5Tget_size(ftype);
  if (n == 0 || n > (size_t(1) << 30)) damaged(path, "attribute " + name + " has a bad size");
  std::string out(n, '\0');
  if (H5Aread(attr, ftype, out.data()) < 0) damaged(path, "cannot read attribute " + name);
  out.resize(std::strlen(out.c_str()));
  return out;
}

std::vector<int> ranks_in(hid_t file, const std::string& path) {
  QuietHdf5 quiet;
  Handle grp(check_read(H5Gopen2(file, "ranks", H5P_DEFAULT), "open /ranks", path), H5Gclose);
  struct Names {
    std::vector<int> ranks;
    bool other = false;
  } names;
  const herr_t e = H5Literate(
      grp, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr,
      [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
        auto* n = static_cast<Names*>(data);
        char* end = nullptr;
        errno = 0;
        const long v = std::strtol(name, &end, 10);
        if (*name && end && *end == '\0' && errno == 0 && v >= 0 && v < (1L << 30))
          n->ranks.push_back(int(v));
        else
          n->other = true;
        return 0;
      },
      &names);
  if (e < 0) damaged(path, "cannot list /ranks");
  if (names.other) damaged(path, "/ranks holds an entry that is not a rank number");
  // Every trace writer writes at least one rank: none means the file lost them.
  if (names.ranks.empty()) damaged(path, "/ranks holds no ranks");
  std::sort(names.ranks.begin(), names.ranks.end());
  return names.ranks;
}

// Opens the file and checks that it is a trace of this schema; returns the open file.
hid_t open_trace(const std::string& path) {
  QuietHdf5 quiet;
  io::check_input_file(path, "trace: " + path, "an HDF5 trace");
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw InputError("trace: " + path + " is not an HDF5 file (or cannot be read)");
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) throw InputError("trace: cannot open " + path);
  try {
    if (H5Lexists(file, "ranks", H5P_DEFAULT) <= 0)
      throw InputError("trace: " + path +
                       " has no /ranks group (not a stratagem trace, or damaged)");
    // A file of another schema would be misread field by field: refuse it by name.
    const int64_t version = has_attribute_in(file, "schema_version")
                                ? int_attribute_in(file, "schema_version", path)
                                : -1;
    if (version != kSchemaVersion)
      throw InputError("trace: " + path + ": schema_version " +
                       (version < 0 ? std::string("missing") : std::to_string(version)) +
                       ", this stratagem reads schema_version " + std::to_string(kSchemaVersion));
  } catch (...) {
    H5Fclose(file);
    throw;
  }
  return file;
}

// The bytes a child sends back for each answer.
std::string encode(bool v) {
  return std::string(1, v ? '1' : '0');
}
std::string encode(int64_t v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}
std::string encode(std::string v) {
  return v;
}
template <class T>
std::string encode(const std::vector<T>& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}
template <class T>
T decode(const std::string& bytes) {
  if constexpr (std::is_same_v<T, bool>) {
    return bytes == "1";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return bytes;
  } else if constexpr (std::is_same_v<T, int64_t>) {
    int64_t v = 0;
    std::memcpy(&v, bytes.data(), std::min(bytes.size(), sizeof v));
    return v;
  } else {
    T v(bytes.size() / sizeof(typename T::value_type));
    if (!v.empty())  // an empty vector's data() may be null, which memcpy must not get
      std::memcpy(v.data(), bytes.data(), v.size() * sizeof(typename T::value_type));
    return v;
  }
}
}  // namespace

template <class Body>
auto Reader::read(Body&& body) const {
  if (!unverified_) return body(hid_t(file_));
  using T = decltype(body(hid_t(file_)));
  // libhdf5 may crash or hang on an unverified file: it opens and reads it in a child process
  // only (stratagem/hdf5_guard.hpp), once per question, and this process keeps no handle on it.
  return decode<T>(io::read_isolated(
      path_,
      [&] {
        const hid_t file = open_trace(path_);
        struct Close {
          hid_t id;
          ~Close() { H5Fclose(id); }
        } close{file};
        return encode(body(file));
      },
      &hdf5_budget_s_));
}

Reader::Reader(const std::string& path) : path_(path) {
  io::silence_hdf5_errors();
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw InputError("trace: " + path + " is a directory, expected an HDF5 trace file");
  // The bytes first: libhdf5 itself crashes or hangs on some damaged files. A trace without a
  // digest (written before digests) is opened and read in child processes only.
  const io::DigestVerdict digest = io::verify_file_digest(MPI_COMM_NULL, path);
  if (digest.kind == io::DigestVerdict::failed)
    throw InputError("trace: " + path + ": " + digest.why);
  unverified_ = digest.kind == io::DigestVerdict::absent;
  hdf5_budget_s_ = io::hdf5_read_bound_s(path_);
  if (unverified_)
    read([](hid_t) { return std::string(); });  // the checks of open_trace
  else
    file_ = open_trace(path_);
}

Reader::~Reader() {
  if (file_ >= 0) H5Fclose(file_);
}

bool Reader::has_attribute(const std::string& name) const {
  return read([&](hid_t file) { return has_attribute_in(file, name); });
}

std::string Reader::attribute(const std::string& name) const {
  return read([&](hid_t file) { return attribute_in(file, name, path_); });
}

int64_t Reader::int_attribute(const std::string& name) const {
  return read([&](hid_t file) { return int_attribute_in(file, name, path_); });
}

std::vector<int> Reader::ranks() const {
  return read([&](hid_t file) { return ranks_in(file, path_); });
}

std::vector<OpRecord> Reader::ops(int rank) const {
  return read([&](hid_t file) {
    Handle t(op_type(), H5Tclose);
    return read_table<OpRecord>(file, rank, "ops", t, path_);
  });
}

std::vector<MemorySample> Reader::memory(int rank) const {
  return read([&](hid_t file) {
    Handle t(memory_type(), H5Tclose);
    return read_table<MemorySample>(file, rank, "memory", t, path_);
  });
}

}  // namespace stratagem::trace
