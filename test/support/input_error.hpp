// The message of the InputError that `f` throws, or "" when it throws none; any other exception
// goes on to the test framework (it is a failure, not bad input).
#pragma once
#include <string>

#include "stratagem/error.hpp"

namespace stratagem::test {

template <class F>
std::string input_error(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace stratagem::test
