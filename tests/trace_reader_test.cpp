// The batch-trace format, version 1 (traces/README.md): the samples read back with the values
// written in them, what the writer writes the reader reads, and every malformed input is refused
// with one line `FILE:LINE: FIELD: REASON` naming the right line and field.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cpkv/model/limits.hpp"
#include "cpkv/model/setting.hpp"
#include "cpkv/traces/trace.hpp"

namespace cpkv::traces {
namespace {

using nlohmann::json;

std::string source_dir() {
  const char* dir = std::getenv("CPKV_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

std::unique_ptr<std::istream> stream_of(const std::string& text) {
  return std::make_unique<std::istringstream>(text);
}

std::vector<std::int64_t> pages(std::initializer_list<std::int64_t> ids) { return ids; }

// A valid header and batch to break one field at a time.
json good_header() {
  return json::parse(R"({"format":"cpkv-batch-trace","version":1,"cp":2,"page_size":4,
    "buffer_kinds":["kv_fp8","indexer_k"],"layers":{"count":2,"pattern":"FS"},"pool_pages":16,
    "split":"zigzag","caps":{"max_total_extend_tokens":16,"max_batch_requests":2,"staging_mib":null},
    "source":{"kind":"test"}})");
}

json good_batch(std::int64_t index) {
  json batch = json::parse(R"({"batch":0,"requests":[{"prefix_len":8,"extend_len":6,"prefix_pages":[5,2]},
    {"prefix_len":0,"extend_len":9,"prefix_pages":[]}]})");
  batch["batch"] = index;
  return batch;
}

std::string lines(const std::vector<json>& objects) {
  std::string text;
  for (const json& object : objects) text += object.dump() + "\n";
  return text;
}

std::string with_header_change(const std::function<void(json&)>& change) {
  json header = good_header();
  change(header);
  return lines({header, good_batch(0)});
}

// The second batch (line 3) is broken; the first is fine, so the line number has to be counted.
std::string with_batch_change(const std::function<void(json&)>& change) {
  json batch = good_batch(1);
  change(batch);
  return lines({good_header(), good_batch(0), batch});
}

// Reads every batch of `text` and returns the error it must raise, after checking the parts every
// error shares: the file name, the line, and one line of text that starts with them.
TraceError refusal_at(const std::string& text, std::int64_t line) {
  try {
    TraceReader reader(stream_of(text), "bad.jsonl");
    while (reader.next()) {
    }
  } catch (const TraceError& error) {
    const std::string message = error.what();
    EXPECT_EQ(error.file(), "bad.jsonl");
    EXPECT_EQ(error.line(), line) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(message.find('\r'), std::string::npos) << message;
    EXPECT_EQ(message, "bad.jsonl:" + std::to_string(line) + ": " + error.field() + ": " + error.reason());
    // The issue's cap: about 300 characters of field and reason, whatever the line holds (each
    // part at most its limit plus the "... (N bytes)" that says it was cut).
    EXPECT_LE(error.field().size(), limits::error_field_bytes + 22) << message.substr(0, 400);
    EXPECT_LE(error.reason().size(), limits::error_reason_bytes + 22) << message.substr(0, 400);
    return error;
  }
  ADD_FAILURE() << "the trace was accepted:\n" << text.substr(0, 1000);
  return TraceError("", 0, "", "");
}

// refusal_at(), and the error names `field`.
TraceError refusal(const std::string& text, std::int64_t line, const std::string& field) {
  TraceError error = refusal_at(text, line);
  EXPECT_EQ(error.field(), field) << error.what();
  return error;
}

// --- The samples -----------------------------------------------------------------------------

// The tiny sample is the hand calculation of the CLI tests: its values must be exactly these.
TEST(TraceSamples, TinySampleReadsBackTheHandWrittenValues) {
  TraceReader reader(source_dir() + "/traces/samples/tiny.jsonl");
  const model::Setting& setting = reader.header().setting;
  EXPECT_EQ(setting.cp, 2);
  EXPECT_EQ(setting.page_size, 4);
  ASSERT_EQ(setting.kinds.size(), 2u);
  EXPECT_EQ(setting.kinds[0].name, "kv_fp8");
  EXPECT_EQ(setting.kinds[0].row_bytes, 656u);
  EXPECT_EQ(setting.kinds[1].name, "indexer_k");
  EXPECT_EQ(setting.kinds[1].row_bytes, 132u);
  EXPECT_EQ(setting.layer_pattern, "FS");
  EXPECT_EQ(setting.pool_pages, 16);
  EXPECT_EQ(setting.split, model::SplitPolicy::zigzag);
  EXPECT_EQ(setting.caps.max_total_extend_tokens, 16);
  EXPECT_EQ(setting.caps.max_batch_requests, 2);
  EXPECT_FALSE(setting.caps.staging_mib_override.has_value());
  EXPECT_EQ(reader.header().source.at("kind"), "hand-written");

  std::optional<model::Batch> batch = reader.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(reader.batch_index(), 0);
  EXPECT_EQ(reader.line(), 2);
  ASSERT_EQ(batch->requests.size(), 2u);
  EXPECT_EQ(batch->requests[0].prefix_len, 8);
  EXPECT_EQ(batch->requests[0].extend_len, 6);
  EXPECT_EQ(batch->requests[0].prefix_pages, pages({5, 2}));
  EXPECT_EQ(batch->requests[1].prefix_len, 0);
  EXPECT_EQ(batch->requests[1].extend_len, 9);
  EXPECT_TRUE(batch->requests[1].prefix_pages.empty());

  batch = reader.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(reader.batch_index(), 1);
  ASSERT_EQ(batch->requests.size(), 1u);
  EXPECT_EQ(batch->requests[0].prefix_len, 4);
  EXPECT_EQ(batch->requests[0].extend_len, 1);
  EXPECT_EQ(batch->requests[0].prefix_pages, pages({7}));

  // Batch 2 overflows staging (4 + 4 current pages > ceil(16/4) + 2 = 6 slots): that is a verdict
  // for `plan`, not an input error, so the reader must hand it over.
  batch = reader.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(reader.batch_index(), 2);
  ASSERT_EQ(batch->requests.size(), 2u);
  EXPECT_EQ(batch->requests[0].prefix_len, 0);
  EXPECT_EQ(batch->requests[0].extend_len, 16);
  EXPECT_EQ(batch->requests[1].prefix_len, 0);
  EXPECT_EQ(batch->requests[1].extend_len, 13);

  EXPECT_FALSE(reader.next().has_value());
  EXPECT_EQ(reader.line(), 4);
  EXPECT_FALSE(reader.next().has_value());
}

// The seeds' sample must keep the shape the benchmarks compare against: cp 8, P 64, 61 full
// layers, 12 requests with 44,600 extend tokens, each with a cached prefix on scattered pages.
TEST(TraceSamples, SeedsBatchHasTheTracedScenarioShape) {
  TraceReader reader(source_dir() + "/traces/samples/seeds_batch.jsonl");
  const model::Setting& setting = reader.header().setting;
  EXPECT_EQ(setting.cp, 8);
  EXPECT_EQ(setting.page_size, 64);
  ASSERT_EQ(setting.kinds.size(), 2u);
  EXPECT_EQ(setting.kinds[0].name, "kv_fp8");
  EXPECT_EQ(setting.kinds[1].name, "indexer_k");
  EXPECT_EQ(setting.layer_pattern, std::string(61, 'F'));
  EXPECT_EQ(setting.caps.max_total_extend_tokens, 49152);
  EXPECT_EQ(setting.caps.max_batch_requests, 16);

  std::optional<model::Batch> batch = reader.next();
  ASSERT_TRUE(batch.has_value());
  ASSERT_EQ(batch->requests.size(), 12u);
  std::int64_t extend_tokens_total = 0;
  std::int64_t partial_last_pages = 0;
  std::set<std::int64_t> distinct_pages;
  std::size_t page_ids_total = 0;
  for (const model::Request& request : batch->requests) {
    extend_tokens_total += request.extend_len;
    partial_last_pages += request.extend_len % 64 != 0 ? 1 : 0;
    EXPECT_GT(request.prefix_len, 0);
    EXPECT_GT(request.prefix_len, request.extend_len / 2);
    EXPECT_LT(request.prefix_len, request.extend_len * 2 + 64);
    distinct_pages.insert(request.prefix_pages.begin(), request.prefix_pages.end());
    page_ids_total += request.prefix_pages.size();
  }
  EXPECT_EQ(extend_tokens_total, 44600);
  EXPECT_GE(partial_last_pages, 3);
  EXPECT_EQ(distinct_pages.size(), page_ids_total) << "prefix pages are drawn without replacement";
  EXPECT_FALSE(reader.next().has_value());
}

// --- The writer ------------------------------------------------------------------------------

// Whatever the writer writes, the reader gives back unchanged, including the optional fields.
TEST(TraceWriter, WrittenTraceReadsBackFieldForField) {
  TraceHeader header;
  header.setting.cp = 3;
  header.setting.page_size = 16;
  header.setting.kinds = {*model::find_buffer_kind("kv_bf16"), *model::find_buffer_kind("indexer_k")};
  header.setting.layer_pattern = "FSSF";
  header.setting.pool_pages = 1000;
  header.setting.split = model::SplitPolicy::round_robin;
  header.setting.caps.staging_mib_override = 3;
  header.source = {{"kind", "test"}, {"nested", {{"list", {1, 2, 3}}}}};

  std::vector<model::Batch> batches(3);
  batches[0].requests = {{32, 5, {999, 0}}, {0, 17, {}}};
  batches[1].requests = {{16, 16, {500}}};
  batches[2].requests = {{0, 1, {}}, {48, 100, {3, 2, 1}}, {0, 2, {}}};

  std::ostringstream out;
  TraceWriter writer(out, header);
  for (const model::Batch& batch : batches) writer.write(batch);

  TraceReader reader(stream_of(out.str()), "written.jsonl");
  const model::Setting& setting = reader.header().setting;
  EXPECT_EQ(setting.cp, 3);
  EXPECT_EQ(setting.page_size, 16);
  ASSERT_EQ(setting.kinds.size(), 2u);
  EXPECT_EQ(setting.kinds[0].name, "kv_bf16");
  EXPECT_EQ(setting.kinds[1].name, "indexer_k");
  EXPECT_EQ(setting.layer_pattern, "FSSF");
  EXPECT_EQ(setting.pool_pages, 1000);
  EXPECT_EQ(setting.split, model::SplitPolicy::round_robin);
  EXPECT_FALSE(setting.caps.max_total_extend_tokens.has_value());
  EXPECT_FALSE(setting.caps.max_batch_requests.has_value());
  EXPECT_EQ(setting.caps.staging_mib_override, 3);
  EXPECT_EQ(reader.header().source, header.source);
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const std::optional<model::Batch> batch = reader.next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(reader.batch_index(), static_cast<std::int64_t>(b));
    ASSERT_EQ(batch->requests.size(), batches[b].requests.size());
    for (std::size_t r = 0; r < batches[b].requests.size(); ++r) {
      EXPECT_EQ(batch->requests[r].prefix_len, batches[b].requests[r].prefix_len);
      EXPECT_EQ(batch->requests[r].extend_len, batches[b].requests[r].extend_len);
      EXPECT_EQ(batch->requests[r].prefix_pages, batches[b].requests[r].prefix_pages);
    }
  }
  EXPECT_FALSE(reader.next().has_value());
}

// JSON Lines: one compact object per line, the header first, batches numbered from 0.
TEST(TraceWriter, WritesOneCompactLinePerObject) {
  TraceHeader header;
  header.setting.cp = 2;
  header.setting.page_size = 4;
  header.setting.kinds = {*model::find_buffer_kind("kv_fp8")};
  header.setting.layer_pattern = "F";
  header.setting.pool_pages = 8;
  std::ostringstream out;
  TraceWriter writer(out, header);
  model::Batch batch;
  batch.requests = {{4, 3, {6}}};
  writer.write(batch);
  writer.write(batch);

  std::istringstream in(out.str());
  std::vector<std::string> text_lines;
  for (std::string line; std::getline(in, line);) text_lines.push_back(line);
  ASSERT_EQ(text_lines.size(), 3u);
  EXPECT_EQ(json::parse(text_lines[0]).at("format"), "cpkv-batch-trace");
  EXPECT_EQ(text_lines[1], R"({"batch":0,"requests":[{"extend_len":3,"prefix_len":4,"prefix_pages":[6]}]})");
  EXPECT_EQ(json::parse(text_lines[2]).at("batch"), 1);
}

// A writer that wrote what its reader refuses would produce traces nobody can replay.
TEST(TraceWriter, RefusesABatchTheReaderWouldRefuse) {
  TraceHeader header;
  header.setting.cp = 2;
  header.setting.page_size = 4;
  header.setting.kinds = {*model::find_buffer_kind("kv_fp8")};
  header.setting.layer_pattern = "F";
  header.setting.pool_pages = 8;
  std::ostringstream out;
  TraceWriter writer(out, header);
  model::Batch batch;
  batch.requests = {{4, 3, {8}}};  // page 8 is outside a pool of 8 pages
  EXPECT_THROW(writer.write(batch), std::invalid_argument);

  header.setting.page_size = 3;
  std::ostringstream other;
  EXPECT_THROW(TraceWriter(other, header), std::invalid_argument);
}

// --- Bad input: each case names its file, line and field in one line ---------------------------

TEST(TraceBadInput, ErrorMessageIsFileLineFieldReason) {
  json header = good_header();
  header["page_size"] = 64;
  header["pool_pages"] = 1000;
  json batch = json::parse(R"({"batch":1,"requests":[{"prefix_len":64,"extend_len":1,"prefix_pages":[3]},
    {"prefix_len":100,"extend_len":1,"prefix_pages":[1]}]})");
  json first = batch;
  first["batch"] = 0;
  first["requests"].erase(1);
  const TraceError error = refusal(lines({header, first, batch}), 3, "requests[1].prefix_len");
  EXPECT_STREQ(error.what(), "bad.jsonl:3: requests[1].prefix_len: 100 is not a multiple of page_size 64");
}

TEST(TraceBadInput, MalformedJsonIsRefusedAsFieldJson) {
  const std::string text = lines({good_header(), good_batch(0)}) + R"({"batch":1,"requests":[)" + "\n";
  const TraceError error = refusal(text, 3, "json");
  EXPECT_NE(error.reason().find("invalid JSON"), std::string::npos) << error.what();
}

TEST(TraceBadInput, TrailingTextAfterTheObjectIsRefused) {
  refusal(good_header().dump() + " {}\n", 1, "json");
}

TEST(TraceBadInput, LineThatIsNotAnObjectIsRefused) {
  refusal(lines({good_header(), json::array({1, 2})}), 2, "json");
}

TEST(TraceBadInput, BlankLineIsRefused) {
  refusal(lines({good_header(), good_batch(0)}) + "\n" + lines({good_batch(1)}), 3, "json");
  refusal(lines({good_header()}) + "  \t\n", 2, "json");
}

TEST(TraceBadInput, EmptyFileIsRefusedForItsMissingHeader) {
  const TraceError error = refusal("", 1, "header");
  EXPECT_NE(error.reason().find("empty"), std::string::npos);
}

TEST(TraceBadInput, BatchLineInPlaceOfTheHeaderIsRefused) {
  refusal(lines({good_batch(0)}), 1, "format");
}

TEST(TraceBadInput, MissingHeaderFieldIsRefused) {
  refusal(with_header_change([](json& h) { h.erase("cp"); }), 1, "cp");
  refusal(with_header_change([](json& h) { h.erase("pool_pages"); }), 1, "pool_pages");
  refusal(with_header_change([](json& h) { h["layers"].erase("pattern"); }), 1, "layers.pattern");
  refusal(with_header_change([](json& h) { h.erase("version"); }), 1, "version");
}

TEST(TraceBadInput, NullRequiredFieldIsRefusedAsMissing) {
  refusal(with_header_change([](json& h) { h["page_size"] = nullptr; }), 1, "page_size");
}

TEST(TraceBadInput, MissingBatchFieldIsRefused) {
  refusal(with_batch_change([](json& b) { b["requests"][1].erase("extend_len"); }), 3, "requests[1].extend_len");
  refusal(with_batch_change([](json& b) { b["requests"][0].erase("prefix_pages"); }), 3, "requests[0].prefix_pages");
  refusal(with_batch_change([](json& b) { b.erase("batch"); }), 3, "batch");
}

TEST(TraceBadInput, WrongTypeIsRefused) {
  refusal(with_header_change([](json& h) { h["cp"] = "2"; }), 1, "cp");
  refusal(with_header_change([](json& h) { h["buffer_kinds"] = "kv_fp8"; }), 1, "buffer_kinds");
  refusal(with_header_change([](json& h) { h["layers"] = "FS"; }), 1, "layers");
  refusal(with_header_change([](json& h) { h["source"] = "hand"; }), 1, "source");
  refusal(with_batch_change([](json& b) { b["requests"][0]["prefix_pages"] = 5; }), 3, "requests[0].prefix_pages");
  refusal(with_batch_change([](json& b) { b["requests"][0]["extend_len"] = true; }), 3, "requests[0].extend_len");
  refusal(with_batch_change([](json& b) { b["requests"][1] = json::array(); }), 3, "requests[1]");
}

TEST(TraceBadInput, NonIntegerNumberIsRefused) {
  const TraceError error = refusal(with_batch_change([](json& b) { b["requests"][0]["extend_len"] = 1.5; }), 3,
                                   "requests[0].extend_len");
  EXPECT_NE(error.reason().find("integer"), std::string::npos) << error.what();
  refusal(with_header_change([](json& h) { h["page_size"] = 4.0; }), 1, "page_size");
}

TEST(TraceBadInput, NegativeNumberIsRefused) {
  refusal(with_batch_change([](json& b) { b["requests"][1]["prefix_len"] = -4; }), 3, "requests[1].prefix_len");
  refusal(with_batch_change([](json& b) { b["requests"][0]["prefix_pages"][1] = -1; }), 3, "requests[0].prefix_pages[1]");
  refusal(with_header_change([](json& h) { h["pool_pages"] = -16; }), 1, "pool_pages");
  refusal(with_header_change([](json& h) { h["caps"]["max_batch_requests"] = -1; }), 1, "caps.max_batch_requests");
  refusal(with_header_change([](json& h) { h["cp"] = -2; }), 1, "cp");
}

TEST(TraceBadInput, NumberBeyond64BitsIsRefused) {
  const std::string text = lines({good_header()}) + R"({"batch":0,"requests":[{"prefix_len":18446744073709551615,"extend_len":1,"prefix_pages":[]}]})" "\n";
  refusal(text, 2, "requests[0].prefix_len");
}

TEST(TraceBadInput, PrefixLengthNotAPageMultipleIsRefused) {
  const TraceError error = refusal(with_batch_change([](json& b) { b["requests"][0]["prefix_len"] = 6; }), 3,
                                   "requests[0].prefix_len");
  EXPECT_NE(error.reason().find("multiple of page_size 4"), std::string::npos) << error.what();
}

TEST(TraceBadInput, PrefixPageCountThatDisagreesWithPrefixLengthIsRefused) {
  refusal(with_batch_change([](json& b) { b["requests"][0]["prefix_pages"] = {5}; }), 3, "requests[0].prefix_pages");
  refusal(with_batch_change([](json& b) { b["requests"][1]["prefix_pages"] = {1}; }), 3, "requests[1].prefix_pages");
}

TEST(TraceBadInput, PageIdOutsideThePoolIsRefused) {
  const TraceError error = refusal(with_batch_change([](json& b) { b["requests"][0]["prefix_pages"][1] = 16; }), 3,
                                   "requests[0].prefix_pages[1]");
  EXPECT_NE(error.reason().find("outside the pool"), std::string::npos) << error.what();
}

TEST(TraceBadInput, CpOutsideOneToCpMaxIsRefused) {
  refusal(with_header_change([](json& h) { h["cp"] = 0; }), 1, "cp");
  refusal(with_header_change([](json& h) { h["cp"] = model::limits::cp_max + 1; }), 1, "cp");
  refusal(with_header_change([](json& h) { h["cp"] = std::int64_t{1} << 40; }), 1, "cp");
}

TEST(TraceBadInput, PageSizeNotAPowerOfTwoOrTooLargeIsRefused) {
  const TraceError error = refusal(with_header_change([](json& h) { h["page_size"] = 6; }), 1, "page_size");
  EXPECT_NE(error.reason().find("power of two"), std::string::npos) << error.what();
  refusal(with_header_change([](json& h) { h["page_size"] = 0; }), 1, "page_size");
  refusal(with_header_change([](json& h) { h["page_size"] = model::limits::page_size_max * 2; }), 1, "page_size");
}

TEST(TraceBadInput, UnknownBufferKindIsRefused) {
  const TraceError error =
      refusal(with_header_change([](json& h) { h["buffer_kinds"][1] = "indexer_q"; }), 1, "buffer_kinds[1]");
  EXPECT_NE(error.reason().find("indexer_q"), std::string::npos) << error.what();
  refusal(with_header_change([](json& h) { h["buffer_kinds"] = json::array(); }), 1, "buffer_kinds");
}

TEST(TraceBadInput, UnknownFormatNameIsRefused) {
  refusal(with_header_change([](json& h) { h["format"] = "cpkv-trace"; }), 1, "format");
}

TEST(TraceBadInput, UnknownFormatVersionIsRefusedBeforeItsKeys) {
  // A newer file may carry keys this reader does not know; the version is the error to report.
  const TraceError error = refusal(with_header_change([](json& h) {
                                     h["version"] = 2;
                                     h["new_key"] = 1;
                                   }),
                                   1, "version");
  EXPECT_NE(error.reason().find("unsupported version 2"), std::string::npos) << error.what();
}

TEST(TraceBadInput, LayerPatternWithAnotherCharacterIsRefused) {
  refusal(with_header_change([](json& h) { h["layers"]["pattern"] = "FX"; }), 1, "layers.pattern");
  refusal(with_header_change([](json& h) { h["layers"]["pattern"] = "fs"; }), 1, "layers.pattern");
}

TEST(TraceBadInput, LayerPatternLengthOtherThanCountIsRefused) {
  refusal(with_header_change([](json& h) { h["layers"]["pattern"] = "FSF"; }), 1, "layers.pattern");
  refusal(with_header_change([](json& h) { h["layers"]["count"] = 1; }), 1, "layers.pattern");
}

TEST(TraceBadInput, ExtendLengthBelowOneIsRefused) {
  refusal(with_batch_change([](json& b) { b["requests"][1]["extend_len"] = 0; }), 3, "requests[1].extend_len");
}

TEST(TraceBadInput, BatchWithoutRequestsIsRefused) {
  refusal(with_batch_change([](json& b) { b["requests"] = json::array(); }), 3, "requests");
}

TEST(TraceBadInput, BatchNumberOutOfOrderIsRefused) {
  refusal(with_batch_change([](json& b) { b["batch"] = 2; }), 3, "batch");
  refusal(with_batch_change([](json& b) { b["batch"] = 0; }), 3, "batch");
}

TEST(TraceBadInput, UnknownKeyIsRefused) {
  refusal(with_header_change([](json& h) { h["comment"] = "x"; }), 1, "comment");
  refusal(with_header_change([](json& h) { h["caps"]["max_running_requests"] = 4; }), 1, "caps.max_running_requests");
  refusal(with_header_change([](json& h) { h["layers"]["kinds"] = "F"; }), 1, "layers.kinds");
  refusal(with_batch_change([](json& b) { b["requests"][1]["suffix_len"] = 0; }), 3, "requests[1].suffix_len");
  refusal(with_batch_change([](json& b) { b["time_ms"] = 0; }), 3, "time_ms");
}

TEST(TraceBadInput, DuplicateKeyIsRefused) {
  const std::string text = lines({good_header()}) + R"({"batch":0,"batch":0,"requests":[]})" "\n";
  refusal(text, 2, "batch");
}

TEST(TraceBadInput, UnknownSplitPolicyIsRefused) {
  refusal(with_header_change([](json& h) { h["split"] = "token"; }), 1, "split");
}

TEST(TraceBadInput, InvalidCapIsRefused) {
  refusal(with_header_change([](json& h) { h["caps"]["staging_mib"] = 0; }), 1, "caps.staging_mib");
}

TEST(TraceBadInput, MessageStaysOneLineWhenTheInputHoldsNewlines) {
  // The key decodes to "a<newline>b": the message must still be one line.
  const std::string text = lines({good_header()}) + R"({"batch":0,"a\nb":1})" "\n";
  const TraceError error = refusal(text, 2, "a b");
  EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos);
}

TEST(TraceBadInput, BatchesBeforeTheBadLineAreReadFirst) {
  // Streaming: the reader hands out good batches until it reaches the bad line.
  json bad = good_batch(2);
  bad["requests"][0]["extend_len"] = -1;
  TraceReader reader(stream_of(lines({good_header(), good_batch(0), good_batch(1), bad})), "bad.jsonl");
  EXPECT_TRUE(reader.next().has_value());
  EXPECT_TRUE(reader.next().has_value());
  try {
    reader.next();
    ADD_FAILURE() << "the bad batch was accepted";
  } catch (const TraceError& error) {
    EXPECT_EQ(error.line(), 4);
    EXPECT_EQ(error.field(), "requests[0].extend_len");
  }
}

TEST(TraceBadInput, MissingFileIsRefusedNamingTheFile) {
  try {
    TraceReader reader(source_dir() + "/traces/samples/no-such-trace.jsonl");
    ADD_FAILURE() << "a missing file was opened";
  } catch (const TraceError& error) {
    EXPECT_EQ(error.field(), "file");
    EXPECT_NE(std::string(error.what()).find("no-such-trace.jsonl:0: file: cannot open"), std::string::npos)
        << error.what();
  }
}

// --- The two readings of a batch line agree (trace.cpp: the fast path, the DOM path on any doubt) -

void expect_same_batch(const model::Batch& actual, const model::Batch& expected, const std::string& context) {
  ASSERT_EQ(actual.requests.size(), expected.requests.size()) << context;
  for (std::size_t r = 0; r < expected.requests.size(); ++r) {
    EXPECT_EQ(actual.requests[r].prefix_len, expected.requests[r].prefix_len) << context;
    EXPECT_EQ(actual.requests[r].extend_len, expected.requests[r].extend_len) << context;
    EXPECT_EQ(actual.requests[r].prefix_pages, expected.requests[r].prefix_pages) << context;
  }
}

// A batch line written by hand rather than by nlohmann (which sorts keys): keys in a random order
// and random JSON whitespace between tokens.
std::string scrambled_line(const model::Batch& batch, std::int64_t index, std::mt19937_64& rng) {
  const auto space = [&rng]() -> std::string {
    static const char* const kSpaces[] = {"", "", "", " ", "\t", "  ", "\r"};
    return kSpaces[std::uniform_int_distribution<int>(0, 6)(rng)];
  };
  std::vector<std::string> members;
  std::string requests = "[" + space();
  for (std::size_t r = 0; r < batch.requests.size(); ++r) {
    const model::Request& request = batch.requests[r];
    std::string pages = "[" + space();
    for (std::size_t k = 0; k < request.prefix_pages.size(); ++k) {
      pages += (k == 0 ? "" : "," + space()) + std::to_string(request.prefix_pages[k]) + space();
    }
    pages += "]";
    std::vector<std::string> fields = {"\"prefix_len\"" + space() + ":" + space() + std::to_string(request.prefix_len),
                                       "\"extend_len\":" + space() + std::to_string(request.extend_len),
                                       "\"prefix_pages\"" + space() + ":" + pages};
    std::shuffle(fields.begin(), fields.end(), rng);
    requests += (r == 0 ? "" : "," + space()) + "{" + space() + fields[0] + "," + space() + fields[1] + space() + "," + fields[2] +
                space() + "}" + space();
  }
  requests += "]";
  members = {"\"batch\":" + space() + std::to_string(index), "\"requests\"" + space() + ":" + space() + requests};
  std::shuffle(members.begin(), members.end(), rng);
  return space() + "{" + space() + members[0] + space() + "," + members[1] + space() + "}" + space();
}

TEST(TraceBatchPaths, GeneratedBatchesReadTheSameOnBothPaths) {
  json header = good_header();
  header["pool_pages"] = model::limits::pool_pages_max;
  header["caps"] = json::object();
  std::mt19937_64 rng(20240611);
  const auto pick = [&rng](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  std::vector<model::Batch> batches(150);
  std::string trace = header.dump() + "\n";
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const std::int64_t request_count = b % 10 == 0 ? pick(100, 300) : pick(1, 16);
    for (std::int64_t r = 0; r < request_count; ++r) {
      model::Request request;
      const std::int64_t page_count = b % 7 == 3 && b % 10 != 0 ? pick(2000, 5000) : pick(0, 60);  // some big page lists
      request.prefix_len = 4 * page_count;
      request.extend_len = pick(1, 50000);
      std::set<std::int64_t> used;  // a request names each page once (traces/README.md)
      for (std::int64_t k = 0; k < page_count; ++k) {
        // Ids of every size the pool allows, the largest and 0 among them.
        const std::int64_t digits_cap = std::int64_t{1} << pick(0, 31);
        std::int64_t id = std::min(pick(0, digits_cap - 1), model::limits::pool_pages_max - 1);
        while (!used.insert(id).second) id = pick(0, model::limits::pool_pages_max - 1);
        request.prefix_pages.push_back(id);
      }
      batches[b].requests.push_back(std::move(request));
    }
    const std::string line = scrambled_line(batches[b], static_cast<std::int64_t>(b), rng);
    const std::string context = "batch " + std::to_string(b) + ": " + line.substr(0, 200);
    const std::optional<detail::BatchLine> fast = detail::read_batch_line_fast(line);
    ASSERT_TRUE(fast.has_value()) << "the fast path gave up on a well-formed line: " << context;
    const detail::BatchLine dom = detail::read_batch_line_dom(line, "gen.jsonl", 2, static_cast<std::int64_t>(b));
    EXPECT_EQ(fast->index, static_cast<std::int64_t>(b));
    EXPECT_EQ(dom.index, static_cast<std::int64_t>(b));
    expect_same_batch(fast->batch, batches[b], context);
    expect_same_batch(dom.batch, batches[b], context);
    trace += line + "\n";
  }
  TraceReader reader(stream_of(trace), "gen.jsonl");
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const std::optional<model::Batch> batch = reader.next();
    ASSERT_TRUE(batch.has_value());
    expect_same_batch(*batch, batches[b], "reader, batch " + std::to_string(b));
  }
  EXPECT_FALSE(reader.next().has_value());
}

TEST(TraceBatchPaths, LargestIntegersReadTheSameOnBothPaths) {
  // Shape only (model::validate would refuse these ids for the pool): int64's largest value fits.
  const std::string line = R"({"requests":[{"prefix_pages":[9223372036854775807,0,18],"extend_len":9223372036854775807,)"
                           R"("prefix_len":0}],"batch":9223372036854775807})";
  const std::optional<detail::BatchLine> fast = detail::read_batch_line_fast(line);
  ASSERT_TRUE(fast.has_value());
  const detail::BatchLine dom = detail::read_batch_line_dom(line, "big.jsonl", 2, INT64_MAX);
  EXPECT_EQ(fast->index, INT64_MAX);
  EXPECT_EQ(dom.index, INT64_MAX);
  expect_same_batch(fast->batch, dom.batch, line);
  EXPECT_EQ(fast->batch.requests.at(0).prefix_pages, pages({INT64_MAX, 0, 18}));
  EXPECT_EQ(fast->batch.requests.at(0).extend_len, INT64_MAX);
}

TEST(TraceBatchPaths, UnusualButValidLinesReadTheSameAsBefore) {
  // Lines the reader has always accepted; the fast path may give up on some (e.g. "-0"), and
  // then the DOM path reads them as before.
  const std::vector<std::string> unusual = {
      "{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]},{\"prefix_len\":0,\"extend_len\":9,\"prefix_pages\":[]},{\"prefix_len\":0,\"extend_len\":9,\"prefix_pages\":[]}]}",
      std::string("{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}") + std::string(1, '\0'),
      std::string("\xef\xbb\xbf") + "{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
      R"({"batch":-0,"requests":[{"prefix_len":8,"extend_len":6,"prefix_pages":[5,2]}]})",
      R"({"batch":0,"requests":[{"prefix\u005flen":8,"extend_len":6,"prefix_pages":[5,2]}]})",
      "{\"batch\" : 0 ,\r\"requests\" :\t[ {\"prefix_len\":8 , \"extend_len\":6,\"prefix_pages\":[ 5 , 2 ] } ] }\r",
  };
  for (const std::string& line : unusual) {
    const std::string context = json(line).dump(-1, ' ', false, json::error_handler_t::replace);
    const detail::BatchLine dom = detail::read_batch_line_dom(line, "odd.jsonl", 2, 0);
    if (const std::optional<detail::BatchLine> fast = detail::read_batch_line_fast(line)) {
      EXPECT_EQ(fast->index, dom.index) << context;
      expect_same_batch(fast->batch, dom.batch, context);
    }
    TraceReader reader(stream_of(good_header().dump() + "\n" + line + "\n"), "odd.jsonl");
    const std::optional<model::Batch> batch = reader.next();
    ASSERT_TRUE(batch.has_value()) << context;
    expect_same_batch(*batch, dom.batch, context);
  }
}

// Malformed batch lines (line 2, after good_header()) and, character for character, the message
// each one got from the reader before the fast path existed: whichever path meets a line now, its
// refusal must not change. Some are refused for their meaning (batch number, model::validate),
// which the fast path may accept as shape and leave to the checks both paths share.
struct Refused {
  std::string line;
  std::string message;
};

// Duplicate, unknown and missing keys; values of the wrong JSON type or sign.
std::vector<Refused> refused_for_keys_types_and_signs() {
  return {
    {"{\"batch\":0,\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: batch: duplicate key"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}],\"requests\":[]}",
     "bad.jsonl:2: requests: duplicate key"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].prefix_len: duplicate key"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2],\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].prefix_pages: duplicate key"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":1.5,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].extend_len: expected an integer, got a non-integer number (1.5)"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8.0,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].prefix_len: expected an integer, got a non-integer number (8.0)"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2e0]}]}",
     "bad.jsonl:2: requests[0].prefix_pages[1]: expected an integer, got a non-integer number (2.0)"},
    {"{\"batch\":0.0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: batch: expected an integer, got a non-integer number (0.0)"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":\"4\",\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].prefix_len: expected an integer, got a string (\"4\")"},
    {"{\"batch\":\"0\",\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: batch: expected an integer, got a string (\"0\")"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,\"2\"]}]}",
     "bad.jsonl:2: requests[0].prefix_pages[1]: expected an integer, got a string (\"2\")"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":-4,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].prefix_len: -4 is negative"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":-1,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].extend_len: -1 is negative"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,-2]}]}",
     "bad.jsonl:2: requests[0].prefix_pages[1]: -2 is negative"},
    {"{\"batch\":-1,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: batch: -1 is negative"},
    {"{\"batch\":0,\"time_ms\":3,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: time_ms: unknown key (expected one of: batch, requests)"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"suffix_len\":0,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].suffix_len: unknown key (expected one of: prefix_len, extend_len, prefix_pages)"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}],\"\":1}",
     "bad.jsonl:2: : unknown key (expected one of: batch, requests)"},
    {"{\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: batch: missing required field"},
    {"{\"batch\":0}",
     "bad.jsonl:2: requests: missing required field"},
    {"{\"batch\":0,\"requests\":[{\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].prefix_len: missing required field"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].extend_len: missing required field"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6}]}",
     "bad.jsonl:2: requests[0].prefix_pages: missing required field"},
    {"{\"batch\":null,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: batch: missing required field"},
    {"{\"batch\":0,\"requests\":null}",
     "bad.jsonl:2: requests: missing required field"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":null,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].extend_len: missing required field"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":null}]}",
     "bad.jsonl:2: requests[0].prefix_pages: missing required field"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,null]}]}",
     "bad.jsonl:2: requests[0].prefix_pages[1]: expected an integer, got null"},
  };
}

// Lines that are not JSON, or whose values have the wrong shape (an array for an object, ...).
std::vector<Refused> refused_for_syntax_and_shape() {
  return {
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]} x",
     "bad.jsonl:2: json: invalid JSON at byte 79: syntax error while parsing value - invalid literal; last read: '2]}]} x'; expected end of input"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}}",
     "bad.jsonl:2: json: invalid JSON at byte 78: syntax error while parsing value - unexpected '}'; expected end of input"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]},",
     "bad.jsonl:2: json: invalid JSON at byte 78: syntax error while parsing value - unexpected ','; expected end of input"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}{}",
     "bad.jsonl:2: json: invalid JSON at byte 78: syntax error while parsing value - unexpected '{'; expected end of input"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]} // comment",
     "bad.jsonl:2: json: invalid JSON at byte 79: syntax error while parsing value - invalid literal; last read: '2]}]} /'; expected end of input"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]",
     "bad.jsonl:2: json: invalid JSON at byte 77: syntax error while parsing object - unexpected end of input; expected '}'"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2,]}]}",
     "bad.jsonl:2: json: invalid JSON at byte 75: syntax error while parsing value - unexpected ']'; expected '[', '{', or a literal"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":08,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: json: invalid JSON at byte 39: syntax error while parsing object - unexpected number literal; expected '}'"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":+8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: json: invalid JSON at byte 38: syntax error while parsing value - invalid literal; last read: '\"prefix_len\":+'"},
    {"{'batch':0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: json: invalid JSON at byte 2: syntax error while parsing object key - invalid literal; last read: '{''; expected string literal"},
    {"{\"batch\":0,\"requests\":{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}}",
     "bad.jsonl:2: requests: expected an array, got an object"},
    {"{\"batch\":0,\"requests\":[[8,6,[5,2]]]}",
     "bad.jsonl:2: requests[0]: expected an object, got an array"},
    {"{\"batch\":0,\"requests\":[1]}",
     "bad.jsonl:2: requests[0]: expected an object, got a number (1)"},
    {"{\"batch\":0,\"requests\":[\"x\"]}",
     "bad.jsonl:2: requests[0]: expected an object, got a string (\"x\")"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":{\"0\":5,\"1\":2}}]}",
     "bad.jsonl:2: requests[0].prefix_pages: expected an array, got an object"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,[2]]}]}",
     "bad.jsonl:2: requests[0].prefix_pages[1]: expected an integer, got an array"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,{\"id\":2}]}]}",
     "bad.jsonl:2: requests[0].prefix_pages[1]: expected an integer, got an object"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,true]}]}",
     "bad.jsonl:2: requests[0].prefix_pages[1]: expected an integer, got a boolean (true)"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":{},\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].extend_len: expected an integer, got an object"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":[8],\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].prefix_len: expected an integer, got an array"},
    {"{\"batch\":[0],\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: batch: expected an integer, got an array"},
    {"{\"batch\":{},\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: batch: expected an integer, got an object"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}],\"time_ms\":{\"a\":1,\"a\":2}}",
     "bad.jsonl:2: time_ms.a: duplicate key"},
  };
}

// Numbers past 64 bits, batches out of order, and lines refused for their meaning (model::validate).
std::vector<Refused> refused_for_range_order_and_meaning() {
  return {
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":18446744073709551615,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].prefix_len: 18446744073709551615 does not fit in 64 bits"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":9223372036854775808,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].prefix_len: 9223372036854775808 does not fit in 64 bits"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":9223372036854775807,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].prefix_len: 9223372036854775807 is not a multiple of page_size 4"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":99999999999999999999999,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].prefix_len: expected an integer, got a number out of range (9.999999999999999e+22 does not fit in 64 bits)"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,18446744073709551616]}]}",
     "bad.jsonl:2: requests[0].prefix_pages[1]: expected an integer, got a number out of range (1.8446744073709552e+19 does not fit in 64 bits)"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,9223372036854775808]}]}",
     "bad.jsonl:2: requests[0].prefix_pages[1]: 9223372036854775808 does not fit in 64 bits"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,9223372036854775807]}]}",
     "bad.jsonl:2: requests[0].prefix_pages[1]: page id 9223372036854775807 is outside the pool [0, 16)"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":-9223372036854775809,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].extend_len: expected an integer, got a number out of range (-9.223372036854776e+18 does not fit in 64 bits)"},
    {"{\"batch\":9223372036854775808,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: batch: 9223372036854775808 does not fit in 64 bits"},
    {"{\"batch\":1,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: batch: 1 is out of order: batches are numbered 0, 1, 2, ... and this is batch 0"},
    {"{\"batch\":1,\"requests\":[{\"prefix_len\":\"x\",\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: batch: 1 is out of order: batches are numbered 0, 1, 2, ... and this is batch 0"},
    {"{\"batch\":1,\"requests\":[{\"prefix_len\":6,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: batch: 1 is out of order: batches are numbered 0, 1, 2, ... and this is batch 0"},
    {"{\"batch\":1,\"extra\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: extra: unknown key (expected one of: batch, requests)"},
    {"{\"batch\":0,\"requests\":[]}",
     "bad.jsonl:2: requests: a batch needs at least one request"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":6,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].prefix_len: 6 is not a multiple of page_size 4"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":0,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].extend_len: 0 is less than 1"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5]}]}",
     "bad.jsonl:2: requests[0].prefix_pages: 1 page ids for prefix_len 8 (expected 2)"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,16]}]}",
     "bad.jsonl:2: requests[0].prefix_pages[1]: page id 16 is outside the pool [0, 16)"},
  };
}

// Keys with escapes, odd bytes or great length, and lines whose top level is not a batch object.
std::vector<Refused> refused_for_key_bytes_and_top_level() {
  return {
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}],\"a\\nb\":1}",
     "bad.jsonl:2: a b: unknown key (expected one of: batch, requests)"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}],\"\\u00e9\\u4e2d\\ud83d\\ude00\":1}",
     "bad.jsonl:2: \xc3""\xa9""\xe4""\xb8""\xad""\xf0""\x9f""\x98""\x80"": unknown key (expected one of: batch, requests)"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}],\"\\ud800\":1}",
     "bad.jsonl:2: json: invalid JSON at byte 85: syntax error while parsing object key - invalid string: surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF; last read: '\"\\ud800\"'; expected string literal"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}],\"x",
     "bad.jsonl:2: json: invalid JSON at byte 80: syntax error while parsing object key - invalid string: missing closing quote; last read: '\"x'; expected string literal"},
    {"[{\"batch\":0,\"requests\":[]}]",
     "bad.jsonl:2: json: expected an object, got an array"},
    {"[]",
     "bad.jsonl:2: json: expected an object, got an array"},
    {"null",
     "bad.jsonl:2: json: expected an object, got null"},
    {"0",
     "bad.jsonl:2: json: expected an object, got a number (0)"},
    {"\"batch\"",
     "bad.jsonl:2: json: expected an object, got a string (\"batch\")"},
    {"true",
     "bad.jsonl:2: json: expected an object, got a boolean (true)"},
    {"   ",
     "bad.jsonl:2: json: blank line (every line must hold one JSON object)"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}],\"prefix_len\":8}",
     "bad.jsonl:2: prefix_len: unknown key (expected one of: batch, requests)"},
    {"{\"batch\":0,\"requests\":[{\"batch\":0,\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests[0].batch: unknown key (expected one of: prefix_len, extend_len, prefix_pages)"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}],\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}]}",
     "bad.jsonl:2: requests: duplicate key"},
    {std::string("{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}],\"") + "\xff\":1}",
     "bad.jsonl:2: json: invalid JSON at byte 79: syntax error while parsing object key - invalid string: ill-formed UTF-8 byte; last read: '\"\xff""'; expected string literal"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}],\"\x01""\":1}",
     "bad.jsonl:2: json: invalid JSON at byte 79: syntax error while parsing object key - invalid string: control character U+0001 (SOH) must be escaped to \\u0001; last read: '\"<U+0001>'; expected string literal"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}],\"kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\":1}",
     "bad.jsonl:2: kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk... (100 bytes): unknown key (expected one of: batch, requests)"},
    {"{\"batch\":0,\"requests\":[{\"prefix_len\":8,\"extend_len\":6,\"prefix_pages\":[5,2]}],\"\\u0000\":1}",
     "bad.jsonl:2: ?: unknown key (expected one of: batch, requests)"},
  };
}

const std::vector<Refused>& refused_batch_lines() {
  static const std::vector<Refused> cases = [] {
    std::vector<Refused> all;
    for (std::vector<Refused> part : {refused_for_keys_types_and_signs(), refused_for_syntax_and_shape(),
                                      refused_for_range_order_and_meaning(), refused_for_key_bytes_and_top_level()}) {
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  }();
  return cases;
}

TEST(TraceBatchPaths, MalformedBatchLinesAreRefusedWithTheSameMessageAsBefore) {
  for (const Refused& c : refused_batch_lines()) {
    const std::string context = json(c.line).dump(-1, ' ', false, json::error_handler_t::replace);
    try {
      TraceReader reader(stream_of(good_header().dump() + "\n" + c.line + "\n"), "bad.jsonl");
      while (reader.next()) {
      }
      ADD_FAILURE() << "accepted: " << context;
    } catch (const TraceError& error) {
      EXPECT_EQ(std::string(error.what()), c.message) << context;
      EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos) << context;
    }
    // What the fast path accepts has the right shape: the DOM path reads the same batch from it.
    if (const std::optional<detail::BatchLine> fast = detail::read_batch_line_fast(c.line)) {
      const detail::BatchLine dom = detail::read_batch_line_dom(c.line, "bad.jsonl", 2, fast->index);
      EXPECT_EQ(dom.index, fast->index) << context;
      expect_same_batch(fast->batch, dom.batch, context);
    }
  }
}

// --- Reliability: nesting depth, error length, full paths, time, repeated pages ---------------

// `depth` arrays inside each other: "[[[...]]]".
std::string nested_arrays(std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// `depth` objects inside each other: {"a":{"a":...{}...}}.
std::string nested_objects(std::size_t depth) {
  std::string text;
  for (std::size_t i = 1; i < depth; ++i) text += "{\"a\":";
  return text + "{}" + std::string(depth - 1, '}');
}

// good_header() with `source` replaced by the JSON text `source`.
std::string header_with_source(const std::string& source) {
  std::string header = good_header().dump();
  const std::string old_source = "\"source\":" + good_header()["source"].dump();
  header.replace(header.find(old_source), old_source.size(), "\"source\":" + source);
  return header;
}

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

// Issue item 4a: a header `source` nested 70,000 deep crashed plan and replay with SIGSEGV (the DOM
// was copied recursively). Nesting is capped while parsing, with a located error.
TEST(TraceLimits, DeepSourceIsRefusedWithItsPathInsteadOfCrashing) {
  for (const std::string& deep : {nested_arrays(70000), nested_objects(70000), "{\"k\":" + nested_arrays(70000) + "}"}) {
    const std::string text = header_with_source(deep) + "\n" + good_batch(0).dump() + "\n";
    const TraceError error = refusal_at(text, 1);
    EXPECT_TRUE(starts_with(error.field(), "source")) << error.field();
    EXPECT_EQ(error.reason(), "nesting deeper than 64 levels (the reader's limit)");
  }
}

TEST(TraceLimits, NestingUpToTheLimitIsAcceptedAndOneMoreIsRefused) {
  // The header object is level 1 and `source` level 2: source's value may hold depth_max - 2 more.
  const std::size_t inner = limits::json_depth_max - 2;
  TraceReader reader(stream_of(header_with_source("{\"k\":" + nested_arrays(inner) + "}") + "\n"), "ok.jsonl");
  EXPECT_EQ(reader.header().source.at("k").size(), 1u);
  const TraceError error = refusal_at(header_with_source("{\"k\":" + nested_arrays(inner + 1) + "}") + "\n", 1);
  // The path of the 65th container: source.k and then [0] for every array level but the last.
  std::string path = "source.k";
  for (std::size_t i = 0; i + 1 < inner + 1; ++i) path += "[0]";
  EXPECT_EQ(error.field(), path.substr(0, limits::error_field_bytes) + "... (" + std::to_string(path.size()) + " bytes)");
}

TEST(TraceLimits, DeepBatchLineIsRefusedWithItsPath) {
  const std::string batch = R"({"batch":0,"requests":[{"prefix_len":0,"extend_len":1,"prefix_pages":)" + nested_arrays(70000) + "}]}";
  const TraceError error = refusal_at(lines({good_header()}) + batch + "\n", 2);
  EXPECT_TRUE(starts_with(error.field(), "requests[0].prefix_pages[0][0][0]")) << error.field();
  EXPECT_EQ(error.reason(), "nesting deeper than 64 levels (the reader's limit)");
  // Deep under an unknown key too: the depth is checked before any key is looked at.
  const std::string unknown = R"({"batch":0,"extra":)" + nested_objects(70000) + "}";
  const TraceError deep_unknown = refusal_at(lines({good_header()}) + unknown + "\n", 2);
  EXPECT_TRUE(starts_with(deep_unknown.field(), "extra.a.a.a")) << deep_unknown.field();
}

// Issue item 10: a 100 MB key was echoed whole. Keys and values quoted from the input are cut, with
// their length, so the error stays about 300 characters (refusal() checks the length of each).
TEST(TraceLimits, HugeKeysAndValuesAreCutInTheErrorLine) {
  const std::string big(10'000'000, 'x');
  const std::string cut_key = std::string(limits::quoted_key_bytes, 'x') + "... (10000000 bytes)";
  const std::string cut_value = std::string(limits::quoted_value_bytes, 'x') + "... (10000000 bytes)";
  EXPECT_EQ(refusal(with_header_change([&](json& h) { h[big] = 1; }), 1, cut_key).reason(),
            "unknown key (expected one of: format, version, cp, page_size, buffer_kinds, layers, pool_pages, split, caps, source)");
  EXPECT_EQ(refusal(with_header_change([&](json& h) { h["caps"][big] = 1; }), 1, "caps." + cut_key).field(), "caps." + cut_key);
  EXPECT_EQ(refusal(with_header_change([&](json& h) { h["split"] = big; }), 1, "split").reason(),
            "unknown split policy \"" + cut_value + "\" (known: zigzag, contiguous, round_robin, zigzag_tokens, continuous_tokens)");
  EXPECT_EQ(refusal(with_header_change([&](json& h) { h["format"] = big; }), 1, "format").reason(),
            "unknown format \"" + cut_value + "\" (expected \"cpkv-batch-trace\")");
  refusal(with_header_change([&](json& h) { h["buffer_kinds"][1] = big; }), 1, "buffer_kinds[1]");
  refusal(with_batch_change([&](json& b) { b["requests"][0]["extend_len"] = big; }), 3, "requests[0].extend_len");
  // A duplicate huge key, and an unterminated huge string that nlohmann's message would echo.
  refusal(lines({good_header()}) + "{\"" + big + "\":1,\"" + big + "\":2}\n", 2, cut_key);
  const TraceError unterminated = refusal(lines({good_header()}) + "{\"batch\":\"" + big + "\n", 2, "json");
  EXPECT_NE(unterminated.reason().find("... (10000001 bytes)"), std::string::npos) << unterminated.reason();
  // A path of 60 levels of 60-byte keys (3,600 bytes) is cut as a whole: a duplicate at the bottom.
  std::string source = "{\"d\":0,\"d\":0}";
  for (int i = 0; i < 60; ++i) source = "{\"" + std::string(60, 'k') + "\":" + source + "}";
  const TraceError long_path = refusal_at(header_with_source(source) + "\n", 1);
  std::string path = "source";
  for (int i = 0; i < 60; ++i) path += "." + std::string(60, 'k');
  path += ".d";
  EXPECT_EQ(long_path.field(), path.substr(0, limits::error_field_bytes) + "... (" + std::to_string(path.size()) + " bytes)");
  EXPECT_EQ(long_path.reason(), "duplicate key");
}

// Issue item 10: a duplicate key is named by its full field path, as the README promises.
TEST(TraceLimits, DuplicateKeyIsNamedByItsFullPath) {
  const auto batch_line = [](const std::string& request) {
    return lines({good_header()}) + R"({"batch":0,"requests":[{"prefix_len":0,"extend_len":1,"prefix_pages":[]},)" + request + "]}\n";
  };
  refusal(batch_line(R"({"prefix_len":0,"extend_len":1,"extend_len":1,"prefix_pages":[]})"), 2, "requests[1].extend_len");
  refusal(batch_line(R"({"prefix_len":0,"prefix_pages":[],"extend_len":1,"prefix_pages":[]})"), 2, "requests[1].prefix_pages");
  const std::string header = good_header().dump();
  const auto header_with = [&](const std::string& from, const std::string& to) {
    std::string text = header;
    text.replace(text.find(from), from.size(), to);
    return text + "\n";
  };
  refusal(header_with("\"staging_mib\":null", "\"staging_mib\":null,\"staging_mib\":1"), 1, "caps.staging_mib");
  refusal(header_with("\"count\":2", "\"count\":2,\"count\":2"), 1, "layers.count");
  refusal(header_with("\"cp\":2", "\"cp\":2,\"cp\":2"), 1, "cp");
  refusal(header_with("\"kind\":\"test\"", "\"kind\":\"test\",\"list\":[0,{\"x\":1},{\"y\":{\"z\":1,\"z\":2}}]"), 1, "source.list[2].y.z");
}

// Seconds of this thread's CPU time to read `text` as a trace to its end or its first error; the
// least of three runs. CPU time, not wall time, so other work on the machine matters little.
double cpu_seconds_to_read(const std::string& text) {
  double best = 1e9;
  for (int run = 0; run < 3; ++run) {
    timespec start{};
    timespec stop{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    try {
      TraceReader reader(stream_of(text), "time.jsonl");
      while (reader.next()) {
      }
    } catch (const TraceError&) {
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &stop);
    best = std::min(best, static_cast<double>(stop.tv_sec - start.tv_sec) + 1e-9 * static_cast<double>(stop.tv_nsec - start.tv_nsec));
  }
  return best;
}

// Issue item 5: a `source` of 80,000 keys took 29.5 s (10,000 keys 0.6 s): the duplicate-key check
// compared every key with every key before it. Reading must be linear in the line. This is not a
// speed test: it compares the CPU time for n and 8n keys. Linear reading gives a ratio near 8
// (n log n, nlohmann's std::map, a little more), quadratic near 64; the bound 24 sits far from
// both, so neither a slow machine nor a busy one (CPU time, best of three) moves a result across
// it. This machine has no hardware counters (perf_event_open fails in the VM), or the test would
// count instructions instead.
TEST(TraceLimits, ReadingIsLinearInTheNumberOfKeys) {
  const auto header_with_keys = [](std::size_t n) {
    std::string source = "{";
    for (std::size_t i = 0; i < n; ++i) source += (i == 0 ? "\"k" : ",\"k") + std::to_string(i) + "\":0";
    return header_with_source(source + "}") + "\n";
  };
  const auto batch_with_keys = [](std::size_t n) {  // unknown keys, then a duplicate at the end
    std::string line = R"({"batch":0,"requests":[{"prefix_len":0,"extend_len":1,"prefix_pages":[]}])";
    for (std::size_t i = 0; i < n; ++i) line += ",\"k" + std::to_string(i) + "\":0";
    return lines({good_header()}) + line + ",\"k0\":0}\n";
  };
  constexpr std::size_t n = 5000;
  for (const auto& make : {std::function<std::string(std::size_t)>(header_with_keys), std::function<std::string(std::size_t)>(batch_with_keys)}) {
    const double small = cpu_seconds_to_read(make(n));
    const double large = cpu_seconds_to_read(make(8 * n));
    EXPECT_LT(large, 24 * small + 0.005) << "n keys: " << small << " s, 8n keys: " << large << " s";
  }
}

// Issue item 11: one request naming the same pool page twice is refused (a page holds the KV of
// one run of page_size tokens; a request's page table cannot map two positions to it). Requests
// sharing a page is the prefix cache and stays valid.
TEST(TracePrefixPages, APageRepeatedInOneRequestIsRefused) {
  const TraceError error = refusal(with_batch_change([](json& b) {
                                     b["requests"][0]["prefix_len"] = 12;
                                     b["requests"][0]["prefix_pages"] = {5, 2, 5};
                                   }),
                                   3, "requests[0].prefix_pages[2]");
  EXPECT_EQ(error.reason(), "page id 5 is also at prefix_pages[0] of this request (a request's prefix maps each position to its own page)");
  // The same line through the DOM path (a "-0" makes the fast path give up): the same refusal.
  const std::string dom_line = R"({"batch":-0,"requests":[{"prefix_len":8,"extend_len":1,"prefix_pages":[7,7]}]})";
  ASSERT_FALSE(detail::read_batch_line_fast(dom_line).has_value());
  refusal(lines({good_header()}) + dom_line + "\n", 2, "requests[0].prefix_pages[1]");
}

// The message names the smallest id repeated and its first two positions, whatever repeat comes
// first in the line, and reads the same for a pool small enough for the reader's page bitset and
// for the largest pool (where the reader sorts the pages alone). Request 0 shares page 5 with
// request 1 (the prefix cache), which is fine.
TEST(TracePrefixPages, TheRepeatNamedIsTheSmallestRepeatedIdForEveryPoolSize) {
  for (const std::int64_t pool_pages : {std::int64_t{16}, model::limits::pool_pages_max}) {
    json header = good_header();
    header["pool_pages"] = pool_pages;
    json batch = good_batch(0);
    batch["requests"][1]["prefix_len"] = 16;
    batch["requests"][1]["prefix_pages"] = {5, 3, 5, 3};
    const TraceError error = refusal(lines({header, batch}), 2, "requests[1].prefix_pages[3]");
    EXPECT_EQ(error.reason(), "page id 3 is also at prefix_pages[1] of this request (a request's prefix maps each position to its own page)")
        << "pool_pages " << pool_pages;
  }
}

// A replay loop reads every line into one model::Batch (TraceReader::next(model::Batch&)): batches
// that shrink and grow, and a line read by the DOM path (an escaped key), come out exactly as the
// optional-returning next() reads them from a fresh batch every time.
TEST(TraceBatchPaths, OneReusedBatchReadsEveryLineExactlyAsAFreshOne) {
  json header = good_header();
  const std::vector<std::string> batch_lines = {
      R"({"batch":0,"requests":[{"prefix_len":12,"extend_len":6,"prefix_pages":[5,2,9]},{"prefix_len":8,"extend_len":1,"prefix_pages":[1,2]}]})",
      R"({"batch":1,"requests":[{"prefix_len":4,"extend_len":3,"prefix_pages":[7]}]})",
      R"({"batch":2,"requests":[{"prefix_len":0,"extend_len":2,"prefix_pages":[]},{"prefix_len":16,"extend_len":5,"prefix_pages":[0,15,3,4]}]})",
      R"({"batch":3,"requests":[{"prefix\u005flen":4,"extend_len":3,"prefix_pages":[6]}]})",
      R"({"batch":4,"requests":[{"prefix_len":0,"extend_len":9,"prefix_pages":[]}]})",
  };
  ASSERT_FALSE(detail::read_batch_line_fast(batch_lines[3]).has_value());
  std::string text = header.dump() + "\n";
  for (const std::string& line : batch_lines) text += line + "\n";
  TraceReader reused(stream_of(text), "reuse.jsonl");
  TraceReader fresh(stream_of(text), "reuse.jsonl");
  model::Batch batch;
  for (std::size_t b = 0; b < batch_lines.size(); ++b) {
    ASSERT_TRUE(reused.next(batch)) << "batch " << b;
    const std::optional<model::Batch> expected = fresh.next();
    ASSERT_TRUE(expected.has_value()) << "batch " << b;
    expect_same_batch(batch, *expected, "batch " + std::to_string(b));
    EXPECT_EQ(reused.batch_index(), static_cast<std::int64_t>(b));
  }
  EXPECT_EQ(batch.requests.at(0).prefix_pages, pages({}));  // the last batch, not a leftover of batch 2
  EXPECT_FALSE(reused.next(batch));
  EXPECT_FALSE(fresh.next().has_value());
}

TEST(TracePrefixPages, RequestsSharingAPageAreAccepted) {
  json batch = good_batch(0);
  batch["requests"][1]["prefix_len"] = 8;
  batch["requests"][1]["prefix_pages"] = {2, 5};  // request 0's pages, the other way round
  TraceReader reader(stream_of(lines({good_header(), batch})), "shared.jsonl");
  const std::optional<model::Batch> read = reader.next();
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->requests[1].prefix_pages, pages({2, 5}));
}

TEST(TracePrefixPages, WriterRefusesARepeatedPage) {
  TraceHeader header;
  header.setting = TraceReader(stream_of(lines({good_header()})), "h.jsonl").header().setting;
  std::ostringstream out;
  TraceWriter writer(out, header);
  model::Batch batch;
  batch.requests.push_back(model::Request{.prefix_len = 8, .extend_len = 1, .prefix_pages = {3, 3}});
  EXPECT_THROW(writer.write(batch), std::invalid_argument);
}

// The writer's bitset is clear again after every batch, refused or not: pages a request used in an
// earlier batch (or a refused one) may be used again, and a repeat is still refused after them.
TEST(TracePrefixPages, WriterChecksEachBatchOnItsOwn) {
  TraceHeader header;
  header.setting = TraceReader(stream_of(lines({good_header()})), "h.jsonl").header().setting;
  std::ostringstream out;
  TraceWriter writer(out, header);
  const auto batch_of = [](std::vector<std::int64_t> first, std::vector<std::int64_t> second) {
    model::Batch batch;
    batch.requests.push_back(model::Request{.prefix_len = 4 * static_cast<std::int64_t>(first.size()), .extend_len = 1, .prefix_pages = first});
    batch.requests.push_back(model::Request{.prefix_len = 4 * static_cast<std::int64_t>(second.size()), .extend_len = 1, .prefix_pages = second});
    return batch;
  };
  EXPECT_NO_THROW(writer.write(batch_of({3, 5}, {5, 3})));
  EXPECT_THROW(writer.write(batch_of({1, 2}, {4, 6, 4})), std::invalid_argument);
  EXPECT_NO_THROW(writer.write(batch_of({3, 5, 4}, {6, 4})));
  EXPECT_THROW(writer.write(batch_of({7, 0, 7}, {})), std::invalid_argument);
  TraceReader reader(stream_of(out.str()), "written.jsonl");
  ASSERT_TRUE(reader.next().has_value());
  const std::optional<model::Batch> second = reader.next();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->requests[0].prefix_pages, pages({3, 5, 4}));
  EXPECT_FALSE(reader.next().has_value());
}

// The writer writes batch lines without building a DOM; they must be nlohmann's dump() of
// batch_to_json byte for byte (keys sorted, no spaces), extreme integers and empty lists included.
TEST(TraceWriter, BatchLinesAreTheBytesOfTheJsonDump) {
  std::mt19937_64 rng(20261130);
  const auto pick = [&rng](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  std::string line;
  for (std::int32_t round = 0; round < 200; ++round) {
    model::Batch batch;
    const std::int64_t requests = pick(0, 4);
    for (std::int64_t r = 0; r < requests; ++r) {
      model::Request request{.prefix_len = pick(0, INT64_MAX), .extend_len = pick(0, 1) == 0 ? pick(1, 9) : INT64_MAX, .prefix_pages = {}};
      const std::int64_t count = pick(0, 6);
      for (std::int64_t k = 0; k < count; ++k) request.prefix_pages.push_back(pick(0, 2) == 0 ? 0 : pick(0, INT64_MAX));
      batch.requests.push_back(std::move(request));
    }
    const std::int64_t index = round == 0 ? INT64_MAX : pick(0, 1'000'000);
    append_batch_line(batch, index, line);
    ASSERT_EQ(line, batch_to_json(batch, index).dump()) << "round " << round;
  }
}

}  // namespace
}  // namespace cpkv::traces

// A number beyond a double used to escape as nlohmann's own exception; it is bad input like any other.
TEST(TraceReaderBadInput, NumberBeyondADoubleIsRefusedWithFileLineAndField) {
  const std::string header = R"({"format":"cpkv-batch-trace","version":1,"cp":2,"page_size":4,"buffer_kinds":["kv_fp8"],"layers":{"count":1,"pattern":"F"},"pool_pages":16})";
  auto in = std::make_unique<std::istringstream>(header + "\n" + R"({"batch":0,"requests":[{"prefix_len":0,"extend_len":1e400,"prefix_pages":[]}]})" + "\n");
  cpkv::traces::TraceReader reader(std::move(in), "big.jsonl");
  try {
    (void)reader.next();
    FAIL() << "a number beyond a double was accepted";
  } catch (const cpkv::traces::TraceError& e) {
    EXPECT_EQ(e.line(), 2);
    EXPECT_EQ(e.field(), "json");
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
}
