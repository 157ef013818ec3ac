#include "stratagem/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "src/io/hdf5_util.hpp"
#include "stratagem/error.hpp"

namespace stratagem {

namespace fs = std::filesystem;
using io::H5Handle;

int64_t CheckpointTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string checkpoint_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "step-%08lld.h5", static_cast<long long>(step));
  return buf;
}

namespace {
constexpr int64_t kFormatVersion = 1;

// Selects the row-major element range [a, b) of a tensor of `shape` in `space`: at most three
// hyperslabs (partial first row, whole rows, partial last row).
void select_range(hid_t space, const std::vector<int64_t>& shape, int64_t a, int64_t b) {
  if (a >= b) {
    STRATAGEM_H5_CHECK(H5Sselect_none(space));
    return;
  }
  if (shape.size() <= 1) {
    hsize_t start[1] = {hsize_t(a)}, count[1] = {hsize_t(b - a)};
    STRATAGEM_H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr));
    return;
  }
  // Collapse to 2-D (rows, cols) over the last dimension.
  const int64_t cols = shape.back();
  const int nd = static_cast<int>(shape.size());
  bool first = true;
  auto slab = [&](int64_t row0, int64_t nrows, int64_t c0, int64_t c1) {
    if (nrows <= 0 || c1 <= c0) return;
    std::vector<hsize_t> start(nd, 0), count(nd, 1);
    int64_t r = row0;
    for (int d = nd - 2; d >= 0; --d) {
      start[d] = hsize_t(r % shape[d]);
      r /= shape[d];
    }
    count[nd - 2] = hsize_t(nrows);
    start[nd - 1] = hsize_t(c0);
    count[nd - 1] = hsize_t(c1 - c0);
    STRATAGEM_H5_CHECK(H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR,
                                           start.data(), nullptr, count.data(), nullptr));
    first = false;
  };
  if (nd > 2)
    throw std::logic_error("checkpoint: tensors of more than 2 dimensions are not supported");
  const int64_t r0 = a / cols, c0 = a % cols;
  const int64_t r1 = (b - 1) / cols, c1 = (b - 1) % cols + 1;
  if (r0 == r1) {
    slab(r0, 1, c0, c1);
    return;
  }
  int64_t full_begin = r0, full_end = r1 + 1;
  if (c0 > 0) slab(r0, 1, c0, cols), full_begin = r0 + 1;
  if (c1 < cols) full_end = r1;
  slab(full_begin, full_end - full_begin, 0, cols);
  if (c1 < cols) slab(r1, 1, 0, c1);
}

// "step-<digits>.h5" (complete) or "step-<digits>.h5.tmp" (half-written).
enum class CkptFile { other, complete, partial };
CkptFile classify(const std::string& f) {
  if (f.rfind("step-", 0) != 0) return CkptFile::other;
  size_t i = 5;
  while (i < f.size() && std::isdigit(static_cast<unsigned char>(f[i]))) ++i;
  if (i == 5) return CkptFile::other;
  const std::string rest = f.substr(i);
  if (rest == ".h5") return CkptFile::complete;
  if (rest == ".h5.tmp") return CkptFile::partial;
  return CkptFile::other;
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}
}  // namespace

void save_checkpoint(MPI_Comm comm, const std::string& dir, const CheckpointMeta& meta,
                     const std::vector<CheckpointTensor>& tensors,
                     const std::vector<CheckpointBuffer>& buffers, int keep) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw InputError("--ckpt-dir " + dir + ": cannot create (" + ec.message() + ")");
  }
  MPI_Barrier(comm);
  const std::string final_path = (fs::path(dir) / checkpoint_name(meta.step)).string();
  const std::string tmp_path = final_path + ".tmp";
  {
    H5Handle fapl(STRATAGEM_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
    STRATAGEM_H5_CHECK(H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL));
    H5Handle file(H5Fcreate(tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), H5Fclose);
    if (!file.valid()) throw InputError("--ckpt-dir " + dir + ": cannot create " + tmp_path);
    H5Handle dxpl(STRATAGEM_H5_CHECK(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
    STRATAGEM_H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
    // Test hook: hold the half-written file open so a test can kill a rank mid-write.
    if (const char* d = std::getenv("STRATAGEM_TEST_CKPT_DELAY_S")) ::sleep(std::atoi(d));
    for (const auto& buf : buffers) {
      io::ensure_groups(file, buf.group);
      for (const auto& t : tensors) {
        std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
        H5Handle fspace(
            STRATAGEM_H5_CHECK(H5Screate_simple((int)dims.size(), dims.data(), nullptr)), H5Sclose);
        const std::string name = buf.group + "/" + t.name;
        H5Handle ds(STRATAGEM_H5_CHECK(H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, fspace,
                                                  H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
                    H5Dclose);
        // This rank's part of the tensor: the overlap of [begin,end) with the tensor's range.
        const int64_t a = std::max(buf.begin, t.offset),
                      b = std::min(buf.end, t.offset + t.numel());
        select_range(fspace, t.shape, a - t.offset, std::max(a, b) - t.offset);
        hsize_t n = hsize_t(std::max<int64_t>(0, b - a));
        H5Handle mspace(STRATAGEM_H5_CHECK(H5Screate_simple(1, &n, nullptr)), H5Sclose);
        if (n == 0) STRATAGEM_H5_CHECK(H5Sselect_none(mspace));
        const float* src = n ? buf.data + (a - buf.begin) : nullptr;
        STRATAGEM_H5_CHECK(H5Dwrite(ds, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, src));
      }
    }
    io::write_int64_attr(file, "format_version", kFormatVersion);
    io::write_int64_attr(file, "step", meta.step);
    io::write_int64_attr(file, "seed", static_cast<int64_t>(meta.seed));
    io::write_int64_attr(file, "data_position", meta.data_position);
    io::write_string_attr(file, "model", meta.model.dump());
    io::write_string_attr(file, "plan", meta.plan.dump());
    io::write_string_attr(file, "layout", meta.layout.dump());
    io::write_string_attr(file, "extra", meta.extra.dump());
    // Written last: a file without it was cut short.
    io::write_int64_attr(file, "complete", 1);
  }
  MPI_Barrier(comm);
  if (rank == 0) {
    if (std::rename(tmp_path.c_str(), final_path.c_str()) != 0)
      throw std::runtime_error("checkpoint: rename " + tmp_path + " -> " + final_path + " failed");
    fsync_dir(dir);
    // Keep the newest `keep` complete checkpoints.
    std::vector<std::string> all;
    for (const auto& e : fs::directory_iterator(dir))
      if (classify(e.path().filename().string()) == CkptFile::complete)
        all.push_back(e.path().string());
    std::sort(all.begin(), all.end());
    for (size_t i = 0; keep > 0 && i + keep < all.size(); ++i) fs::remove(all[i]);
  }
  MPI_Barrier(comm);
}

std::optional<std::string> newest_checkpoint(const std::string& dir, bool warn) {
  if (!fs::is_directory(dir)) return std::nullopt;
  std::vector<std::string> done;
  for (const auto& e : fs::directory_iterator(dir)) {
    const CkptFile kind = classify(e.path().filename().string());
    if (kind == CkptFile::complete)
      done.push_back(e.path().string());
    else if (warn && kind == CkptFile::partial)
      std::fprintf(stderr, "stratagem: warning: ignoring half-written checkpoint %s\n",
                   e.path().c_str());
  }
  std::sort(done.rbegin(), done.rend());
  io::H5Quiet quiet;
  for (const auto& p : done) {
    H5Handle f(H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (f.valid() && io::has_attr(f, "complete")) return p;
    if (warn)
      std::fprintf(stderr, "stratagem: warning: ignoring unreadable checkpoint %s\n", p.c_str());
  }
  return std::nullopt;
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  io::H5Quiet quiet;
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!f.valid()) throw InputError(path + ": cannot open checkpoint (truncated or not HDF5)");
  if (!io::has_attr(f, "complete")) throw InputError(path + ": incomplete checkpoint");
  CheckpointMeta m;
  try {
    m.step = io::read_int64_attr(f, "step");
    m.seed = static_cast<uint64_t>(io::read_int64_attr(f, "seed"));
    m.data_position = io::read_int64_attr(f, "data_position");
    m.model = nlohmann::json::parse(io::read_string_attr(f, "model"));
    m.plan = nlohmann::json::parse(io::read_string_attr(f, "plan"));
    m.layout = nlohmann::json::parse(io::read_string_attr(f, "layout"));
    m.extra = nlohmann::json::parse(io::read_string_attr(f, "extra"));
  } catch (const std::exception& e) {
    throw InputError(path + ": checkpoint metadata unreadable (" + e.what() + ")");
  }
  return m;
}

void load_checkpoint(const std::string& path, const std::vector<CheckpointTensor>& tensors,
                     const std::vector<CheckpointBuffer>& buffers) {
  io::H5Quiet quiet;
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!f.valid()) throw InputError(path + ": cannot open checkpoint (truncated or not HDF5)");
  for (const auto& buf : buffers) {
    for (const auto& t : tensors) {
      const std::string name = buf.group + "/" + t.name;
      H5Handle ds(H5Dopen2(f, name.c_str(), H5P_DEFAULT), H5Dclose);
      if (!ds.valid())
        throw InputError(path + ": checkpoint has no dataset '" + name + "' (different model?)");
      H5Handle fspace(STRATAGEM_H5_CHECK(H5Dget_space(ds)), H5Sclose);
      std::vector<hsize_t> dims(t.shape.size());
      if (H5Sget_simple_extent_ndims(fspace) != (int)dims.size() ||
          H5Sget_simple_extent_dims(fspace, dims.data(), nullptr) < 0 ||
          !std::equal(dims.begin(), dims.end(), t.shape.begin(),
                      [](hsize_t x, int64_t y) { return int64_t(x) == y; }))
        throw InputError(path + ": dataset '" + name + "' has a different shape than the model's");
      const int64_t a = std::max(buf.begin, t.offset), b = std::min(buf.end, t.offset + t.numel());
      if (a >= b) continue;
      select_range(fspace, t.shape, a - t.offset, b - t.offset);
      hsize_t n = hsize_t(b - a);
      H5Handle mspace(STRATAGEM_H5_CHECK(H5Screate_simple(1, &n, nullptr)), H5Sclose);
      if (H5Dread(ds, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, buf.data + (a - buf.begin)) <
          0)
        throw InputError(path + ": cannot read dataset '" + name + "' (truncated file?)");
    }
  }
}

}  // namespace stratagem
