// cpkv's own fused compose as an exchange plugin (gpu/fused/), checked without a GPU: the shared
// object passes the loader's checks, names itself 'fused', lists every variant of
// model::kVariantTable (section 12's token-split all-gathers included) and, as the planted bugs it holds, exactly the
// rows of harness::kMutantTable the GPU holds and invariant 9's three; it exports cpkv_exchange_v1 and nothing else (nm -D);
// the built-in table the cuda backend registers is the same table, reached as `builtin`.
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli_run.hpp"
#include "cpkv/harness/exchange_plugin.hpp"
#include "cpkv/harness/request.hpp"
#include "cuda_backend.hpp"

namespace cpkv {
namespace {

std::vector<model::Variant> every_variant() {
  std::vector<model::Variant> out;
  for (const model::VariantInfo& row : model::kVariantTable) out.push_back(row.variant);
  return out;
}

std::vector<std::string> held_mutants() {
  std::vector<std::string> out;
  for (const harness::MutantInfo& row : harness::kMutantTable) {
    if (row.mutant != harness::Mutant::none && (row.backends & harness::kGpuHolds) != 0) out.emplace_back(row.name);
  }
  // and the three of invariant 9, in the attention plan it returns (PROTOCOL.md section 9).
  for (const char* name : {"batch_as_one_sequence", "causal_off_by_one", "key_base_skips_prefix"}) out.emplace_back(name);
  return out;
}

void expect_fused_table(const harness::ExchangePlugin& plugin) {
  EXPECT_EQ(plugin.name, "fused");
  EXPECT_EQ(plugin.variants, every_variant()) << "every variant the cuda backend runs, in kVariantTable order";
  EXPECT_TRUE(plugin.implements(model::Variant::allgather_zigzag)) << "section 12's all-gathers run on the GPU too";
  EXPECT_TRUE(plugin.implements(model::Variant::allgather_continuous));
  EXPECT_EQ(plugin.mutants, held_mutants()) << "the GPU's planted bugs and invariant 9's, held by the plugin itself";
  EXPECT_EQ(plugin.uses, CPKV_USES_PRODUCE) << "cpkv's producer writes its rows where it fills (no copy through ctx->rows), and it plans the batch itself";
  EXPECT_EQ(plugin.table->flags, CPKV_FLAG_REPLAYABLE | CPKV_FLAG_ATTENTION_PLAN)
      << "its layers replay as a CUDA graph (the barrier phase lives on the device), and it returns its attention plan";
  ASSERT_NE(plugin.parts, nullptr) << "it offers the bench's parts (revision 4's table tail): the bench takes cpkv's own layer apart through it";
  EXPECT_EQ(plugin.parts->offered, (1u << CPKV_PART_COUNT) - 1) << "every part";
}

TEST(FusedPlugin, TheSharedObjectPassesTheLoadersChecksWithEveryVariantAndTheGpuPlantedBugs) {
  const auto plugin = harness::load_exchange_plugin(CPKV_FUSED_PLUGIN);
  expect_fused_table(*plugin);
  EXPECT_FALSE(plugin->builtin);
}

TEST(FusedPlugin, TheSharedObjectExportsOnlyTheTable) {
  FILE* nm = ::popen(fmt::format("nm -D --defined-only '{}'", CPKV_FUSED_PLUGIN).c_str(), "r");
  ASSERT_NE(nm, nullptr);
  std::set<std::string> defined;
  char line[1024];
  while (std::fgets(line, sizeof(line), nm) != nullptr) {
    std::string text(line);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    const std::size_t space = text.rfind(' ');
    if (space != std::string::npos) defined.insert(text.substr(space + 1));
  }
  ASSERT_EQ(::pclose(nm), 0) << "nm -D failed on " << CPKV_FUSED_PLUGIN;
  EXPECT_EQ(defined, std::set<std::string>{CPKV_EXCHANGE_SYMBOL});
}

TEST(FusedPlugin, TheBuiltinTableIsRegisteredWithTheCudaBackendAndIsTheSameTable) {
  EXPECT_THROW(
      {
        try {
          harness::find_exchange("builtin");
        } catch (const harness::RequestError& e) {
          EXPECT_NE(e.reason().find("this build lacks"), std::string::npos) << e.reason();
          throw;
        }
      },
      harness::RequestError)
      << "before the cuda backend registers it, 'builtin' is refused with its reason";
  harness::Registry registry;
  cuda::register_backend(registry);
  const auto builtin = harness::find_exchange("builtin");
  expect_fused_table(*builtin);
  EXPECT_TRUE(builtin->builtin);
  EXPECT_EQ(harness::find_exchange("builtin"), builtin) << "registration is kept, not repeated";
  harness::Registry again;
  cuda::register_backend(again);
  EXPECT_EQ(harness::find_exchange("builtin"), builtin);
}

}  // namespace
}  // namespace cpkv
