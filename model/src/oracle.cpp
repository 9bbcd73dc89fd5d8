// The plain oracle: PROTOCOL.md sections 2, 3 and 8 read line by line (see oracle.hpp for why it
// exists and what it shares).
#include "cpkv/model/oracle.hpp"

#include <algorithm>
#include <cstring>

#include "cpkv/model/content.hpp"

namespace cpkv::model::spec {

ByteOracle::ByteOracle(std::int32_t page_size, const Batch& batch) : page_size_(page_size) {
  const std::int64_t P = page_size;
  // Section 3: for r = 0..bs-1, the prefix span (prefix_len / P slots, slot k holds page_table[r][k]),
  // then the current span (C_r = ceil(extend_len / P) slots).
  for (std::size_t r = 0; r < batch.requests.size(); ++r) {
    const Request& request = batch.requests[r];
    const std::int64_t prefix_slots = request.prefix_len / P;
    for (std::int64_t k = 0; k < prefix_slots; ++k) {
      DenseSlot s;
      s.request = static_cast<std::int32_t>(r);
      s.prefix = true;
      s.logical_page = request.prefix_pages[static_cast<std::size_t>(k)];
      s.first_token = k * P;
      s.rows_valid = page_size;
      slots_.push_back(s);
    }
    const std::int64_t current_slots = (request.extend_len + P - 1) / P;
    for (std::int64_t k = 0; k < current_slots; ++k) {
      DenseSlot s;
      s.request = static_cast<std::int32_t>(r);
      s.prefix = false;
      s.first_token = request.prefix_len + k * P;
      s.rows_valid = static_cast<std::int32_t>(std::min(P, request.extend_len - k * P));
      s.current_index = current_pages_total_++;
      slots_.push_back(s);
    }
  }
}

void ByteOracle::row(std::uint64_t seed, std::int32_t layer, std::uint32_t kind, std::int64_t slot, std::int32_t row,
                     std::span<std::uint8_t> out) const {
  const DenseSlot& s = slots_[static_cast<std::size_t>(slot)];
  // Section 1: rows of padding or of tokens past the end are zero in every output.
  if (row >= s.rows_valid) {
    std::fill(out.begin(), out.end(), std::uint8_t{0});
    return;
  }
  // Section 8: a prefix row is the pool's content at its logical page; a current row is computed by
  // its writer from (layer, kind, request, token).
  const std::uint64_t key =
      s.prefix ? prefix_row_key(seed, static_cast<std::uint32_t>(layer), kind, static_cast<std::uint64_t>(s.logical_page),
                                static_cast<std::uint32_t>(row))
               : current_row_key(seed, static_cast<std::uint32_t>(layer), kind, static_cast<std::uint32_t>(s.request),
                                 static_cast<std::uint64_t>(s.first_token + row));
  for (std::size_t b = 0; b < out.size(); ++b) out[b] = content_byte(key, static_cast<std::uint32_t>(b));
}

std::optional<Mismatch> ByteOracle::check(std::span<const std::uint8_t> dense, std::uint64_t seed, std::int32_t layer,
                                          std::uint32_t kind, std::uint32_t row_bytes) const {
  std::vector<std::uint8_t> expected(row_bytes);
  Mismatch mismatch;
  for (std::int64_t slot = 0; slot < slot_count(); ++slot) {
    for (std::int32_t r = 0; r < page_size_; ++r) {
      const std::uint8_t* actual = dense.data() + (slot * page_size_ + r) * static_cast<std::int64_t>(row_bytes);
      row(seed, layer, kind, slot, r, expected);
      add_row_mismatches(actual, expected, slot, r, mismatch);
    }
  }
  if (mismatch.wrong_bytes == 0) return std::nullopt;
  return mismatch;
}

std::int32_t writer(SplitPolicy policy, std::int64_t page, std::int64_t pages, std::int64_t current_index, std::int32_t cp) {
  switch (policy) {
    case SplitPolicy::zigzag: {
      // 2*cp contiguous blocks; block j holds pages / (2cp) pages, plus one if j < pages % (2cp);
      // rank k takes blocks k and 2cp-1-k.
      const std::int64_t blocks = 2 * std::int64_t{cp};
      std::int64_t block_end = 0;
      for (std::int64_t j = 0; j < blocks; ++j) {
        block_end += pages / blocks + (j < pages % blocks ? 1 : 0);
        if (page < block_end) return static_cast<std::int32_t>(j < cp ? j : blocks - 1 - j);
      }
      return -1;  // page out of range: no writer
    }
    case SplitPolicy::contiguous:
      // Rank k takes pages [C*k/cp, C*(k+1)/cp).
      for (std::int32_t k = 0; k < cp; ++k) {
        if (page >= pages * k / cp && page < pages * (k + 1) / cp) return k;
      }
      return -1;
    case SplitPolicy::round_robin:
      // The page with batch current index i goes to rank i % cp.
      return static_cast<std::int32_t>(current_index % cp);
    case SplitPolicy::zigzag_tokens:
    case SplitPolicy::continuous_tokens:
      return -1;  // a token split's page writer needs the request's token count, not its page count
  }
  return -1;
}

std::int64_t staging_slots_from_caps(std::int64_t max_total_extend_tokens, std::int64_t max_batch_requests, std::int32_t page_size) {
  return (max_total_extend_tokens + page_size - 1) / page_size + max_batch_requests;
}

}  // namespace cpkv::model::spec
