/* Stand-ins for libstratagem_cuda.so that the binary must refuse, each with its one line
 * (test_cuda_plugin.cpp). Built in every build, with or without the CUDA toolkit:
 *  - FAKE_OTHER_BUILD: a plugin of this ABI built from other headers (another interface hash);
 *  - FAKE_UNRESOLVED: a plugin that needs a symbol no library has, as a plugin whose CUDA
 *    library is missing fails under dlopen(RTLD_NOW). */
#include "src/runtime/cuda/plugin_abi.h"

#if defined(FAKE_UNRESOLVED)
void stratagem_fake_missing_symbol(void);
#endif

const StratagemCudaPlugin* stratagem_cuda_plugin(void) {
  static StratagemCudaPlugin plugin;
  plugin.abi = STRATAGEM_CUDA_PLUGIN_ABI;
  plugin.interface = "0000000000000000";
  plugin.stratagem_version = "0.0.0";
#if defined(FAKE_UNRESOLVED)
  stratagem_fake_missing_symbol();
#endif
  return &plugin;
}
