// A violation's one line says where in words: a field that does not apply is left out instead of
// printed as -1 (issue 25, item 4: "slot -1", "batch -1 layer -1 step -1" told a user nothing).
#include <cstring>

#include <gtest/gtest.h>

#include "cpkv/harness/run.hpp"

namespace cpkv::harness {
namespace {

Violation violation(std::int32_t invariant, std::int32_t rank, std::int64_t batch, std::int32_t layer, std::int64_t slot, std::int64_t step) {
  Violation v;
  v.invariant = invariant;
  v.rank = rank;
  v.batch = batch;
  v.layer = layer;
  v.slot = slot;
  v.step = step;
  std::strncpy(v.detail, "what happened", sizeof(v.detail) - 1);
  return v;
}

TEST(HarnessDescribe, EveryFieldThatAppliesIsNamedAndNoneIsPrintedAsMinusOne) {
  EXPECT_EQ(describe(violation(2, 1, 0, 1, 3, 25)),
            "invariant 2 (parity-half reuse safety): rank 1 batch 0 layer 1 slot 3 step 25: what happened");
  EXPECT_EQ(describe(violation(5, 0, 1, -1, -1, 10)), "invariant 5 (plan invariance): rank 0 batch 1 step 10: what happened");
  EXPECT_EQ(describe(violation(4, 1, -1, -1, -1, -1)), "invariant 4 (barrier phase safety): rank 1 at the end of the run: what happened");
  for (const auto& v : {violation(1, 0, 0, 0, -1, 9), violation(4, 1, -1, -1, -1, -1), violation(3, 0, 0, -1, -1, 6)}) {
    EXPECT_EQ(describe(v).find("-1"), std::string::npos) << describe(v);
  }
}

}  // namespace
}  // namespace cpkv::harness
