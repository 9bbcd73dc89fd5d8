// The torch backend: a foreign PyTorch exchange (--impl module:Class) under the conformance harness.
// Its ranks are Python processes (torch.distributed: gloo on CPU, NCCL and CUDA IPC on GPU), so its
// run is Python's: the entry's verb is the handoff, the arguments of `python3 -m cpkv.conformance`
// for the checked request, which a front end runs (the cpkv command through the configured
// interpreter; the Python package in process, cpkv.replay(backend="torch")).
#include <algorithm>

#include <fmt/format.h>

#include "cpkv/backends/register_all.hpp"

namespace cpkv::backends {
namespace {

void check_torch_request(harness::CheckedRequest& c) {
  const harness::ReplayRequest& r = c.request;
  if (!r.impl) throw harness::RequestError("impl", fmt::format("required by --backend {}: the exchange class to run, module:Class", c.backend->name));
  if (r.variant != "all") {
    throw harness::RequestError("variant", fmt::format("--backend {} runs the --impl class, which is its own variant: give none", c.backend->name));
  }
  // The run header's line of this backend's own configuration (the harness's delays are Python's: its next line).
  c.backend_line = fmt::format("torch: impl {} | device {}{}", *r.impl, r.device.value_or("cpu"), r.ranks ? fmt::format(" | ranks {}", *r.ranks) : "");
}

// `python3 -m cpkv.conformance`'s arguments for the request: every option it gave, the layers as
// every backend runs them (the request's, at most the source's) and the ranks (default: the cp).
std::vector<std::string> conformance_arguments(const harness::CheckedRequest& c, const harness::BatchSource& source) {
  const harness::ReplayRequest& r = c.request;
  const std::int32_t layer_count = source.setting.layer_count();
  std::vector<std::string> args = {"-m", "cpkv.conformance", r.trace_label, "--impl", *r.impl, "--ranks", std::to_string(r.ranks.value_or(source.setting.cp)),
                                   "--seed", std::to_string(r.seed), "--layers", std::to_string(std::min(r.layers.value_or(layer_count), layer_count))};
  const auto add = [&args](std::string flag, std::string value) {
    args.push_back(std::move(flag));
    if (!value.empty()) args.push_back(std::move(value));
  };
  if (r.device) add("--device", *r.device);
  if (r.batch) add("--batch", std::to_string(*r.batch));
  if (r.mutant != "none") add("--mutant", r.mutant);
  if (r.swarm) add("--swarm", "");
  if (r.wait_ms_max) add("--wait-ms-max", std::to_string(*r.wait_ms_max));
  if (r.ipc_missing_rank >= 0) add("--ipc-missing-rank", std::to_string(r.ipc_missing_rank));
  if (r.timeline) add("--timeline", *r.timeline);
  if (r.no_delays) add("--no-delays", "");
  if (r.time) add("--time", "");
  if (r.require_attention) add("--require-attention", "");
  if (r.attention_output) add("--attention-output", "");
  // The knobs as the request check resolved them (the environment's too): the run sees flags only.
  if (r.import_s_max) add("--import-s-max", fmt::format("{:g}", *r.import_s_max));
  if (r.cpkv_bin) add("--cpkv-bin", *r.cpkv_bin);
  return args;
}

}  // namespace

void register_torch_backend(harness::Registry& registry) {
  harness::BackendEntry torch;
  torch.name = "torch";
  torch.summary = "a foreign PyTorch exchange (--impl module:Class) under the conformance harness: one Python rank process per rank, gloo "
                  "on CPU, NCCL on CUDA (--device), run by `python3 -m cpkv.conformance` (the configured interpreter; CPKV_PYTHON overrides it)";
  torch.options = harness::kTakesImpl | harness::kTakesDevice | harness::kTakesRanks | harness::kTakesSwarm | harness::kTakesWaitMsMax |
                  harness::kTakesIpcFault | harness::kTakesTimeline | harness::kTakesConformance;
  torch.check = check_torch_request;
  torch.handoff = conformance_arguments;
  registry.add(std::move(torch));
}

}  // namespace cpkv::backends
