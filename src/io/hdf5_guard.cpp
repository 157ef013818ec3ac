// The guard around libhdf5 calls on unverified files (see hdf5_guard.hpp).
#include "src/io/hdf5_guard.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "stratagem/error.hpp"
#include "stratagem/watchdog.hpp"

namespace stratagem::io {

namespace {
constexpr double kDefaultBoundS = 300;
constexpr double kFreeBytes = 1e9;          // read within the base bound
constexpr double kSlowestBytesPerS = 10e6;  // beyond it, a slow file system

double base_bound_s() {
  const char* env = std::getenv("STRATAGEM_HDF5_TIMEOUT_S");
  if (!env || !*env) return kDefaultBoundS;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(env, &end);
  // A value that is not a number is ignored rather than turning the guard off.
  if (errno || end == env || *end || !std::isfinite(v) || v < 0) return kDefaultBoundS;
  return v;
}
}  // namespace

double hdf5_read_bound_s(const std::string& path) {
  const double base = base_bound_s();
  if (base <= 0) return 0;
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  if (ec || double(bytes) <= kFreeBytes) return base;
  return base + (double(bytes) - kFreeBytes) / kSlowestBytesPerS;
}

Hdf5Guard::Hdf5Guard(const std::string& path, bool armed, double bound_s) {
  if (!armed) return;
  if (bound_s < 0) bound_s = hdf5_read_bound_s(path);
  if (bound_s <= 0) return;
  char within[32];
  std::snprintf(within, sizeof within, "%g", bound_s);
  scope_ = std::make_unique<WatchdogScope>(WatchdogBound{
      bound_s,
      path + ": libhdf5 did not finish reading it within " + within + " s; the file is damaged",
      kExitBadInput});
}

Hdf5Guard::~Hdf5Guard() = default;

}  // namespace stratagem::io
