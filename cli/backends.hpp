// The CLI's side of the backend registry: the commands read cpkv::backends::registry() (register_all:
// sim, cuda where this build has it, model, torch), and this file makes the cpkv command link the
// cuda entry and writes `--backend`'s help from it. A request's refusal (harness::RequestError, from
// its check or a verb's before any work) is the CLI's one-line bad-input error (exit 2), the option
// spelled as on the command line: cli/main.cpp says it.
#pragma once

#include <string>

#include "cpkv/backends/register_all.hpp"
#include "cpkv/harness/request.hpp"

namespace cpkv::cli {

// "sim (...), cuda (...) or model (...)": the --backend help text, from the registry.
std::string backends_help();

}  // namespace cpkv::cli
