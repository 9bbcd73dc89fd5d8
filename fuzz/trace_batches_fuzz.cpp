// Fuzz target: the input is the batch lines of a trace whose header is fixed and valid (that of
// traces/samples/tiny.jsonl, with the largest pool, so the page ids of every sample fit), so every
// input reaches the batch-line readers.
#include <cstddef>
#include <cstdint>
#include <string>

#include "trace_fuzz.hpp"

namespace {
constexpr const char* kHeader =
    R"({"format":"cpkv-batch-trace","version":1,"cp":2,"page_size":4,"buffer_kinds":["kv_fp8","indexer_k"],)"
    R"("layers":{"count":2,"pattern":"FS"},"pool_pages":2147483647,"split":"zigzag",)"
    R"("caps":{"max_total_extend_tokens":16,"max_batch_requests":2,"staging_mib":null},"source":{"kind":"fuzz"}})"
    "\n";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  cpkv::fuzz::read_trace(kHeader + std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
