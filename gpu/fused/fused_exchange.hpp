// cpkv's own fused compose exchange as an exchange plugin (include/cpkv/exchange_abi.h): every
// variant of model::kVariantTable through cpkv's kernels (kernels/launchers.cuh) and its plan code
// (model/, gpu/device_plan.cpp), reading only what the ABI's context hands over. One source,
// compiled twice: into the cuda backend as the built-in table (`--exchange builtin`, registered by
// gpu/backend.cpp: register_backend), and as libcpkv_exchange_fused.so (CPKV_FUSED_SHARED: exports
// only cpkv_exchange_v1). docs/plugins.md, "The first plugin: cpkv's own".
#pragma once

#include "cpkv/exchange_abi.h"

namespace cpkv::fused {

// The table, as the .so exports it (the built-in one is the same object in the cuda library).
const cpkv_exchange_v1_t* builtin_exchange_table();

}  // namespace cpkv::fused
