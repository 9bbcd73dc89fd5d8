#include "backends.hpp"

#include <fmt/format.h>

#include "commands.hpp"
#include "options.hpp"
#if CPKV_HAVE_CUDA_BACKEND
#include "cuda_backend.hpp"
#endif

namespace cpkv::cli {

static_assert(option_limits::wait_ms_max == harness::request_limits::wait_ms_max, "the CLI and the request bound waits alike");

#if CPKV_HAVE_CUDA_BACKEND
// The cpkv command links the GPU backend, so register_all's weak reference finds the cuda entry.
[[maybe_unused]] static void (*const kLinksCuda)(harness::Registry&) = &cuda::register_backend;
#endif

std::string backends_help() {
  std::string text;
  const auto& entries = cpkv::backends::registry().entries();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == entries.size() ? " or " : "; ") + entries[i].name + " (" + entries[i].summary + ")";
  }
  return text;
}

void add_knob_options(CLI::App* cmd, harness::ReplayRequest& request) {
  cmd->add_option("--exchange-load-ms-max", request.exchange_load_ms_max,
                  fmt::format("cuda: the bound on loading an --exchange plugin in its probe child (default: CPKV_EXCHANGE_LOAD_MS, else {})", harness::kLoadMsMax))
      ->check(whole_in<std::int64_t>(1, harness::request_limits::exchange_load_ms_max));
  cmd->add_option("--pool-memory", request.pool_memory,
                  "cuda: 'sparse' pools (address space reserved, only referenced pages backed; the default) or 'dense' (every slab allocated "
                  "whole); default: CPKV_POOL_MEMORY, else sparse")
      ->check(CLI::IsMember({"sparse", "dense"}));
  cmd->add_option("--compose-blocks-per-sm", request.compose_blocks_per_sm,
                  "cuda: the compose grid's cap in blocks per SM, under the occupancy (default: CPKV_COMPOSE_BLOCKS_PER_SM, else the kernels' own)")
      ->check(whole_in<std::int32_t>(1, harness::request_limits::compose_blocks_per_sm_max));
}

}  // namespace cpkv::cli
