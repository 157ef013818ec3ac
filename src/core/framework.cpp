#include "stratagem/framework.hpp"

#include "stratagem/model.hpp"

namespace stratagem {

const char* to_string(AttentionKernel k) {
  return k == AttentionKernel::flash1 ? "flash1" : "flash";
}

}  // namespace stratagem
