// The one rule for the files a command reads: a regular file, its size checked before a byte is
// read. A directory fails deep inside the stream library, and a FIFO or device (/dev/zero) never
// ends: neither may reach a reader.
#pragma once
#include <cstdint>
#include <string>

namespace stratagem::io {

// Throws InputError unless `path` is a regular file (symbolic links followed); returns its size.
// `label` begins every message (e.g. "--args-file job.txt"); `expected` says what the file should
// be (e.g. "an arguments file").
uint64_t check_input_file(const std::string& path, const std::string& label,
                          const std::string& expected);

// The whole of a regular file of at most `max_bytes`, checked as above before reading and again
// after (a file may grow while it is read).
std::string read_input_file(const std::string& path, uint64_t max_bytes, const std::string& label,
                            const std::string& expected);

// "64 MiB", "1 KiB", "100 bytes": a size limit as a message states it.
std::string size_text(uint64_t bytes);

}  // namespace stratagem::io
