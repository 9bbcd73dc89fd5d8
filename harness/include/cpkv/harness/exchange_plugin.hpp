// Loading an exchange plugin (include/cpkv/exchange_abi.h): a shared object exporting
// `cpkv_exchange_v1`. Everything that can be wrong with the file is found here, in the launching
// process, before any rank starts: not a file, not a shared object, no symbol, another ABI version,
// a table with a missing entry or an unknown variant. CUDA-free (dlopen only), so CI tests it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpkv/exchange_abi.h"
#include "cpkv/harness/mutants.hpp"
#include "cpkv/model/variants.hpp"

namespace cpkv::harness {

struct ExchangePlugin {
  std::string path;                       // as the user named it
  const cpkv_exchange_v1_t* table = nullptr;
  std::string name;
  std::vector<model::Variant> variants;   // what it implements, in its own order
  std::vector<std::string> mutants;       // the planted bugs it holds itself
  std::uint32_t uses = 0;                 // CPKV_USES_*
  const cpkv_exchange_parts* parts = nullptr;  // the bench's parts it offers (revision 4's tail), checked; null: none
  bool builtin = false;                   // cpkv's own (compiled in), not a file

  bool implements(model::Variant v) const;
  bool holds(const std::string& mutant) const;
};

// The CPKV_USES_* inputs a planted bug of the harness (kHarnessHolds) corrupts, so it reaches only a
// plugin that reads one of them (uses & mask); 0 for every other planted bug. The one place this
// mapping is written. unzeroed_rows corrupts the rows in ctx->rows and those produce_rows writes.
constexpr std::uint32_t input_corrupted_by(Mutant mutant) {
  return mutant == Mutant::stale_page_inverse ? CPKV_USES_INVERSE
         : mutant == Mutant::reused_plan      ? CPKV_USES_PLAN
         : mutant == Mutant::unzeroed_rows    ? (CPKV_USES_ROWS | CPKV_USES_PRODUCE)
                                              : 0u;
}
static_assert(input_corrupted_by(Mutant::stale_page_inverse) != 0 && input_corrupted_by(Mutant::reused_plan) != 0 &&
                  input_corrupted_by(Mutant::unzeroed_rows) != 0 && kHarnessMutants.size() == 3,
              "every planted bug of the harness names the input it corrupts");

// The plugin at `path`, checked; throws RequestError("exchange", "PATH: reason") naming the first
// thing wrong. Everything that runs the plugin's code (dlopen: its initializers; every check of its
// table) runs first in a probe child (probe.hpp) bounded by `limit`: a crash, an exit of any status
// or a hang there is that one line ("PATH: exited with status 0 while it was loaded ..."), and only
// a file that passed there is loaded into this process. The library then stays loaded for the life
// of the process (rank processes fork from it). The limit: kLoadMsMax, or the request's
// exchange_load_ms_max (--exchange-load-ms-max, CPKV_EXCHANGE_LOAD_MS: check_request reads it).
inline constexpr std::int64_t kLoadMsMax = 30000;  // a plugin's dlopen on a loaded laptop takes well under a second
inline constexpr const char* kLoadMsEnvironment = "CPKV_EXCHANGE_LOAD_MS";
std::shared_ptr<const ExchangePlugin> load_exchange_plugin(const std::string& path,
                                                           std::chrono::milliseconds limit = std::chrono::milliseconds(kLoadMsMax));

// What --exchange names: a built-in table registered under that word (kBuiltinExchange: cpkv's own
// fused compose, which the cuda backend registers), else a plugin's path (load_exchange_plugin).
// "builtin" in a build without the cuda backend is refused, naming why; a file called builtin is
// ./builtin. Throws RequestError("exchange", ...) like load_exchange_plugin.
inline constexpr const char* kBuiltinExchange = "builtin";
// A spelling that is gone: the cuda backend's own exchange in the rank process, without the ABI.
// The plugin host is the backend's one rank loop, so --exchange inprocess (or CPKV_EXCHANGE=inprocess)
// is refused with kInProcessGone; a file called inprocess is ./inprocess.
inline constexpr const char* kInProcessExchange = "inprocess";
inline constexpr const char* kInProcessGone =
    "'inprocess' is gone: cpkv's own exchange runs only through the plugin ABI, as the built-in plugin (--exchange builtin, the default), "
    "and `cpkv bench` times its parts (fill alone, compose alone, ...) through the same table";
std::shared_ptr<const ExchangePlugin> find_exchange(const std::string& spelling,
                                                    std::chrono::milliseconds limit = std::chrono::milliseconds(kLoadMsMax));
// Registers a table compiled into this process under `spelling`, checked as a plugin's would be
// (check_exchange_table, builtin = true). Called at backend registration; a second call with the
// same spelling is ignored (registries are built more than once).
void register_builtin_exchange(const std::string& spelling, const cpkv_exchange_v1_t* table);

// The same checks of a table already in this process (a built-in plugin), with `label` in errors.
std::shared_ptr<const ExchangePlugin> check_exchange_table(const cpkv_exchange_v1_t* table, const std::string& label, bool builtin);

}  // namespace cpkv::harness
