// Files are written to a temporary name and renamed into place, so that a crash or an error
// never leaves a half-written file where a complete one is expected.
#pragma once
#include <string>

namespace stratagem::io {

// As io::write_output (stratagem/output_file.hpp): regular files only, every write checked.
void write_file_atomic(const std::string& path, const std::string& contents);
// "<dir>/.<name>.tmp.<pid>" beside the target, on the same filesystem so rename is atomic.
std::string temporary_path_for(const std::string& path);

}  // namespace stratagem::io
