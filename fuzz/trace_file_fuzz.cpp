// Fuzz target: the input is a whole batch-trace file (header line, then batch lines).
#include <cstddef>
#include <cstdint>
#include <string>

#include "trace_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  cpkv::fuzz::read_trace(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
