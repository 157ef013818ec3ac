// Which CUDA devices this process can see (0 when the driver or a GPU is absent).
#pragma once
#include <string>

namespace stratagem::cuda {
int device_count();
std::string runtime_version();
}  // namespace stratagem::cuda
