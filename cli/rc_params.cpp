#include "rc_params.hpp"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <rapidcheck/detail/Configuration.h>

#include "commands.hpp"

namespace cpkv::cli {

namespace {

// The keys of "key=value ..." words, in order.
std::vector<std::string> keys_of(const std::string& text) {
  std::vector<std::string> keys;
  std::istringstream words(text);
  for (std::string word; words >> word;) keys.push_back(word.substr(0, word.find('=')));
  return keys;
}

}  // namespace

void refuse_unknown_rc_params_keys(const std::string& text) {
  // The known keys from RapidCheck itself (every key of a default configuration), not a copy here.
  const std::vector<std::string> listed = keys_of(rc::detail::configToString(rc::detail::Configuration{}));
  const std::set<std::string> known(listed.begin(), listed.end());
  for (const std::string& key : keys_of(text)) {
    if (known.count(key) == 0) throw OptionError(fmt::format("RC_PARAMS: unknown key '{}'; known: {}", key, fmt::join(known, ", ")));
  }
}

// RapidCheck reads RC_PARAMS on first use and ends the process (status 1, several lines) when it
// cannot parse it; read it here first, so a bad one is bad input like any option.
void check_rc_params() {
  const char* env = std::getenv("RC_PARAMS");
  if (env == nullptr) return;
  refuse_unknown_rc_params_keys(env);
  try {
    (void)rc::detail::configFromString(env);
  } catch (const rc::detail::ConfigurationException& e) {
    throw OptionError(fmt::format("RC_PARAMS: {}", e.what()));
  }
}

}  // namespace cpkv::cli
