#include "stratagem/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

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

// Selects a piece's box in a dataset of `ndims` dimensions.
void select_box(hid_t space, int ndims, const CheckpointPiece& p) {
  hsize_t start[2] = {hsize_t(p.row), hsize_t(p.col)},
          count[2] = {hsize_t(p.rows), hsize_t(p.cols)};
  STRATAGEM_H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr));
  (void)ndims;
}
// The piece in memory: `rows` rows of `ld` floats, of which columns [0, cols) are the box.
H5Handle memory_space(const CheckpointPiece& p, int ndims) {
  if (ndims == 1) {
    hsize_t n = hsize_t(p.rows);
    return H5Handle(STRATAGEM_H5_CHECK(H5Screate_simple(1, &n, nullptr)), H5Sclose);
  }
  hsize_t dims[2] = {hsize_t(p.rows), hsize_t(p.ld)};
  H5Handle space(STRATAGEM_H5_CHECK(H5Screate_simple(2, dims, nullptr)), H5Sclose);
  hsize_t start[2] = {0, 0}, count[2] = {hsize_t(p.rows), hsize_t(p.cols)};
  STRATAGEM_H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr));
  return space;
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
                     const std::vector<CheckpointPiece>& pieces, int keep) {
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
    STRATAGEM_H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_INDEPENDENT));
    // Test hook: hold the half-written file open so a test can kill a rank mid-write.
    if (const char* d = std::getenv("STRATAGEM_TEST_CKPT_DELAY_S")) ::sleep(std::atoi(d));
    // Datasets are created collectively (same list on every rank), then each rank writes its
    // own boxes independently.
    std::map<std::string, std::pair<H5Handle, int>> open;
    for (const auto& t : tensors) {
      const auto slash = t.dataset.rfind('/');
      if (slash != std::string::npos) io::ensure_groups(file, t.dataset.substr(0, slash));
      std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
      H5Handle fspace(STRATAGEM_H5_CHECK(H5Screate_simple((int)dims.size(), dims.data(), nullptr)),
                      H5Sclose);
      H5Handle ds(STRATAGEM_H5_CHECK(H5Dcreate2(file, t.dataset.c_str(), H5T_IEEE_F32LE, fspace,
                                                H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
                  H5Dclose);
      open.emplace(t.dataset, std::make_pair(std::move(ds), (int)dims.size()));
    }
    for (const auto& p : pieces) {
      auto it = open.find(p.dataset);
      if (it == open.end()) throw std::logic_error("checkpoint: no dataset " + p.dataset);
      if (p.rows <= 0 || p.cols <= 0) continue;
      const int nd = it->second.second;
      H5Handle fspace(STRATAGEM_H5_CHECK(H5Dget_space(it->second.first)), H5Sclose);
      select_box(fspace, nd, p);
      H5Handle mspace = memory_space(p, nd);
      STRATAGEM_H5_CHECK(
          H5Dwrite(it->second.first, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, p.data));
    }
    open.clear();
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
                     const std::vector<CheckpointPiece>& pieces) {
  io::H5Quiet quiet;
  H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!f.valid()) throw InputError(path + ": cannot open checkpoint (truncated or not HDF5)");
  std::map<std::string, std::pair<H5Handle, int>> open;
  for (const auto& t : tensors) {
    H5Handle ds(H5Dopen2(f, t.dataset.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.valid())
      throw InputError(path + ": checkpoint has no dataset '" + t.dataset + "' (different model?)");
    H5Handle fspace(STRATAGEM_H5_CHECK(H5Dget_space(ds)), H5Sclose);
    std::vector<hsize_t> dims(t.shape.size());
    if (H5Sget_simple_extent_ndims(fspace) != (int)dims.size() ||
        H5Sget_simple_extent_dims(fspace, dims.data(), nullptr) < 0 ||
        !std::equal(dims.begin(), dims.end(), t.shape.begin(),
                    [](hsize_t x, int64_t y) { return int64_t(x) == y; }))
      throw InputError(path + ": dataset '" + t.dataset +
                       "' has a different shape than the model's (different model?)");
    open.emplace(t.dataset, std::make_pair(std::move(ds), (int)dims.size()));
  }
  for (const auto& p : pieces) {
    auto it = open.find(p.dataset);
    if (it == open.end()) throw std::logic_error("checkpoint: no dataset " + p.dataset);
    if (p.rows <= 0 || p.cols <= 0) continue;
    const int nd = it->second.second;
    H5Handle fspace(STRATAGEM_H5_CHECK(H5Dget_space(it->second.first)), H5Sclose);
    select_box(fspace, nd, p);
    H5Handle mspace = memory_space(p, nd);
    if (H5Dread(it->second.first, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, p.data) < 0)
      throw InputError(path + ": cannot read dataset '" + p.dataset + "' (truncated file?)");
  }
}

}  // namespace stratagem
