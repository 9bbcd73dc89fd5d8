// Checks shared by the fuzz targets (fuzz/README.md): what every refusal must look like, and a
// way to stop the fuzzer with a message when a check fails. A failed check calls std::abort(),
// which libFuzzer reports as a crash and saves the input under its artifact prefix.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cpkv/traces/trace.hpp"

namespace cpkv::fuzz {

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "cpkv fuzz check failed: %s\n", what.substr(0, 2000).c_str());
  std::abort();
}

// Every refusal is one short line: no line break, field and reason within their caps, and the
// message is exactly FILE:LINE: FIELD: REASON.
inline void check_refusal(const traces::TraceError& error) {
  const std::string message = error.what();
  if (message.find('\n') != std::string::npos || message.find('\r') != std::string::npos) fail("error is not one line: " + message);
  if (error.field().size() > traces::limits::error_field_bytes + 24) fail("field too long: " + message);
  if (error.reason().size() > traces::limits::error_reason_bytes + 24) fail("reason too long: " + message);
  const std::string expected = error.file() + ":" + std::to_string(error.line()) + ": " + error.field() + ": " + error.reason();
  if (message != expected) fail("error is not FILE:LINE: FIELD: REASON: " + message);
}

}  // namespace cpkv::fuzz
