// The one registration of every backend (harness/request.hpp: Registry) for every front end: the
// cpkv command, the Python package and the property suite's replay lines all call register_all, so
// the backends a name reaches, their order and their entries cannot differ from one front end to
// the next. Which backends a process holds is what it links: sim and model always, cuda where the
// process links the GPU backend (the cpkv command; not the Python package, whose GPU runs go through
// the cpkv command, nor the property suite's tests); torch always (its runs are Python's).
#pragma once

#include "cpkv/harness/request.hpp"

namespace cpkv::backends {

// sim, cuda (where linked), model, then torch: the order `--backend`'s help lists them in.
void register_all(harness::Registry& registry);

// "torch": a foreign PyTorch exchange under Python's conformance harness (its verb is the handoff:
// the arguments of `python3 -m cpkv.conformance` for a request).
void register_torch_backend(harness::Registry& registry);

// The registry of this process, built once by register_all.
const harness::Registry& registry();

}  // namespace cpkv::backends
