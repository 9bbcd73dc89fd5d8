// The torch backend: a foreign PyTorch exchange (--impl module:Class) under the conformance harness.
// Its ranks are Python processes (torch.distributed: gloo on CPU, NCCL and CUDA IPC on GPU), so its
// run is Python's: the entry's verb is the handoff, the arguments of `python3 -m cpkv.conformance`
// for the checked request, which a front end runs (the cpkv command through the configured
// interpreter; the Python package in process, cpkv.replay(backend="torch")).
#include <fmt/format.h>

#include "cpkv/backends/register_all.hpp"

namespace cpkv::backends {
namespace {

// `python3 -m cpkv.conformance`'s arguments for the request: every option it gave, the layers as
// every backend runs them (the request's, at most the source's: the scan's) and the ranks (default:
// the cp).
std::vector<std::string> conformance_arguments(const harness::CheckedRequest& c, const harness::BatchSource& source, const harness::ScannedSource& scanned) {
  const harness::ReplayRequest& r = c.request;
  std::vector<std::string> args = {"-m", "cpkv.conformance", r.trace_label, "--impl", *r.impl, "--ranks", std::to_string(r.ranks.value_or(source.setting.cp)),
                                   "--seed", std::to_string(r.seed), "--layers", std::to_string(scanned.layers)};
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

// The handoff, in the one call the request check makes to this backend (harness check_run): the
// command, the header's name and modes (the launcher's rank processes, or torchrun's), and the
// header's line of this backend's own configuration (the harness's delays are Python's: its next line).
harness::Handoff conformance_handoff(const harness::CheckedRequest& c, const harness::BatchSource& source, const harness::ScannedSource& scanned) {
  const harness::ReplayRequest& r = c.request;
  return {conformance_arguments(c, source, scanned), "cpkv conformance", {"conformance/processes", "conformance/torchrun"},
          fmt::format("torch: impl {} | device {} | ranks {}", *r.impl, r.device.value_or("cpu"), r.ranks.value_or(source.setting.cp))};
}

}  // namespace

void register_torch_backend(harness::Registry& registry) {
  harness::BackendEntry torch;
  torch.name = "torch";
  torch.summary = "a foreign PyTorch exchange (--impl module:Class) under the conformance harness: one Python rank process per rank, gloo "
                  "on CPU, NCCL on CUDA (--device), run by `python3 -m cpkv.conformance` (the configured interpreter; CPKV_PYTHON overrides it)";
  torch.options = harness::kTakesImpl | harness::kTakesDevice | harness::kTakesRanks | harness::kTakesSwarm | harness::kTakesWaitMsMax |
                  harness::kTakesIpcFault | harness::kTakesTimeline | harness::kTakesConformance;
  // Its checks beyond the option bits are every foreign class's (harness check_request: the class
  // named, no variant); its one verb is the handoff.
  torch.handoff = conformance_handoff;
  registry.add(std::move(torch));
}

}  // namespace cpkv::backends
