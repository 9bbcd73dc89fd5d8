// Loading an exchange plugin (include/cpkv/exchange_abi.h): a shared object exporting
// `cpkv_exchange_v1`. Everything that can be wrong with the file is found here, in the launching
// process, before any rank starts: not a file, not a shared object, no symbol, another ABI version,
// a table with a missing entry or an unknown variant. CUDA-free (dlopen only), so CI tests it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpkv/exchange_abi.h"
#include "cpkv/model/variants.hpp"

namespace cpkv::harness {

struct ExchangePlugin {
  std::string path;                       // as the user named it
  const cpkv_exchange_v1_t* table = nullptr;
  std::string name;
  std::vector<model::Variant> variants;   // what it implements, in its own order
  std::vector<std::string> mutants;       // the planted bugs it holds itself
  std::uint32_t uses = 0;                 // CPKV_USES_*
  bool builtin = false;                   // cpkv's own (compiled in), not a file

  bool implements(model::Variant v) const;
  bool holds(const std::string& mutant) const;
};

// The plugin at `path`, checked; throws RequestError("exchange", "PATH: reason") naming the first
// thing wrong. The library stays loaded for the life of the process (rank processes fork from it).
std::shared_ptr<const ExchangePlugin> load_exchange_plugin(const std::string& path);

// The same checks of a table already in this process (a built-in plugin), with `label` in errors.
std::shared_ptr<const ExchangePlugin> check_exchange_table(const cpkv_exchange_v1_t* table, const std::string& label, bool builtin);

}  // namespace cpkv::harness
