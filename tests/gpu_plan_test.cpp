// The GPU backend's per-batch plan on the host (gpu/device_plan.cpp), checked without a GPU against
// the contracts its two launches read it by (kernels/launchers.cuh): the producer writes every token
// this rank computed exactly once, at its row, and zeroes the other rows of the pages the plan zeroes
// (PROTOCOL.md: the tail of a partial page reads 0) and nothing else; the compose launch's entries
// are the plan's lists, what reads the fill (pack, publish) first, each with its destination.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "cpkv/harness/source.hpp"
#include "cpkv/model/attention.hpp"
#include "cpkv/model/staging.hpp"
#include "device_plan.hpp"

namespace cpkv {
namespace {

std::string fmt_where(const char* trace, std::int32_t cp, model::Variant variant, std::size_t batch) {
  return std::string(trace) + " cp " + std::to_string(cp) + " " + std::string(model::to_string(variant)) + " batch " + std::to_string(batch);
}

std::vector<model::Batch> batches_of(const harness::BatchSource& source) {
  std::vector<model::Batch> out;
  harness::BatchCursor cursor(source);
  while (auto b = cursor.next()) out.push_back(*b);
  return out;
}

void expect_produce_rows(const cuda::BatchPlan& b, std::int32_t page_size, const std::string& where) {
  std::map<std::int64_t, std::size_t> index;  // destination page -> position in produce_pages
  for (std::size_t i = 0; i < b.produce_pages.size(); ++i) {
    EXPECT_TRUE(index.emplace(b.produce_pages[i], i).second) << where << ": page " << b.produce_pages[i] << " listed twice";
  }
  ASSERT_EQ(b.row_token.size(), b.produce_pages.size() * page_size) << where;
  std::vector<int> written(b.inv_dest.size(), 0);
  for (std::size_t i = 0; i < b.produce_pages.size(); ++i) {
    for (std::int32_t row = 0; row < page_size; ++row) {
      const std::int32_t t = b.row_token[i * page_size + row];
      if (t < 0) continue;
      ASSERT_LT(static_cast<std::size_t>(t), b.inv_dest.size()) << where;
      EXPECT_EQ(b.inv_dest[t], b.produce_pages[i] * page_size + row) << where << ": token " << t << " lands on another row";
      ++written[t];
    }
  }
  for (std::size_t t = 0; t < written.size(); ++t) EXPECT_EQ(written[t], 1) << where << ": token " << t << " written " << written[t] << " times";
  std::set<std::int64_t> zeroed;
  for (const kernels::GatherEntry& e : b.zero_own) zeroed.insert(e.dst_page);
  for (std::size_t i = 0; i < b.produce_pages.size(); ++i) {
    const std::int32_t empty = zeroed.count(b.produce_pages[i]) ? kernels::kRowZero : kernels::kRowUntouched;
    for (std::int32_t row = 0; row < page_size; ++row) {
      const std::int32_t t = b.row_token[i * page_size + row];
      if (t < 0) {
        EXPECT_EQ(t, empty) << where << ": page " << b.produce_pages[i] << " row " << row;
      }
    }
  }
  for (std::int64_t page : zeroed) EXPECT_EQ(index.count(page), 1U) << where << ": zeroed page " << page << " missing from the producer";
}

void expect_compose_entries(const cuda::BatchPlan& b, const std::string& where) {
  // Pre-signal entries first (pack, publish); after them, when there are any, the entries that wait
  // on a peer's flag (gather 2), so the warps that publish take them; else prefix pages first.
  const bool pre = !b.pack.empty() || !b.publish.empty();
  std::vector<std::pair<const std::vector<kernels::GatherEntry>*, std::int32_t>> order = {
      {&b.pack, kernels::kToCompact}, {&b.publish, kernels::kToStaging}, {&b.local_prefix, kernels::kToDense},
      {&b.gather1, kernels::kToDense}, {&b.gather2, kernels::kToDense}};
  if (pre) std::swap(order[2], order[4]);
  std::size_t at = 0;
  for (const auto& [list, dest] : order) {
    for (const kernels::GatherEntry& e : *list) {
      ASSERT_LT(at, b.compose.size()) << where;
      const kernels::GatherEntry& c = b.compose[at++];
      EXPECT_EQ(c.dst_page, e.dst_page) << where;
      EXPECT_EQ(c.src_page, e.src_page) << where;
      EXPECT_EQ(c.table_index, e.table_index) << where;
      EXPECT_EQ(c.dest, dest) << where;
    }
  }
  EXPECT_EQ(at, b.compose.size()) << where;
  EXPECT_EQ(static_cast<std::size_t>(b.compose_pre), b.pack.size() + b.publish.size()) << where;
}

TEST(GpuPlan, ProducerAndComposeListsKeepTheirContractsForEveryVariantAndRank) {
  for (const char* name : {"seeds_batch.jsonl", "mooncake_slice.jsonl", "tiny.jsonl"}) {
    harness::BatchSource source = harness::BatchSource::from_trace(std::string(CPKV_SOURCE_DIR) + "/traces/samples/" + name);
    for (std::int32_t cp : {2, source.setting.cp}) {
      source.setting.cp = cp;
      const std::int64_t staging_slots = model::staging_capacity(source.setting).staging_slots;
      const std::vector<model::Batch> batches = batches_of(source);
      for (model::Variant variant : model::kAllVariants) {
        if (model::splits_tokens(variant)) continue;  // section 12's producer writes send rows: EachRanksSendRows... below
        for (std::int32_t rank = 0; rank < cp; ++rank) {
          std::vector<bool> populated(source.setting.pool_pages_per_rank(), false);
          for (std::size_t i = 0; i < batches.size(); ++i) {
            const cuda::BatchPlan b = cuda::build_batch_plan(source.setting, batches[i], variant, rank, staging_slots, populated);
            if (b.overflow) continue;
            const std::string where = std::string(name) + " cp " + std::to_string(cp) + " " + std::string(model::to_string(variant)) + " rank " +
                                      std::to_string(rank) + " batch " + std::to_string(i);
            expect_produce_rows(b, source.setting.page_size, where);
            expect_compose_entries(b, where);
            if (HasFailure()) return;
          }
        }
      }
    }
  }
}

// Section 12's send rows, against the attention oracle written from sections 11 and 12 alone
// (model::rank_queries, which knows nothing of the plan): each rank sends exactly the tokens it
// computes, in its query order, then padding up to the largest rank's count, which is the
// all-gather's rows per rank.
void expect_send_rows(const model::Setting& setting, const model::Batch& batch, model::Variant variant, const std::string& where) {
  const model::QuerySplit split = model::info(variant).token_split == model::TokenSplit::zigzag ? model::QuerySplit::zigzag_tokens : model::QuerySplit::continuous_tokens;
  std::vector<std::vector<model::QueryToken>> queries;
  std::size_t most = 0;
  for (std::int32_t rank = 0; rank < setting.cp; ++rank) {
    queries.push_back(model::rank_queries(setting, batch, rank, split));
    most = std::max(most, queries.back().size());
  }
  for (std::int32_t rank = 0; rank < setting.cp; ++rank) {
    std::vector<bool> populated(setting.pool_pages_per_rank(), false);
    const cuda::BatchPlan b = cuda::build_batch_plan(setting, batch, variant, rank, model::staging_capacity(setting).staging_slots, populated);
    const cuda::SendRows send = cuda::token_send_rows(b.layout, batch, b.plan, rank);
    ASSERT_EQ(send.rows_per_rank, static_cast<std::int64_t>(most)) << where << " rank " << rank << ": rows per rank";
    ASSERT_EQ(send.request.size(), most) << where;
    for (std::size_t q = 0; q < most; ++q) {
      if (q >= queries[rank].size()) {
        EXPECT_EQ(send.request[q], -1) << where << " rank " << rank << " row " << q << ": padding";
        continue;
      }
      const model::QueryToken& t = queries[rank][q];
      EXPECT_EQ(send.request[q], t.request) << where << " rank " << rank << " row " << q;
      EXPECT_EQ(send.token[q], batch.requests[t.request].prefix_len + t.token) << where << " rank " << rank << " row " << q;
    }
  }
}

// What the GPU's layer does with them, on the host: every rank's send rows all-gathered (rank p's
// at p * rows_per_rank), then each current row of the batch taken from the gathered row the plan's
// reorder_source names. Every valid row of every current page must then hold its own token
// (section 3: page i's row o is token page_in_request * P + o of its request) and every row past a
// partial page's end none (-1: zero), so the producer, the all-gather's layout and the
// re-ordering agree on every rank.
void expect_gather_and_reorder(const model::Setting& setting, const model::Batch& batch, model::Variant variant, const std::string& where) {
  std::vector<std::pair<std::int32_t, std::int64_t>> gathered;  // (request, token) per gathered row
  cuda::BatchPlan b;
  for (std::int32_t rank = 0; rank < setting.cp; ++rank) {
    std::vector<bool> populated(setting.pool_pages_per_rank(), false);
    b = cuda::build_batch_plan(setting, batch, variant, rank, model::staging_capacity(setting).staging_slots, populated);
    const cuda::SendRows send = cuda::token_send_rows(b.layout, batch, b.plan, rank);
    for (std::size_t q = 0; q < send.request.size(); ++q) gathered.emplace_back(send.request[q], send.token[q]);
  }
  const std::int64_t P = setting.page_size;
  ASSERT_EQ(static_cast<std::int64_t>(b.plan.reorder_source.size()), b.layout.current_pages_total * P) << where;
  for (std::int64_t i = 0; i < b.layout.current_pages_total; ++i) {
    const model::CurrentPage& page = b.layout.current[i];
    for (std::int64_t o = 0; o < P; ++o) {
      const std::int64_t source = b.plan.reorder_source[i * P + o];
      if (o >= page.rows_valid) {
        EXPECT_EQ(source, -1) << where << ": current page " << i << " row " << o << " is past its end";
        continue;
      }
      ASSERT_GE(source, 0) << where << ": current page " << i << " row " << o;
      ASSERT_LT(source, static_cast<std::int64_t>(gathered.size())) << where;
      EXPECT_EQ(gathered[source].first, page.request) << where << ": current page " << i << " row " << o;
      EXPECT_EQ(gathered[source].second, batch.requests[page.request].prefix_len + page.page_in_request * P + o) << where << ": current page " << i << " row " << o;
    }
  }
}

// `check` over the first 8 batches of every bundled trace at each cp of `cps` (0: the trace's own)
// under both token-split variants; stops at the first failure.
template <typename Check>
void for_each_token_split_case(std::initializer_list<std::int32_t> cps, const Check& check) {
  for (const char* name : {"tiny.jsonl", "seeds_batch.jsonl", "mooncake_slice.jsonl"}) {
    harness::BatchSource source = harness::BatchSource::from_trace(std::string(CPKV_SOURCE_DIR) + "/traces/samples/" + name);
    const std::int32_t own_cp = source.setting.cp;
    for (std::int32_t cp : cps) {
      source.setting.cp = cp == 0 ? own_cp : cp;
      for (model::Variant variant : {model::Variant::allgather_zigzag, model::Variant::allgather_continuous}) {
        const std::vector<model::Batch> batches = batches_of(source);
        for (std::size_t i = 0; i < batches.size() && i < 8; ++i) {
          check(source.setting, batches[i], variant, fmt_where(name, source.setting.cp, variant, i));
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

TEST(GpuPlan, EveryTokenSentAllGatheredAndReorderedLandsAtItsOwnDenseRow) {
  for_each_token_split_case({2, 3, 4, 8}, [](const auto&... args) { expect_gather_and_reorder(args...); });
}

TEST(GpuPlan, EachRanksSendRowsAreItsTokenSplitQueriesPaddedToTheLargestRank) {
  for_each_token_split_case({2, 3, 0}, [](const auto&... args) { expect_send_rows(args...); });
}

}  // namespace
}  // namespace cpkv
