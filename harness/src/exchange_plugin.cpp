// The exchange plugin loader: see exchange_plugin.hpp.
#include "cpkv/harness/exchange_plugin.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

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

std::shared_ptr<const ExchangePlugin> find_exchange(const std::string& spelling) {
  for (const auto& [name, plugin] : builtin_tables()) {
    if (name == spelling) return plugin;
  }
  if (spelling == kBuiltinExchange) {
    refuse(spelling, "names cpkv's built-in exchange, which this build lacks (the cuda backend registers it where CUDA and NCCL were found); "
                     "give a plugin's path (a file called builtin: ./builtin)");
  }
  return load_exchange_plugin(spelling);
}

bool ExchangePlugin::implements(model::Variant v) const { return std::find(variants.begin(), variants.end(), v) != variants.end(); }
bool ExchangePlugin::holds(const std::string& mutant) const { return std::find(mutants.begin(), mutants.end(), mutant) != mutants.end(); }

std::shared_ptr<const ExchangePlugin> check_exchange_table(const cpkv_exchange_v1_t* table, const std::string& label, bool builtin) {
  if (table == nullptr) refuse(label, fmt::format("its {} is a null pointer", CPKV_EXCHANGE_SYMBOL));
  const cpkv_exchange_v1_t& t = *table;
  if (t.abi_version != CPKV_EXCHANGE_ABI_VERSION) {
    refuse(label, fmt::format("was built against cpkv exchange ABI version {}; this cpkv speaks version {} (rebuild it against include/cpkv/exchange_abi.h)",
                              t.abi_version, CPKV_EXCHANGE_ABI_VERSION));
  }
  if (t.struct_bytes != sizeof(cpkv_exchange_v1_t)) {
    refuse(label, fmt::format("declares a {}-byte cpkv_exchange_v1_t; version {}'s is {} bytes (a header from another revision)", t.struct_bytes,
                              CPKV_EXCHANGE_ABI_VERSION, sizeof(cpkv_exchange_v1_t)));
  }
  if (t.name == nullptr || t.name[0] == '\0') refuse(label, "has no name (cpkv_exchange_v1.name)");
  const char* missing = t.setup == nullptr ? "setup" : t.compose_layer == nullptr ? "compose_layer" : t.end_batch == nullptr ? "end_batch"
                      : t.teardown == nullptr ? "teardown" : nullptr;
  if (missing != nullptr) refuse(label, fmt::format("has no {} function (only begin_batch may be NULL)", missing));
  if ((t.uses & ~(CPKV_USES_ROWS | CPKV_USES_PLAN | CPKV_USES_INVERSE | CPKV_USES_PRODUCE)) != 0) refuse(label, fmt::format("sets unknown bits in uses: {:#x}", t.uses));
  if ((t.flags & ~CPKV_FLAG_REPLAYABLE) != 0) refuse(label, fmt::format("sets unknown bits in flags: {:#x}", t.flags));
  auto plugin = std::make_shared<ExchangePlugin>();
  plugin->path = label;
  plugin->table = table;
  plugin->name = t.name;
  plugin->variants = variants_of(t, label);
  plugin->mutants = names_of(t.mutants, label, "mutants");
  for (const std::string& m : plugin->mutants) {
    const std::optional<Mutant> parsed = parse_mutant(m);
    if (!parsed || *parsed == Mutant::none) refuse(label, fmt::format("holds an unknown planted bug '{}' (one of: {})", traces::escape_bytes(m), mutant_names()));
  }
  plugin->uses = t.uses;
  plugin->builtin = builtin;
  return plugin;
}

std::shared_ptr<const ExchangePlugin> load_exchange_plugin(const std::string& path) {
  if (path.empty()) refuse(path, "an empty path");
  check_file(path);
  // A bare name would be looked up on the library path: name the file the user gave.
  const std::string open_path = path.find('/') == std::string::npos ? "./" + path : path;
  void* handle = ::dlopen(open_path.c_str(), RTLD_NOW | RTLD_LOCAL);
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
  try {
    return check_exchange_table(static_cast<const cpkv_exchange_v1_t*>(symbol), path, false);
  } catch (...) {
    ::dlclose(handle);
    throw;
  }
}

}  // namespace cpkv::harness
