#include "backends.hpp"

#include "commands.hpp"
#include "options.hpp"
#include "cpkv/sim/backend.hpp"
#if CPKV_HAVE_CUDA_BACKEND
#include "cuda_backend.hpp"
#endif

namespace cpkv::cli {

static_assert(option_limits::wait_ms_max == harness::request_limits::wait_ms_max, "the CLI and the request bound waits alike");

const harness::Registry& backends() {
  static const harness::Registry registry = [] {
    harness::Registry r;
    sim::register_backends(r);
#if CPKV_HAVE_CUDA_BACKEND
    cuda::register_backend(r);
#endif
    harness::register_model_backend(r);
    return r;
  }();
  return registry;
}

std::string backends_help() {
  std::string text;
  const auto& entries = backends().entries();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == entries.size() ? " or " : "; ") + entries[i].name + " (" + entries[i].summary + ")";
  }
  return text;
}

namespace {

template <typename Function>
auto as_option_error(Function&& function) {
  try {
    return function();
  } catch (const harness::RequestError& e) {
    throw OptionError(e.cli_message());
  }
}

}  // namespace

harness::CheckedRequest checked_request(const harness::ReplayRequest& request) {
  return as_option_error([&] { return harness::check_request(request, backends()); });
}

harness::ScannedSource checked_source(const harness::CheckedRequest& request, const harness::BatchSource& source) {
  return as_option_error([&] { return harness::check_source(request, source); });
}

harness::CheckedBench checked_bench(const harness::BenchRequest& request) {
  return as_option_error([&] { return harness::check_bench_request(request, backends()); });
}

harness::BenchReport benched(const harness::CheckedBench& bench, const harness::BatchSource& source, const harness::BenchPrint& print) {
  return as_option_error([&] { return bench.checked.backend->bench(bench, source, print); });
}

std::unique_ptr<harness::Backend> made_backend(const harness::CheckedRequest& request, const harness::ProgressFunction& progress) {
  return as_option_error([&] { return request.backend->make(request, progress); });
}

}  // namespace cpkv::cli
