#include "cpkv/backends/register_all.hpp"

#include "cpkv/sim/backend.hpp"

namespace cpkv::cuda {
// Weak: defined where the process links the GPU backend (gpu/backend.cpp), null where it does not,
// so this one library serves the cpkv command and the CPU-only Python module alike.
__attribute__((weak)) void register_backend(harness::Registry& registry);
}  // namespace cpkv::cuda

namespace cpkv::backends {

void register_all(harness::Registry& registry) {
  sim::register_backends(registry);
  if (&cuda::register_backend != nullptr) cuda::register_backend(registry);
  harness::register_model_backend(registry);
  register_torch_backend(registry);
}

const harness::Registry& registry() {
  static const harness::Registry built = [] {
    harness::Registry r;
    register_all(r);
    return r;
  }();
  return built;
}

}  // namespace cpkv::backends
