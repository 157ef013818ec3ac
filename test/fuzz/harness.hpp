// What every fuzz target shares: MPI initialized once (parallel HDF5 calls into MPI), input
// written to a private file for the readers that take a path, and the bad-input contract.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "stratagem/error.hpp"

namespace stratagem::fuzz {

// A file of this process holding `data` (the readers under test take paths).
std::string write_input(const uint8_t* data, size_t size, const char* suffix);
// Writes `data` to `path` (replacing it).
void write_file(const std::string& path, const uint8_t* data, size_t size);

// The contract for an InputError: one line that is not an echo of megabytes of input.
// Anything else aborts, which libFuzzer reports as a crash with the input that caused it.
void check_message(const char* what);

// Runs `body`: an InputError is the expected answer to bad input (checked for one short line);
// any other exception escapes to libFuzzer as a crash (bad input must exit 2, not 1).
template <class Body>
void expect_input_errors(Body&& body) {
  try {
    body();
  } catch (const InputError& e) {
    check_message(e.what());
  }
}

}  // namespace stratagem::fuzz
