#include "cpkv/properties/coverage.hpp"

#include <set>

#include <fmt/format.h>

#include "cpkv/model/staging.hpp"
#include "cpkv/model/variants.hpp"
#include "cpkv/properties/properties.hpp"

namespace cpkv::properties {

namespace {

Coverage g_coverage;
bool g_counting = true;

bool has_shared_prefix_page(const model::Batch& batch) {
  std::set<std::int64_t> seen;
  for (const model::Request& r : batch.requests) {
    for (std::int64_t page : r.prefix_pages) {
      if (!seen.insert(page).second) return true;
    }
  }
  return false;
}

bool has_idle_rank(const model::Setting& setting, const model::BatchLayout& layout) {
  std::vector<bool> writes(static_cast<std::size_t>(setting.cp), false);
  for (std::int64_t i = 0; i < layout.current_pages_total; ++i) writes[layout.current[i].writer] = true;
  return std::find(writes.begin(), writes.end(), false) != writes.end();
}

std::string percent(double share) { return fmt::format("{:.0f}%", 100.0 * share); }

}  // namespace

void Coverage::add(const Case& c) {
  ++cases;
  ++cp[c.setting.cp];
  ++page_size[c.setting.page_size];
  ++split[std::string(model::to_string(c.setting.split))];
  ++variant[std::string(model::to_string(c.variant))];
  const std::int64_t slots = model::staging_capacity(c.setting).staging_slots;
  std::int64_t admitted = 0;
  bool idle = false, shared = false;
  for (const model::Batch& batch : c.batches) {
    ++batches;
    const model::BatchLayout layout = model::layout_batch(c.setting, batch);
    if (layout.current_pages_total > slots) {
      ++batches_overflowing;
    } else {
      ++admitted;
      idle = idle || has_idle_rank(c.setting, layout);
    }
    shared = shared || has_shared_prefix_page(batch);
  }
  idle_rank += idle ? 1 : 0;
  shared_prefix += shared ? 1 : 0;
  several_batches += c.batches.size() > 1 ? 1 : 0;
  capability_fallback += c.ipc_missing_rank >= 0 && model::info(c.variant).needs_ipc ? 1 : 0;
  nothing_exchanged += admitted == 0 ? 1 : 0;
  adversarial_schedule += c.schedule_bursts ? 1 : 0;
  layers_4_or_more += c.layers >= 4 ? 1 : 0;
}

double Coverage::share_of(const std::map<std::string, std::int64_t>& counts, const std::string& key) const {
  const auto it = counts.find(key);
  return it == counts.end() ? 0.0 : share(it->second);
}

double Coverage::overflow_share() const {
  return batches > 0 ? static_cast<double>(batches_overflowing) / static_cast<double>(batches) : 0.0;
}

std::vector<CoverageTarget> common_targets() {
  std::vector<CoverageTarget> targets;
  targets.push_back({"cp = 8", [](const Coverage& c) { return c.share(c.cp.count(8) ? c.cp.at(8) : 0); }, 0.10, 1.0});
  for (model::SplitPolicy p : {model::SplitPolicy::zigzag, model::SplitPolicy::contiguous, model::SplitPolicy::round_robin}) {
    const std::string name(model::to_string(p));
    targets.push_back({"split " + name, [name](const Coverage& c) { return c.share_of(c.split, name); }, 0.25, 1.0});
  }
  targets.push_back({"nothing exchanged", [](const Coverage& c) { return c.share(c.nothing_exchanged); }, 0.0, 0.02});
  return targets;
}

std::vector<std::string> missed_targets(const std::string& property, const std::vector<CoverageTarget>& targets, const Coverage& coverage) {
  std::vector<std::string> missed;
  for (const CoverageTarget& t : targets) {
    const double share = t.share(coverage);
    if (share >= t.min && share <= t.max) continue;
    missed.push_back(fmt::format("{}: {} in {} of {} cases (target {})", property, t.what, percent(share), coverage.cases,
                                 share < t.min ? ">= " + percent(t.min) : "<= " + percent(t.max)));
  }
  return missed;
}

std::string coverage_table(const std::vector<std::pair<std::string, Coverage>>& columns) {
  constexpr int kLabelWidth = 34;
  constexpr int kColumnWidth = 8;
  std::string out = fmt::format("{:<{}}", "coverage (share of cases)", kLabelWidth);
  // Column heads: the property's number ("1_page_writer..." -> "1"), or its first word.
  for (const auto& [name, coverage] : columns) out += fmt::format("{:>{}}", name.substr(0, name.find('_')), kColumnWidth);
  out += "\n";
  const auto row = [&](const std::string& label, const auto& cell) {
    out += fmt::format("{:<{}}", label, kLabelWidth);
    for (const auto& column : columns) out += fmt::format("{:>{}}", cell(column.second), kColumnWidth);
    out += "\n";
  };
  row("cases", [](const Coverage& c) { return std::to_string(c.cases); });
  std::set<std::int32_t> cps, pages;
  std::set<std::string> splits, variants;
  for (const auto& column : columns) {
    for (const auto& [k, n] : column.second.cp) cps.insert(k);
    for (const auto& [k, n] : column.second.page_size) pages.insert(k);
    for (const auto& [k, n] : column.second.split) splits.insert(k);
    for (const auto& [k, n] : column.second.variant) variants.insert(k);
  }
  const auto count_in = [](const auto& counts, const auto& key) { const auto it = counts.find(key); return it == counts.end() ? std::int64_t{0} : it->second; };
  for (std::int32_t k : cps) row(fmt::format("cp {}", k), [&](const Coverage& c) { return percent(c.share(count_in(c.cp, k))); });
  for (std::int32_t k : pages) row(fmt::format("page size {}", k), [&](const Coverage& c) { return percent(c.share(count_in(c.page_size, k))); });
  for (const std::string& k : splits) row("split " + k, [&](const Coverage& c) { return percent(c.share(count_in(c.split, k))); });
  for (const std::string& k : variants) row("variant " + k, [&](const Coverage& c) { return percent(c.share(count_in(c.variant, k))); });
  row("batches overflowing (of batches)", [](const Coverage& c) { return percent(c.overflow_share()); });
  row("an idle rank", [](const Coverage& c) { return percent(c.share(c.idle_rank)); });
  row("shared prefix pages", [](const Coverage& c) { return percent(c.share(c.shared_prefix)); });
  row("more than one batch", [](const Coverage& c) { return percent(c.share(c.several_batches)); });
  row("capability fallback", [](const Coverage& c) { return percent(c.share(c.capability_fallback)); });
  row("burst schedule", [](const Coverage& c) { return percent(c.share(c.adversarial_schedule)); });
  row("4 or more layers", [](const Coverage& c) { return percent(c.share(c.layers_4_or_more)); });
  row("nothing exchanged (all overflow)", [](const Coverage& c) { return percent(c.share(c.nothing_exchanged)); });
  return out;
}

void reset_coverage() {
  g_coverage = Coverage{};
  g_counting = true;
}
void note_case(const Case& c) {
  if (g_counting) g_coverage.add(c);
}
void stop_counting() { g_counting = false; }
const Coverage& current_coverage() { return g_coverage; }

}  // namespace cpkv::properties
