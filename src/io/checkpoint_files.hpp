// The files of a checkpoint folder, shared by the writer and reader (checkpoint.cpp) and the
// folder's keeper (checkpoint_folder.cpp: the lock, listing, cleaning).
#pragma once
#include <string>

namespace stratagem::io {

// "step-<digits>.h5" (complete) or "step-<digits>.h5.tmp" (half-written).
enum class CkptFile { other, complete, partial };
CkptFile classify_checkpoint_file(const std::string& file_name);
// Makes a rename or removal in `dir` durable.
void fsync_dir(const std::string& dir);

}  // namespace stratagem::io
