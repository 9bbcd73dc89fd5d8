// The exchange plugin loader: see exchange_plugin.hpp.
#include "cpkv/harness/exchange_plugin.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "cpkv/harness/probe.hpp"
#include "cpkv/harness/request.hpp"
#include "cpkv/traces/text.hpp"

namespace cpkv::harness {

namespace {

constexpr std::size_t kNamesMax = 64;  // entries of a plugin's variants or mutants list before it is called unterminated

[[noreturn]] void refuse(const std::string& label, const std::string& reason) {
  throw RequestError("exchange", fmt::format("{}: {}", traces::escape_bytes(label), reason));
}

// What the file is before dlopen sees it: a regular file that starts with the ELF magic.
void check_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) refuse(path, fmt::format("cannot be read ({})", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) refuse(path, "is not a regular file (a plugin is a shared object, .so)");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) refuse(path, fmt::format("cannot be read ({})", std::strerror(errno)));
  std::array<unsigned char, 4> magic{};
  const ssize_t got = ::read(fd, magic.data(), magic.size());
  ::close(fd);
  if (got != 4 || magic[0] != 0x7f || magic[1] != 'E' || magic[2] != 'L' || magic[3] != 'F') {
    refuse(path, "is not a shared object (no ELF header; build the plugin with -shared -fPIC)");
  }
}

std::vector<std::string> names_of(const char* const* list, const std::string& label, const char* field) {
  std::vector<std::string> out;
  if (list == nullptr) return out;
  for (std::size_t i = 0; list[i] != nullptr; ++i) {
    if (i == kNamesMax) refuse(label, fmt::format("its {} list has no NULL end within {} entries", field, kNamesMax));
    out.emplace_back(list[i]);
  }
  return out;
}

std::vector<model::Variant> variants_of(const cpkv_exchange_v1_t& t, const std::string& label) {
  if (t.variants == nullptr || t.variants[0] == nullptr) refuse(label, "implements no variant (cpkv_exchange_v1.variants is empty)");
  std::vector<model::Variant> out;
  for (const std::string& name : names_of(t.variants, label, "variants")) {
    const std::optional<model::Variant> v = model::parse_variant(name);
    if (!v) refuse(label, fmt::format("names an unknown variant '{}' (one of: {})", traces::escape_bytes(name), model::variant_names()));
    if (std::find(out.begin(), out.end(), *v) != out.end()) refuse(label, fmt::format("names variant '{}' twice", name));
    out.push_back(*v);
  }
  return out;
}

// Every function of the table points into code some loaded object maps (a wild pointer there would
// crash the first rank that calls it, far from the table that holds it).
void check_entries(const cpkv_exchange_v1_t& t, const std::string& label) {
  const std::pair<const char*, const void*> entries[] = {{"setup", reinterpret_cast<const void*>(t.setup)},
                                                         {"begin_batch", reinterpret_cast<const void*>(t.begin_batch)},
                                                         {"compose_layer", reinterpret_cast<const void*>(t.compose_layer)},
                                                         {"end_batch", reinterpret_cast<const void*>(t.end_batch)},
                                                         {"teardown", reinterpret_cast<const void*>(t.teardown)}};
  for (const auto& [call, address] : entries) {
    Dl_info info{};
    if (address != nullptr && ::dladdr(address, &info) == 0) {
      refuse(label, fmt::format("its {} entry ({}) points into no loaded object (a wild pointer in the table)", call, address));
    }
  }
}

// The one rule for the planted bugs a plugin declares (docs/plugins.md, "Planted bugs"): each is a
// row of cpkv's table, with the meaning and invariant cpkv gives it, and a bug of an exchange (one
// the protocol's backends hold: the simulator's or the GPU's), which the plugin then holds itself
// (ctx->mutant). A name of the harness's own (it corrupts what cpkv hands over: cpkv plants those
// itself, in any plugin that reads the input), "none", an unknown name or one named twice is
// refused here, at load, so every name that passes can be run to the end of `cpkv mutants`.
void check_held_mutants(const std::vector<std::string>& names, const std::string& label) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string& m = names[i];
    const std::optional<Mutant> parsed = parse_mutant(m);
    if (!parsed || *parsed == Mutant::none) {
      refuse(label, fmt::format("holds an unknown planted bug '{}' (a plugin holds bugs of cpkv's table: {})", traces::escape_bytes(m),
                                mutant_names(kSimulatorHolds | kGpuHolds)));
    }
    if (!held_by(*parsed, kSimulatorHolds | kGpuHolds)) {
      refuse(label, fmt::format("declares '{}', a planted bug of the harness (it corrupts what cpkv hands over; cpkv plants it in a plugin whose uses "
                                "reads that input): a plugin cannot hold it", m));
    }
    if (std::find(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(i), m) != names.begin() + static_cast<std::ptrdiff_t>(i)) {
      refuse(label, fmt::format("declares planted bug '{}' twice", m));
    }
  }
}

// The tables compiled into this process, by the word --exchange names them with.
std::vector<std::pair<std::string, std::shared_ptr<const ExchangePlugin>>>& builtin_tables() {
  static std::vector<std::pair<std::string, std::shared_ptr<const ExchangePlugin>>> tables;
  return tables;
}

}  // namespace

void register_builtin_exchange(const std::string& spelling, const cpkv_exchange_v1_t* table) {
  for (const auto& entry : builtin_tables()) {
    if (entry.first == spelling) return;
  }
  builtin_tables().emplace_back(spelling, check_exchange_table(table, spelling, true));
}

std::shared_ptr<const ExchangePlugin> find_exchange(const std::string& spelling, std::chrono::milliseconds limit) {
  for (const auto& [name, plugin] : builtin_tables()) {
    if (name == spelling) return plugin;
  }
  if (spelling == kBuiltinExchange) {
    refuse(spelling, "names cpkv's built-in exchange, which this build lacks (the cuda backend registers it where CUDA and NCCL were found); "
                     "give a plugin's path (a file called builtin: ./builtin)");
  }
  return load_exchange_plugin(spelling, limit);
}

bool ExchangePlugin::implements(model::Variant v) const { return std::find(variants.begin(), variants.end(), v) != variants.end(); }
bool ExchangePlugin::holds(const std::string& mutant) const { return std::find(mutants.begin(), mutants.end(), mutant) != mutants.end(); }

namespace {

// The bench's parts a table offers (revision 4's tail), read only from a table whose struct_bytes
// holds the field; refused by name where its own version, size or bits are not this header's.
const cpkv_exchange_parts* parts_of(const cpkv_exchange_v1_t& t, const std::string& label) {
  if (!CPKV_TABLE_HAS(&t, parts) || t.parts == nullptr) return nullptr;
  const cpkv_exchange_parts& p = *t.parts;
  if (p.version != CPKV_EXCHANGE_PARTS_VERSION) {
    refuse(label, fmt::format("offers the bench's parts of version {}; this cpkv reads version {} (cpkv_exchange_parts; rebuild it against "
                              "include/cpkv/exchange_abi.h, or set parts to NULL)", p.version, CPKV_EXCHANGE_PARTS_VERSION));
  }
  if (p.struct_bytes != sizeof(cpkv_exchange_parts)) {
    refuse(label, fmt::format("declares a {}-byte cpkv_exchange_parts; version {}'s is {} bytes", p.struct_bytes, CPKV_EXCHANGE_PARTS_VERSION,
                              sizeof(cpkv_exchange_parts)));
  }
  if ((p.offered & ~((1u << CPKV_PART_COUNT) - 1)) != 0) refuse(label, fmt::format("offers unknown bench parts: {:#x}", p.offered));
  if (p.enqueue_part == nullptr) refuse(label, "offers the bench's parts without an enqueue_part function");
  if ((t.flags & CPKV_FLAG_REPLAYABLE) == 0) {
    refuse(label, "offers the bench's parts but does not declare CPKV_FLAG_REPLAYABLE (the parts are timed as replayed CUDA graphs)");
  }
  return t.parts;
}

}  // namespace

std::shared_ptr<const ExchangePlugin> check_exchange_table(const cpkv_exchange_v1_t* table, const std::string& label, bool builtin) {
  if (table == nullptr) refuse(label, fmt::format("its {} is a null pointer", CPKV_EXCHANGE_SYMBOL));
  const cpkv_exchange_v1_t& t = *table;
  if (t.abi_version != CPKV_EXCHANGE_ABI_VERSION) {
    refuse(label, fmt::format("was built against cpkv exchange ABI version {}; this cpkv speaks version {} (rebuild it against include/cpkv/exchange_abi.h)",
                              t.abi_version, CPKV_EXCHANGE_ABI_VERSION));
  }
  // Revisions 1 to 3 of the header made an 80-byte table; revision 4 appended `parts`.
  if (t.struct_bytes != sizeof(cpkv_exchange_v1_t) && t.struct_bytes != CPKV_TABLE_BYTES_REVISION_3) {
    refuse(label, fmt::format("declares a {}-byte cpkv_exchange_v1_t; version {}'s is {} bytes, or {} without the bench's parts (a header from another "
                              "revision)", t.struct_bytes, CPKV_EXCHANGE_ABI_VERSION, sizeof(cpkv_exchange_v1_t), CPKV_TABLE_BYTES_REVISION_3));
  }
  if (t.name == nullptr || t.name[0] == '\0') refuse(label, "has no name (cpkv_exchange_v1.name)");
  const char* missing = t.setup == nullptr ? "setup" : t.compose_layer == nullptr ? "compose_layer" : t.end_batch == nullptr ? "end_batch"
                      : t.teardown == nullptr ? "teardown" : nullptr;
  if (missing != nullptr) refuse(label, fmt::format("has no {} function (only begin_batch may be NULL)", missing));
  check_entries(t, label);
  if ((t.uses & ~(CPKV_USES_ROWS | CPKV_USES_PLAN | CPKV_USES_INVERSE | CPKV_USES_PRODUCE)) != 0) refuse(label, fmt::format("sets unknown bits in uses: {:#x}", t.uses));
  if ((t.flags & ~(CPKV_FLAG_REPLAYABLE | CPKV_FLAG_ATTENTION_PLAN)) != 0) refuse(label, fmt::format("sets unknown bits in flags: {:#x}", t.flags));
  auto plugin = std::make_shared<ExchangePlugin>();
  plugin->parts = parts_of(t, label);
  plugin->path = label;
  plugin->table = table;
  plugin->name = t.name;
  plugin->variants = variants_of(t, label);
  plugin->mutants = names_of(t.mutants, label, "mutants");
  check_held_mutants(plugin->mutants, label);
  plugin->uses = t.uses;
  plugin->builtin = builtin;
  return plugin;
}

namespace {

// dlopen and dlsym, in whichever process calls it: the file's initializers run here.
const cpkv_exchange_v1_t* open_table(const std::string& path, void*& handle) {
  // A bare name would be looked up on the library path: name the file the user gave.
  const std::string open_path = path.find('/') == std::string::npos ? "./" + path : path;
  handle = ::dlopen(open_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    refuse(path, fmt::format("cannot be loaded: {}", why != nullptr ? why : "dlopen failed"));
  }
  ::dlerror();
  void* symbol = ::dlsym(handle, CPKV_EXCHANGE_SYMBOL);
  if (symbol == nullptr) {
    ::dlclose(handle);
    refuse(path, fmt::format("exports no symbol {} (is it a cpkv exchange plugin? see include/cpkv/exchange_abi.h)", CPKV_EXCHANGE_SYMBOL));
  }
  return static_cast<const cpkv_exchange_v1_t*>(symbol);
}

// What the probe child says of the file: refused (with the reason) or its table passed every check.
struct LoadAnswer {
  std::int32_t refused = 0;
  char reason[480] = {};
};

// Where the child was when it ended (a word in memory shared with it), for a child that gives no answer.
enum LoadStage : std::int32_t { kStageStart, kStageOpen, kStageTable, kStageDone };
constexpr const char* kStageWords[] = {"before cpkv loaded it", "while it was loaded (dlopen: its initializers)",
                                       "while cpkv read its table (a wild pointer in cpkv_exchange_v1?)", "after its table passed"};

// The loader's whole work on a file (dlopen: the plugin's initializers; every table check) first in
// a probe child bounded by `limit`: a crash, an exit of any status or a hang there is refused in one
// line naming what it did, and cpkv's own process never ran any of the plugin's code.
void probe_load(const std::string& path, std::chrono::milliseconds limit) {
  void* page = ::mmap(nullptr, sizeof(std::int32_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) refuse(path, fmt::format("cannot be probed (mmap: {})", std::strerror(errno)));
  auto* stage = static_cast<volatile std::int32_t*>(page);
  *stage = kStageStart;
  LoadAnswer answer;
  const ProbeOutcome outcome = run_probe<LoadAnswer>([&](LoadAnswer& out) {
    try {
      void* handle = nullptr;
      *stage = kStageOpen;
      const cpkv_exchange_v1_t* table = open_table(path, handle);
      *stage = kStageTable;
      check_exchange_table(table, path, false);
      *stage = kStageDone;
    } catch (const RequestError& e) {
      out.refused = 1;
      std::snprintf(out.reason, sizeof(out.reason), "%s", e.reason().c_str());
    }
  }, answer, limit);
  const std::int32_t seen = *stage;
  const std::int32_t where = std::clamp<std::int32_t>(seen, kStageStart, kStageDone);
  ::munmap(page, sizeof(std::int32_t));
  if (outcome.answered) {
    if (answer.refused != 0) throw RequestError("exchange", std::string(answer.reason, ::strnlen(answer.reason, sizeof(answer.reason))));
    return;
  }
  if (outcome.timed_out) {
    refuse(path, fmt::format("did not finish loading within {} ms {} (a hang in it?); the probe was killed", limit.count(), kStageWords[where]));
  }
  if (!outcome.ended.empty()) refuse(path, fmt::format("{} {}", outcome.ended, kStageWords[where]));
  refuse(path, fmt::format("could not be probed: {}", outcome.failure));
}

}  // namespace

std::shared_ptr<const ExchangePlugin> load_exchange_plugin(const std::string& path, std::chrono::milliseconds limit) {
  if (path.empty()) refuse(path, "an empty path");
  check_file(path);
  probe_load(path, limit);
  void* handle = nullptr;
  const cpkv_exchange_v1_t* table = open_table(path, handle);
  try {
    return check_exchange_table(table, path, false);
  } catch (...) {
    ::dlclose(handle);
    throw;
  }
}

}  // namespace cpkv::harness
