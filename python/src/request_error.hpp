// The one translation of the harness's request errors into the package's InputError, for the
// binding files that run the request check (sim_bindings.cpp, request_bindings.cpp).
#pragma once

#include <utility>

#include "bindings.hpp"
#include "cpkv/harness/request.hpp"

namespace cpkv::python {

// A harness::RequestError raised by `function` as InputError, the option named by its Python
// parameter (cpkv.replay's keywords) or, for a command's options (`python3 -m cpkv.conformance`), as
// the command lines spell it ("--wait-ms-max").
enum class OptionNames { python, command_line };
template <typename Function>
auto as_input_error(Function&& function, OptionNames names = OptionNames::python) {
  try {
    return function();
  } catch (const harness::RequestError& e) {
    throw InputError(names == OptionNames::python ? e.option() : e.cli_option(), e.reason());
  }
}

}  // namespace cpkv::python
