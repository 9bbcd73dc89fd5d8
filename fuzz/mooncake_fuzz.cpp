// Fuzz target: the input is a Mooncake request log, imported the way `cpkv import mooncake` does
// (reader, prefix cache, page allocator, scheduler, TraceWriter) under a small pool, so chunking,
// eviction and page reuse are reached within a few requests. Checks: every refusal is a short
// located line; the only other failure is the documented "pool cannot hold" one; the scheduler's
// own assertions hold; and every written trace reads back through TraceReader, batch for batch.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpkv/traces/mooncake.hpp"
#include "cpkv/traces/trace.hpp"
#include "fuzz_checks.hpp"
#include "trace_fuzz.hpp"

namespace {

namespace mc = cpkv::traces::mooncake;

mc::ImportOptions small_import(bool capacity_mode) {
  mc::ImportOptions options;
  cpkv::model::Setting& s = options.setting;
  s.cp = 2;
  s.page_size = 64;
  s.kinds = {*cpkv::model::find_buffer_kind("kv_fp8")};
  s.layer_pattern = "F";
  s.pool_pages = 1024;  // 65,536 tokens: the sample's 40K-token requests fit, two of them do not
  s.caps.max_total_extend_tokens = 4096;
  s.caps.max_batch_requests = 8;
  options.block_tokens = 512;  // Mooncake's block, as in traces/data/mooncake
  if (capacity_mode) {
    options.cache_mode = mc::CacheMode::capacity;
    options.cache_capacity_pages = 128;
  }
  return options;
}

void import(const std::string& log, bool skip_bad) {
  const mc::ImportOptions options = small_import(skip_bad);
  mc::MooncakeReader reader(std::make_unique<std::istringstream>(log), "fuzz.jsonl", options.block_tokens, skip_bad);
  cpkv::traces::TraceHeader header;
  header.setting = options.setting;
  std::ostringstream written;
  cpkv::traces::TraceWriter writer(written, header);
  std::vector<cpkv::model::Batch> batches;
  try {
    mc::import_mooncake(reader, options, [&](const cpkv::model::Batch& batch) {
      writer.write(batch);  // throws std::invalid_argument (uncaught: a finding) on a batch the reader would refuse
      batches.push_back(batch);
    });
  } catch (const cpkv::traces::TraceError& error) {
    cpkv::fuzz::check_refusal(error);
  } catch (const std::runtime_error& error) {
    if (std::string(error.what()).find("cannot hold its next chunk") == std::string::npos) throw;
  }
  if (skip_bad && !reader.first_skip_reason().empty() && reader.first_skip_reason().find('\n') != std::string::npos) {
    cpkv::fuzz::fail("skip reason is not one line");
  }
  cpkv::traces::TraceReader again(std::make_unique<std::istringstream>(written.str()), "import.jsonl");
  for (const cpkv::model::Batch& batch : batches) {
    const std::optional<cpkv::model::Batch> read = again.next();
    if (!read || !cpkv::fuzz::same_batch(*read, batch)) cpkv::fuzz::fail("an imported batch reads back differently");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string log(reinterpret_cast<const char*>(data), size);
  import(log, /*skip_bad=*/false);
  import(log, /*skip_bad=*/true);
  return 0;
}
