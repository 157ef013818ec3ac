// The files of a checkpoint folder, shared by the writer and reader (checkpoint.cpp) and the
// folder's keeper (checkpoint_folder.cpp: the lock, listing, cleaning).
#pragma once
#include <string>

namespace stratagem::io {

// "step-<digits>.h5" (complete) or "step-<digits>.h5.tmp" (half-written).
enum class CkptFile { other, complete, partial };
CkptFile classify_checkpoint_file(const std::string& file_name);
// Whether the checkpoint at `a` is of an earlier step than the one at `b` (paths or names of
// complete checkpoints): the integers of their names, whatever their count of digits, so that
// step-100000000.h5 comes after step-99999999.h5 (file-name order puts it first).
bool checkpoint_step_before(const std::string& a, const std::string& b);
// Makes a rename or removal in `dir` durable.
void fsync_dir(const std::string& dir);

}  // namespace stratagem::io
