#include "cpkv/harness/mutants.hpp"

#include <fmt/format.h>

namespace cpkv::harness {

std::optional<Mutant> parse_mutant(std::string_view text) {
  for (const MutantInfo& row : kMutantTable) {
    if (row.name == text) return row.mutant;
  }
  return std::nullopt;
}

std::string mutant_names(std::uint8_t backends) {
  std::string names;
  for (const MutantInfo& row : kMutantTable) {
    if ((row.backends & backends) == 0) continue;
    if (!names.empty()) names += ", ";
    names += row.name;
  }
  return names;
}

}  // namespace cpkv::harness
