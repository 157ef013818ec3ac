// The checkpoint loader as `stratagem train --resume` runs it, on one rank: the input is the
// only checkpoint of a folder (step-00000001.h5); find_resumable_checkpoint reads its metadata,
// checks the model, and verifies every dataset (shape, checksum, finite values); a checkpoint
// that passes is then read into full-size buffers by load_checkpoint. The model is the seed
// corpus's (corpus/checkpoint_h5/, written by `stratagem train --layers 1 --hidden 8 --heads 2
// --vocab 32 --seq-len 4 --steps 1 --ckpt-every 1`). A damaged checkpoint must be skipped with
// a one-line reason, or refused with an InputError; nothing else.
//
// A checkpoint's bytes are checked against the digest in its user block before libhdf5 opens
// it (src/io/file_digest.hpp), so a mutated file almost never gets past that check, and a
// target that stopped there would no longer test the HDF5 parsing behind it. Each input is
// therefore run twice: as it is (the digest check, on any bytes), then resealed (the digest
// rewritten for the input's bytes, its first 4 KiB taken as the user block), which takes it
// through the digest to the metadata, the datasets and their checksums, as before. The corpus
// files have a 4 KiB user block (as stratagem writes small checkpoints).
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "src/cli/args.hpp"
#include "src/io/file_digest.hpp"
#include "stratagem/checkpoint.hpp"
#include "stratagem/spec_json.hpp"
#include "stratagem/trainer.hpp"
#include "test/fuzz/harness.hpp"

namespace {
using namespace stratagem;

struct Target {
  ModelSpec model;
  nlohmann::json model_json;
  std::vector<CheckpointTensor> tensors;
  std::vector<std::vector<float>> buffers;
  std::vector<CheckpointPiece> pieces;  // each tensor whole
  std::string dir;
};

Target& target() {
  static Target* t = [] {
    auto* t = new Target;
    cli::Args a("stratagem train", {"--layers", "1", "--hidden", "8", "--heads", "2", "--vocab",
                                    "32", "--seq-len", "4"});
    t->model = cli::model_from_args(a);
    t->model_json = to_json(t->model);
    t->tensors = checkpoint_tensors(t->model);
    t->buffers.reserve(t->tensors.size());
    for (const auto& c : t->tensors) {
      t->buffers.emplace_back(size_t(c.numel()));
      CheckpointPiece p;
      p.dataset = c.dataset;
      p.rows = c.shape[0];
      p.cols = c.shape.size() == 2 ? c.shape[1] : 1;
      p.ld = p.cols;
      p.data = t->buffers.back().data();
      t->pieces.push_back(p);
    }
    const char* tmp = std::getenv("TMPDIR");
    t->dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/stratagem-fuzz-ckpt-" +
             std::to_string(::getpid());
    if (::mkdir(t->dir.c_str(), 0755) != 0 && errno != EEXIST) std::abort();
    return t;
  }();
  return *t;
}

void resume(Target& t) {
  fuzz::expect_input_errors([&] {
    std::string skipped;
    const auto found =
        find_resumable_checkpoint(MPI_COMM_WORLD, t.dir, t.tensors, t.model_json, &skipped);
    if (!skipped.empty()) fuzz::check_message(skipped.c_str());
    if (!found) return;
    load_checkpoint(found->path, t.tensors, t.pieces);
  });
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr size_t kBlockBytes = 4096;
  static const uint8_t kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  Target& t = target();
  const std::string path = t.dir + "/" + checkpoint_name(1);
  fuzz::write_file(path, data, size);
  resume(t);
  // Resealed (not a file that starts with a superblock: it has no user block to write into).
  if (size >= kBlockBytes && std::memcmp(data, kHdf5Signature, 8) != 0) {
    fuzz::write_file(path, data, size);
    io::seal_file_digest(MPI_COMM_NULL, path, kBlockBytes, 0, /*durable=*/false);
    resume(t);
  }
  // Every HDF5 handle the loader opened is closed again, on every path (a leaked file would
  // be shared by the next open of the same name, stale cache and all).
  if (const ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL); open != 0) {
    std::fprintf(stderr, "fuzz: %zd HDF5 objects left open\n", open);
    std::abort();
  }
  return 0;
}
