// The generators of the property suite: settings, batches, caps and schedules (properties.hpp).
//
// cp, P, split and variant are drawn with weights that do not depend on RapidCheck's size, so every
// value is reached at every size (gen::inRange narrows toward its minimum at small sizes: under the
// fixed seed it never drew cp = 8 or P = 256); they still shrink toward the first value listed.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "cpkv/properties/properties.hpp"

namespace cpkv::properties {

namespace {

// A value picked by weight, whatever the size; it shrinks toward the first entry of the table.
template <typename T>
rc::Gen<T> weighted(std::vector<std::pair<std::uint32_t, T>> table) {
  return rc::Gen<T>([table](const rc::Random& random, int) {
    std::uint64_t total = 0;
    for (const auto& entry : table) total += entry.first;
    std::uint64_t r = rc::Random(random).next() % total;
    std::size_t i = 0;
    while (r >= table[i].first) r -= table[i++].first;
    return rc::shrinkable::map(rc::shrinkable::shrinkRecur(i, [](std::size_t x) { return rc::shrink::towards<std::size_t>(x, 0); }),
                               [table](std::size_t k) { return table[k].second; });
  });
}

// A uniform integer in [min, max), whatever the size; it shrinks toward min.
template <typename T>
rc::Gen<T> uniform(T min, T max) {
  return rc::gen::resize(rc::kNominalSize, rc::gen::inRange<T>(min, max));
}

// Weights of cp (out of 200 for cp_max = 8): the production size (cp_max, 8 on one node) a quarter
// of cases; cp = 1, where nothing is exchanged between ranks, one case in 200, so that vacuous cases
// stay under the 2% target in a run of 100.
constexpr std::uint32_t kCpWeightProduction = 49;
constexpr std::uint32_t kCpWeightOther = 25;
constexpr std::uint32_t kCpWeightSingle = 1;
// Weights of P: production's 64 three times any other power of two.
constexpr std::uint32_t kPageWeightProduction = 3;
constexpr std::int32_t kProductionPageSize = 64;
// Burst schedules: share of cases (in percent) that get one, with and without the emphasis.
constexpr std::int32_t kBurstPercentEmphasis = 80;
constexpr std::int32_t kBurstPercentPlain = 30;
constexpr std::uint32_t kBurstLengthMax = 400;   // steps one burst may give to one choice
constexpr std::size_t kScheduleChoicesMax = 20000;
constexpr std::int64_t kPoolRowsMax = 512;       // 2 pages of P = 256
constexpr std::int64_t kPoolPagesMax = 128;      // scattered ids, yet shared often enough

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Current pages of a batch, from its requests (PROTOCOL.md section 2): sum of ceil(extend / P).
std::int64_t pages_needed(const model::Batch& batch, std::int64_t page_size) {
  std::int64_t pages = 0;
  for (const model::Request& r : batch.requests) pages += ceil_div(r.extend_len, page_size);
  return pages;
}

bool percent(std::int32_t share) { return *uniform<std::int32_t>(0, 100) < share; }

}  // namespace

rc::Gen<model::Setting> gen_setting(const Bounds& bounds, const Emphasis& emphasis) {
  return rc::gen::exec([bounds, emphasis] {
    model::Setting s;
    std::vector<std::pair<std::uint32_t, std::int32_t>> cps;
    for (std::int32_t cp = 1; cp <= bounds.cp_max; ++cp) {
      cps.emplace_back(cp == 1 ? kCpWeightSingle : cp == bounds.cp_max ? kCpWeightProduction : kCpWeightOther, cp);
    }
    s.cp = *weighted(cps);
    std::vector<std::pair<std::uint32_t, std::int32_t>> pages;
    for (std::int32_t log2 = 0; log2 <= bounds.page_size_log2_max; ++log2) {
      pages.emplace_back((1 << log2) == kProductionPageSize ? kPageWeightProduction : 1, 1 << log2);
    }
    s.page_size = *weighted(pages);
    static const std::vector<std::vector<std::string_view>> kind_sets = {
        {"kv_fp8", "indexer_k"}, {"kv_fp8"}, {"kv_bf16", "indexer_k"}, {"kv_bf16"}, {"indexer_k"}};
    for (std::string_view name : *rc::gen::elementOf(kind_sets)) s.kinds.push_back(*model::find_buffer_kind(name));
    // Back-to-back layers: with the emphasis, 2..layers_max at every size (two layers share no half).
    const std::int32_t layers = emphasis.many_layers && bounds.layers_max >= 2 ? *uniform<std::int32_t>(2, bounds.layers_max + 1)
                                                                                : *rc::gen::inRange<std::int32_t>(1, bounds.layers_max + 1);
    for (std::int32_t l = 0; l < layers; ++l) s.layer_pattern += *rc::gen::element('F', 'S');
    s.split = *weighted<model::SplitPolicy>(
        {{1, model::SplitPolicy::zigzag}, {1, model::SplitPolicy::contiguous}, {1, model::SplitPolicy::round_robin}});
    // A pool of at most kPoolRowsMax rows: without caps the pool size is the staging size, which
    // every rank poisons whole per run.
    s.pool_pages = *rc::gen::inRange<std::int64_t>(1, std::clamp<std::int64_t>(kPoolRowsMax / s.page_size, 2, kPoolPagesMax) + 1);
    return s;
  });
}

rc::Gen<model::Batch> gen_batch(const model::Setting& setting, const Bounds& bounds, const Emphasis& emphasis) {
  return rc::gen::exec([setting, bounds, emphasis] {
    model::Batch batch;
    const std::int64_t P = setting.page_size;
    // Idle ranks: one or two requests of one or two pages leave most of a large group with nothing to write.
    const std::int32_t requests_max = emphasis.idle_ranks ? 2 : bounds.requests_max;
    const std::int64_t pages_max = emphasis.idle_ranks ? 2 : 4;
    const auto requests = *rc::gen::inRange<std::int32_t>(1, requests_max + 1);
    std::int64_t tokens = 0;
    for (std::int32_t r = 0; r < requests; ++r) {
      model::Request req;
      // Extends: one token, page-exact, or partial last page.
      // Every request, the first included, stays within tokens_max rows of dense slots: a partial
      // page costs the simulator a whole page (P = 256 gives one page).
      const auto shape = *rc::gen::inRange(0, 3);
      const auto pages = *rc::gen::inRange<std::int64_t>(1, std::clamp<std::int64_t>(bounds.tokens_max / P, 1, pages_max) + 1);
      req.extend_len = shape == 0 ? 1 : shape == 1 ? pages * P : (pages - 1) * P + *rc::gen::inRange<std::int64_t>(1, P + 1);
      const std::int64_t extend_rows = (req.extend_len + P - 1) / P * P;
      const auto prefix_pages = *rc::gen::inRange<std::int64_t>(0, std::clamp<std::int64_t>((bounds.tokens_max - extend_rows) / P, 0, 4) + 1);
      req.prefix_len = prefix_pages * P;
      if (r > 0 && tokens + extend_rows + req.prefix_len > bounds.tokens_max) break;
      // Scattered page ids, as an allocator leaves them; a request may share the previous one's
      // prefix pages (a common system prompt), as the prefix cache hands out.
      const bool shares = r > 0 && !batch.requests.back().prefix_pages.empty() && *rc::gen::element(false, false, true);
      for (std::int64_t k = 0; k < prefix_pages; ++k) {
        const std::vector<std::int64_t>& previous = batch.requests.empty() ? req.prefix_pages : batch.requests.back().prefix_pages;
        const bool copy = shares && k < static_cast<std::int64_t>(previous.size());
        req.prefix_pages.push_back(copy ? previous[k] : *rc::gen::inRange<std::int64_t>(0, setting.pool_pages));
      }
      tokens += extend_rows + req.prefix_len;
      batch.requests.push_back(std::move(req));
    }
    return batch;
  });
}

namespace {

// Another batch of the same shape (extend and prefix lengths): fresh prefix page ids, so its plan
// differs from the first batch's only in where prefix pages come from.
rc::Gen<model::Batch> gen_same_shape(const model::Setting& setting, const model::Batch& shape) {
  return rc::gen::exec([setting, shape] {
    model::Batch batch = shape;
    for (model::Request& r : batch.requests) {
      for (std::int64_t& page : r.prefix_pages) page = *rc::gen::inRange<std::int64_t>(0, setting.pool_pages);
    }
    return batch;
  });
}

void set_caps_for_slots(model::Setting& s, std::int64_t slots) {
  // staging_slots = ceil(T / P) + R (PROTOCOL.md section 4): R requests, T in ((slots-R-1)P, (slots-R)P].
  const std::int64_t P = s.page_size;
  const std::int64_t requests = *rc::gen::inRange<std::int64_t>(1, slots);
  s.caps.max_batch_requests = requests;
  s.caps.max_total_extend_tokens = (slots - requests - 1) * P + *rc::gen::inRange<std::int64_t>(1, P + 1);
}

// Caps under which every batch fits, or some overflow and at least one fits.
void draw_fitting_caps(Case& c, std::int64_t need_min, std::int64_t need_max, std::int64_t extend_max, std::int64_t requests_max) {
  model::Setting& s = c.setting;
  enum class Shape : std::uint8_t { loose, absent, mib, mixed };
  switch (*weighted<Shape>({{1, Shape::loose}, {1, Shape::absent}, {1, Shape::mib}, {1, Shape::mixed}})) {
    case Shape::mixed:
      // A staging size between the smallest and the largest batch: the largest overflows.
      if (need_min < need_max && need_min >= 2) {
        set_caps_for_slots(s, *rc::gen::inRange<std::int64_t>(need_min, need_max));
        break;
      }
      [[fallthrough]];
    case Shape::loose:
      // The caps a scheduler would set for these batches, with a little slack: every batch fits
      // (ceil(T / P) + R >= sum of ceil(extend / P)), and staging, which every rank poisons whole
      // per run, stays near the batches' size.
      s.caps.max_total_extend_tokens = extend_max + *rc::gen::inRange<std::int64_t>(0, s.page_size);
      s.caps.max_batch_requests = requests_max + *rc::gen::inRange<std::int64_t>(0, 2);
      break;
    case Shape::absent:
      // Every current page is a pool page: a real pool holds at least the largest batch.
      s.pool_pages = std::max(s.pool_pages, need_max);
      break;
    case Shape::mib: {
      const std::int64_t slot_bytes = 2 * static_cast<std::int64_t>(s.page_size * s.row_bytes_all_kinds());
      s.caps.staging_mib_override = ceil_div(need_max * slot_bytes, std::int64_t{1} << 20) + *rc::gen::inRange<std::int64_t>(0, 2);
      break;
    }
  }
}

// Caps whose staging slots land within two of one batch's current pages, on either side.
void draw_edge_caps(Case& c) {
  model::Setting& s = c.setting;
  const auto b = *rc::gen::inRange<std::size_t>(0, c.batches.size());
  const std::int64_t offset = *weighted<std::int64_t>({{1, 0}, {1, -1}, {1, 1}, {1, -2}, {1, 2}});
  const std::int64_t slots = std::max<std::int64_t>(2, pages_needed(c.batches[b], s.page_size) + offset);
  if (*rc::gen::element(true, true, true, false)) {
    set_caps_for_slots(s, slots);
    return;
  }
  // No caps: the pool size is the capacity; page ids are folded into the smaller pool.
  s.pool_pages = slots;
  for (model::Batch& batch : c.batches) {
    for (model::Request& r : batch.requests) {
      for (std::int64_t& page : r.prefix_pages) page %= slots;
    }
  }
}

// A page table names each pool page at most once per request (traces/README.md: the trace format
// refuses a repeat, so a case with one could not be written as a replayable counterexample). A
// repeated id moves to the next id not yet in the request (mod the pool); a prefix longer than
// the pool is cut to the pool. Applied last, after the caps may have shrunk the pool.
void make_page_tables_distinct(Case& c) {
  for (model::Batch& batch : c.batches) {
    for (model::Request& r : batch.requests) {
      if (static_cast<std::int64_t>(r.prefix_pages.size()) > c.setting.pool_pages) r.prefix_pages.resize(static_cast<std::size_t>(c.setting.pool_pages));
      r.prefix_len = static_cast<std::int64_t>(r.prefix_pages.size()) * c.setting.page_size;
      std::vector<bool> used(static_cast<std::size_t>(c.setting.pool_pages), false);
      for (std::int64_t& page : r.prefix_pages) {
        while (used[static_cast<std::size_t>(page)]) page = (page + 1) % c.setting.pool_pages;
        used[static_cast<std::size_t>(page)] = true;
      }
    }
  }
}

std::vector<std::uint32_t> gen_schedule(bool bursts) {
  if (!bursts) return *rc::gen::container<std::vector<std::uint32_t>>(rc::gen::inRange<std::uint32_t>(0, 8));
  // Bursts: one choice repeated, so the rank it picks runs as far ahead as the protocol lets it
  // (choice 0 is the lowest runnable rank) while the others fall behind.
  const auto runs = *rc::gen::container<std::vector<std::pair<std::uint32_t, std::uint32_t>>>(
      rc::gen::pair(rc::gen::inRange<std::uint32_t>(0, 8), rc::gen::inRange<std::uint32_t>(1, kBurstLengthMax + 1)));
  std::vector<std::uint32_t> schedule;
  for (const auto& [choice, length] : runs) {
    if (schedule.size() + length > kScheduleChoicesMax) break;
    schedule.insert(schedule.end(), length, choice);
  }
  return schedule;
}

}  // namespace

rc::Gen<Case> gen_case(const Bounds& bounds, const Emphasis& emphasis) {
  return rc::gen::exec([bounds, emphasis] {
    Case c;
    c.setting = *gen_setting(bounds, emphasis);
    const auto batch_count = emphasis.repeated_shape ? *uniform<std::int32_t>(2, std::max(2, bounds.batches_max) + 1)
                                                     : *rc::gen::inRange<std::int32_t>(1, bounds.batches_max + 1);
    c.batches.push_back(*gen_batch(c.setting, bounds, emphasis));
    for (std::int32_t b = 1; b < batch_count; ++b) {
      const bool same = emphasis.repeated_shape && *rc::gen::element(true, true, true, false);
      c.batches.push_back(same ? *gen_same_shape(c.setting, c.batches.front()) : *gen_batch(c.setting, bounds, emphasis));
    }
    std::int64_t extend_max = 1, requests_max = 1, need_min = INT64_MAX, need_max = 0;
    for (const model::Batch& batch : c.batches) {
      std::int64_t extend = 0;
      for (const model::Request& r : batch.requests) extend += r.extend_len;
      extend_max = std::max(extend_max, extend);
      requests_max = std::max<std::int64_t>(requests_max, static_cast<std::int64_t>(batch.requests.size()));
      need_min = std::min(need_min, pages_needed(batch, c.setting.page_size));
      need_max = std::max(need_max, pages_needed(batch, c.setting.page_size));
    }
    if (emphasis.caps == CapsDraw::edge) {
      draw_edge_caps(c);
    } else {
      draw_fitting_caps(c, need_min, need_max, extend_max, requests_max);
    }
    make_page_tables_distinct(c);
    c.variant = *weighted([&] {
      std::vector<std::pair<std::uint32_t, model::Variant>> table;
      for (model::Variant v : emphasis.variants) table.emplace_back(1, v);
      return table;
    }());
    c.layers = c.setting.layer_count();
    c.schedule_bursts = percent(emphasis.adversarial_schedule ? kBurstPercentEmphasis : kBurstPercentPlain);
    c.schedule = gen_schedule(c.schedule_bursts);
    c.ipc_missing_rank = emphasis.ipc_faults && percent(80) ? *uniform<std::int32_t>(0, c.setting.cp) : -1;
    c.seed = *uniform<std::uint64_t>(1, 1000);
    return c;
  });
}

}  // namespace cpkv::properties
