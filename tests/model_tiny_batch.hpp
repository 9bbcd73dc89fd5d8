// The one small batch every model test works on, computed by hand from PROTOCOL.md (not from the
// model's output), so a reader can check each expectation on paper.
//
// Setting: cp = 2, P = 4, kinds kv_fp8 (656 B) + indexer_k (132 B, 'F' layers only), pattern "FS",
// pool_pages = 16, split zigzag. Sum of row bytes 788; page bytes 4*656 = 2624 (kv_fp8),
// 4*132 = 528 (indexer_k), 4*788 = 3152 (both).
//
// Requests:
//   r0: prefix_len 8, extend_len 6, prefix pages [5, 2]  -> C0 = ceil(6/4) = 2 current pages
//       sequence tokens: prefix 0..7, current 8..11 (page 0, full), 12..13 (page 1, 2 rows valid)
//   r1: prefix_len 0, extend_len 9                        -> C1 = ceil(9/4) = 3 current pages
//       sequence tokens: current 0..3, 4..7 (full), 8 (page 2, 1 row valid)
//
// Slots in merged-span order (section 3):
//   slot 0: r0 prefix, logical page 5 (owner 5 % 2 = 1, local page 5 / 2 = 2)
//   slot 1: r0 prefix, logical page 2 (owner 0, local page 1)
//   slot 2: r0 current page 0, current index 0
//   slot 3: r0 current page 1, current index 1 (rows_valid 2)
//   (r1 has an empty prefix span: it begins and ends at slot 4)
//   slot 4: r1 current page 0, current index 2
//   slot 5: r1 current page 1, current index 3
//   slot 6: r1 current page 2, current index 4 (rows_valid 1)
//   slot_count 7, current_pages_total 5.
//
// Zigzag writers (section 2), 2*cp = 4 blocks, rank k takes blocks k and 3-k:
//   r0, C = 2: block sizes 1,1,0,0 -> page 0 in block 0 (rank 0), page 1 in block 1 (rank 1)
//   r1, C = 3: block sizes 1,1,1,0 -> page 0 block 0 (rank 0), page 1 block 1 (rank 1),
//              page 2 block 2 (rank 1, since 2 = 2*cp-1-1)
//   writers by current index: [0, 1, 0, 1, 1]; rank 0 writes indices {0, 2}, rank 1 {1, 3, 4}.
//   round_robin would give [0, 1, 0, 1, 0] (index % 2).
//
// staging_direct descriptors (section 5), table of 2*cp = 4 entries:
//   slot 0: (5 % 2, 5 / 2) = (1, 2)     slot 1: (2 % 2, 2 / 2) = (0, 1)
//   slot 2: (cp + 0, 0) = (2, 0)        slot 3: (cp + 1, 1) = (3, 1)
//   slot 4: (2, 2)    slot 5: (3, 3)    slot 6: (3, 4)
#pragma once

#include <cstdint>
#include <ostream>

#include "cpkv/model/batch.hpp"
#include "cpkv/model/plan.hpp"
#include "cpkv/model/setting.hpp"

namespace cpkv::model {

// Readable GoogleTest failure output for plan values (found by argument-dependent lookup).
inline void PrintTo(const SlotDescriptor& d, std::ostream* os) {
  *os << "(" << d.table_index << ", " << d.source_page << ")";
}
inline void PrintTo(const SlotRange& r, std::ostream* os) {
  *os << "[" << r.slot_begin << ", " << r.slot_end << ")";
}

}  // namespace cpkv::model

namespace cpkv::model::testing {

inline constexpr std::uint32_t kKvFp8RowBytes = 656;
inline constexpr std::uint32_t kIndexerRowBytes = 132;
inline constexpr std::uint64_t kKvPageBytes = 4 * 656;        // 2624
inline constexpr std::uint64_t kBothKindsPageBytes = 4 * 788;  // 3152

inline Setting tiny_setting() {
  Setting setting;
  setting.cp = 2;
  setting.page_size = 4;
  setting.kinds = {*find_buffer_kind("kv_fp8"), *find_buffer_kind("indexer_k")};
  setting.layer_pattern = "FS";
  setting.pool_pages = 16;
  setting.split = SplitPolicy::zigzag;
  return setting;
}

inline Batch tiny_batch() {
  Batch batch;
  batch.requests.push_back(Request{.prefix_len = 8, .extend_len = 6, .prefix_pages = {5, 2}});
  batch.requests.push_back(Request{.prefix_len = 0, .extend_len = 9, .prefix_pages = {}});
  return batch;
}

}  // namespace cpkv::model::testing
