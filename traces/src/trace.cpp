// The batch-trace format, version 1 (traces/README.md). This file checks the JSON shape of every
// line (keys, types, non-negative integers, order of batches) and leaves the meaning (cp range,
// page size, page ids inside the pool, ...) to model::validate, whose Problem fields already use
// the trace's field names. Every refusal is one TraceError: `FILE:LINE: FIELD: REASON`.
#include "cpkv/traces/trace.hpp"

#include <cmath>
#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <istream>
#include <limits>
#include <ostream>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "json_line.hpp"

namespace cpkv::traces {

namespace {

using nlohmann::json;
using detail::clip;
using detail::index_path;
using detail::join_path;

// An error message must stay one line of plain text whatever the input holds: a JSON key may
// decode to a newline, a NUL (which would end what() early) or a terminal escape.
std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r' || c == '\t') {
      c = ' ';
    } else if ((c >= 0 && c < 0x20) || c == 0x7f) {
      c = '?';
    }
  }
  return text;
}

// Values quoted in reasons are cut (limits::quoted_value_bytes) so one bad line cannot make a huge
// message; only scalars are quoted, so the dump is as long as the value's text.
std::string quote_value(const json& value) {
  return clip(value.dump(-1, ' ', false, json::error_handler_t::replace), limits::quoted_value_bytes);
}

// A string from the input, quoted in a reason.
std::string quote_name(const std::string& name) { return clip(name, limits::quoted_value_bytes); }

std::string describe_type(const json& value) {
  if (value.is_null()) return "null";
  if (value.is_boolean()) return fmt::format("a boolean ({})", quote_value(value));
  // A whole number past 64 bits reaches us as a double (nlohmann): out of range, not "non-integer"
  // (issue 34: pool_pages 2^64 was "a non-integer number (1.8446744073709552e+19)").
  if (value.is_number_float() && std::isfinite(value.get<double>()) && std::fabs(value.get<double>()) >= 0x1p63 &&
      std::trunc(value.get<double>()) == value.get<double>()) {
    return fmt::format("a number out of range ({} does not fit in 64 bits)", quote_value(value));
  }
  if (value.is_number_float()) return fmt::format("a non-integer number ({})", quote_value(value));
  if (value.is_number()) return fmt::format("a number ({})", quote_value(value));
  if (value.is_string()) return fmt::format("a string ({})", quote_value(value));
  if (value.is_array()) return "an array";
  return "an object";
}

std::string known_list(std::initializer_list<std::string_view> keys) {
  return fmt::format("{}", fmt::join(keys, ", "));
}

// The checks of one line of one file: every failure names the file and this line.
class LineChecker {
 public:
  LineChecker(const std::string& file, std::int64_t line) : file_(file), line_(line) {}

  [[noreturn]] void fail(std::string field, std::string reason) const {
    throw TraceError(file_, line_, std::move(field), std::move(reason));
  }

  // The line as a JSON object: no blank lines, no duplicate keys, no nesting deeper than
  // limits::json_depth_max, nothing after the object (detail::parse_line).
  json parse_object(const std::string& text) const {
    if (text.find_first_not_of(" \t\r") == std::string::npos) {
      fail("json", "blank line (every line must hold one JSON object)");
    }
    detail::LineProblem problem;
    std::optional<json> value = detail::parse_line(text, problem);
    if (!value) fail(std::move(problem.field), std::move(problem.reason));
    if (!value->is_object()) fail("json", fmt::format("expected an object, got {}", describe_type(*value)));
    return std::move(*value);
  }

  void refuse_unknown_keys(const json& object, const std::string& path,
                           std::initializer_list<std::string_view> known) const {
    for (const auto& item : object.items()) {
      bool is_known = false;
      for (std::string_view key : known) is_known = is_known || item.key() == key;
      if (!is_known) fail(join_path(path, item.key()), fmt::format("unknown key (expected one of: {})", known_list(known)));
    }
  }

  // The member `key` of `object`; a required member may not be absent or null.
  const json& required(const json& object, const std::string& path, std::string_view key) const {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) fail(join_path(path, key), "missing required field");
    return *it;
  }

  // The member `key`, or nullptr where it is absent or null.
  static const json* optional(const json& object, std::string_view key) {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) return nullptr;
    return &*it;
  }

  // Every integer of the format is a count, a length, an id or a size: none is negative.
  std::int64_t non_negative(const json& value, const std::string& field) const {
    if (!value.is_number_integer()) fail(field, fmt::format("expected an integer, got {}", describe_type(value)));
    if (value.is_number_unsigned()) {
      const std::uint64_t unsigned_value = value.get<std::uint64_t>();
      if (unsigned_value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        fail(field, fmt::format("{} does not fit in 64 bits", unsigned_value));
      }
      return static_cast<std::int64_t>(unsigned_value);
    }
    const std::int64_t signed_value = value.get<std::int64_t>();
    if (signed_value < 0) fail(field, fmt::format("{} is negative", signed_value));
    return signed_value;
  }

  std::int32_t non_negative_32(const json& value, const std::string& field) const {
    const std::int64_t wide = non_negative(value, field);
    if (wide > std::numeric_limits<std::int32_t>::max()) fail(field, fmt::format("{} does not fit in 32 bits", wide));
    return static_cast<std::int32_t>(wide);
  }

  const std::string& string(const json& value, const std::string& field) const {
    if (!value.is_string()) fail(field, fmt::format("expected a string, got {}", describe_type(value)));
    return value.get_ref<const std::string&>();
  }

  const json& array(const json& value, const std::string& field) const {
    if (!value.is_array()) fail(field, fmt::format("expected an array, got {}", describe_type(value)));
    return value;
  }

  const json& object(const json& value, const std::string& field) const {
    if (!value.is_object()) fail(field, fmt::format("expected an object, got {}", describe_type(value)));
    return value;
  }

  void check(const std::optional<model::Problem>& problem) const {
    if (problem) fail(problem->field, problem->reason);
  }

 private:
  const std::string& file_;
  std::int64_t line_;
};

model::Caps parse_caps(const LineChecker& checker, const json& caps_json) {
  checker.object(caps_json, "caps");
  checker.refuse_unknown_keys(caps_json, "caps", {"max_total_extend_tokens", "max_batch_requests", "staging_mib"});
  model::Caps caps;
  const auto read_cap = [&](std::string_view key) -> std::optional<std::int64_t> {
    const json* value = LineChecker::optional(caps_json, key);
    if (value == nullptr) return std::nullopt;
    return checker.non_negative(*value, join_path("caps", key));
  };
  caps.max_total_extend_tokens = read_cap("max_total_extend_tokens");
  caps.max_batch_requests = read_cap("max_batch_requests");
  caps.staging_mib_override = read_cap("staging_mib");
  return caps;
}

std::vector<model::BufferKind> parse_buffer_kinds(const LineChecker& checker, const json& header_json) {
  const json& kinds_json = checker.array(checker.required(header_json, "", "buffer_kinds"), "buffer_kinds");
  std::vector<model::BufferKind> kinds;
  for (std::size_t i = 0; i < kinds_json.size(); ++i) {
    const std::string field = index_path("buffer_kinds", i);
    const std::string& name = checker.string(kinds_json[i], field);
    const std::optional<model::BufferKind> kind = model::find_buffer_kind(name);
    if (!kind) {
      std::vector<std::string_view> known;
      for (const model::BufferKind& k : model::kBufferKinds) known.push_back(k.name);
      checker.fail(field, fmt::format("unknown buffer kind \"{}\" (known: {})", quote_name(name), fmt::join(known, ", ")));
    }
    kinds.push_back(*kind);
  }
  return kinds;
}

std::string parse_layers(const LineChecker& checker, const json& header_json) {
  const json& layers_json = checker.object(checker.required(header_json, "", "layers"), "layers");
  checker.refuse_unknown_keys(layers_json, "layers", {"count", "pattern"});
  const std::int64_t count = checker.non_negative(checker.required(layers_json, "layers", "count"), "layers.count");
  const std::string& pattern = checker.string(checker.required(layers_json, "layers", "pattern"), "layers.pattern");
  if (static_cast<std::int64_t>(pattern.size()) != count) {
    checker.fail("layers.pattern", fmt::format("has {} layers but layers.count is {}", pattern.size(), count));
  }
  return pattern;
}

// Format and version come first: a newer file should be refused for its version, not its keys.
void check_format_and_version(const LineChecker& checker, const json& header_json) {
  const json* format = LineChecker::optional(header_json, "format");
  if (format == nullptr) checker.fail("format", "missing required field (the first line must be the trace header)");
  const std::string& name = checker.string(*format, "format");
  if (name != kFormatName) checker.fail("format", fmt::format("unknown format \"{}\" (expected \"{}\")", quote_name(name), kFormatName));
  const std::int64_t version = checker.non_negative(checker.required(header_json, "", "version"), "version");
  if (version != kFormatVersion) {
    checker.fail("version", fmt::format("unsupported version {} (this reader reads version {})", version, kFormatVersion));
  }
}

TraceHeader parse_header(const LineChecker& checker, const json& header_json) {
  check_format_and_version(checker, header_json);
  checker.refuse_unknown_keys(header_json, "", {"format", "version", "cp", "page_size", "buffer_kinds", "layers",
                                                "pool_pages", "split", "caps", "source"});
  TraceHeader header;
  model::Setting& setting = header.setting;
  setting.cp = checker.non_negative_32(checker.required(header_json, "", "cp"), "cp");
  setting.page_size = checker.non_negative_32(checker.required(header_json, "", "page_size"), "page_size");
  setting.kinds = parse_buffer_kinds(checker, header_json);
  setting.layer_pattern = parse_layers(checker, header_json);
  setting.pool_pages = checker.non_negative(checker.required(header_json, "", "pool_pages"), "pool_pages");
  if (const json* split = LineChecker::optional(header_json, "split")) {
    const std::string& name = checker.string(*split, "split");
    const std::optional<model::SplitPolicy> policy = model::parse_split_policy(name);
    if (!policy) checker.fail("split", fmt::format("unknown split policy \"{}\" (known: zigzag, contiguous, round_robin, zigzag_tokens, continuous_tokens)", quote_name(name)));
    setting.split = *policy;
  }
  if (const json* caps = LineChecker::optional(header_json, "caps")) setting.caps = parse_caps(checker, *caps);
  if (const json* source = LineChecker::optional(header_json, "source")) header.source = checker.object(*source, "source");
  checker.check(model::validate(setting));
  return header;
}

model::Request parse_request(const LineChecker& checker, const json& request_json, const std::string& path) {
  checker.object(request_json, path);
  checker.refuse_unknown_keys(request_json, path, {"prefix_len", "extend_len", "prefix_pages"});
  model::Request request;
  request.prefix_len = checker.non_negative(checker.required(request_json, path, "prefix_len"), join_path(path, "prefix_len"));
  request.extend_len = checker.non_negative(checker.required(request_json, path, "extend_len"), join_path(path, "extend_len"));
  const std::string pages_path = join_path(path, "prefix_pages");
  const json& pages_json = checker.array(checker.required(request_json, path, "prefix_pages"), pages_path);
  request.prefix_pages.reserve(pages_json.size());
  for (std::size_t k = 0; k < pages_json.size(); ++k) {
    // Fast path for the common case (a plain non-negative integer); the field path is only
    // formatted when the value needs the full check, which is what names it in an error.
    const json& value = pages_json[k];
    if (value.is_number_unsigned() && value.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX)) {
      request.prefix_pages.push_back(static_cast<std::int64_t>(value.get<std::uint64_t>()));
    } else {
      request.prefix_pages.push_back(checker.non_negative(value, index_path(pages_path, k)));
    }
  }
  return request;
}

// A request's page table maps each position of its prefix to its own page: a page holds the KV of
// page_size particular tokens, so one page at two positions of one request is a corrupt trace
// (traces/README.md). Several requests naming one page is the prefix cache, and fine. This is a
// rule of the trace format, not of model::validate: the protocol itself reads such a batch fine
// (the property generators draw pages with replacement). `sorted` is scratch space reused across
// calls; the sort makes the check O(n log n) in the request's pages with no allocation per batch.
std::optional<model::Problem> repeated_prefix_page(const model::Batch& batch, std::vector<std::int64_t>& sorted) {
  for (std::size_t r = 0; r < batch.requests.size(); ++r) {
    const std::vector<std::int64_t>& pages = batch.requests[r].prefix_pages;
    if (pages.size() < 2) continue;
    sorted.assign(pages.begin(), pages.end());
    std::sort(sorted.begin(), sorted.end());
    const auto repeat = std::adjacent_find(sorted.begin(), sorted.end());
    if (repeat == sorted.end()) continue;
    const auto first = std::find(pages.begin(), pages.end(), *repeat);
    const auto second = std::find(first + 1, pages.end(), *repeat);
    return model::Problem{fmt::format("requests[{}].prefix_pages[{}]", r, second - pages.begin()),
                          fmt::format("page id {} is also at prefix_pages[{}] of this request (a request's prefix "
                                      "maps each position to its own page)",
                                      *repeat, first - pages.begin())};
  }
  return std::nullopt;
}

// Pools up to this many pages get the bitset of has_repeated_page (2 MiB at most); a larger pool
// (up to model::limits::pool_pages_max, 2^31) would need 256 MiB, so there the sort alone checks.
constexpr std::int64_t kPageBitsPoolPagesMax = std::int64_t{1} << 24;

// Whether a request names one page twice, in one pass over its pages: `bits` has one bit per pool
// page, all clear on entry and again on return. Page ids are inside the pool (model::validate ran).
bool has_repeated_page(const model::Batch& batch, std::vector<std::uint64_t>& bits) {
  for (const model::Request& request : batch.requests) {
    const std::vector<std::int64_t>& pages = request.prefix_pages;
    std::size_t marked = 0;
    bool repeated = false;
    for (; marked < pages.size(); ++marked) {
      const auto id = static_cast<std::uint64_t>(pages[marked]);
      std::uint64_t& word = bits[id / 64];
      const std::uint64_t bit = std::uint64_t{1} << (id % 64);
      if ((word & bit) != 0) {
        repeated = true;
        break;
      }
      word |= bit;
    }
    for (std::size_t k = 0; k < marked; ++k) bits[static_cast<std::uint64_t>(pages[k]) / 64] = 0;
    if (repeated) return true;
  }
  return false;
}

}  // namespace

void detail::RepeatedPages::size_for(std::int64_t pool_pages) {
  bits_.clear();
  if (pool_pages <= kPageBitsPoolPagesMax) bits_.assign(static_cast<std::size_t>((pool_pages + 63) / 64), 0);
}

std::optional<model::Problem> detail::RepeatedPages::find(const model::Batch& batch) {
  if (!bits_.empty() && !has_repeated_page(batch, bits_)) return std::nullopt;
  return repeated_prefix_page(batch, sorted_);
}

std::optional<model::Problem> check_batch(const model::Setting& setting, const model::Batch& batch) {
  if (std::optional<model::Problem> problem = model::validate(setting, batch)) return problem;
  std::vector<std::int64_t> sorted;  // the sort alone: a bitset over a pool of 2^31 pages per call would cost 256 MiB
  return repeated_prefix_page(batch, sorted);
}

namespace {

void check_batch_number(const LineChecker& checker, std::int64_t index, std::int64_t expected_index) {
  if (index != expected_index) {
    checker.fail("batch", fmt::format("{} is out of order: batches are numbered 0, 1, 2, ... and this is batch {}", index, expected_index));
  }
}

// --- Batch lines: a fast path, and the DOM path on any doubt -------------------------------------
//
// A trace is mostly batch lines of hundreds of page ids each, and replaying one costs less than
// reading it, so batch lines are read twice over only when they are wrong:
//
//  1. The fast path, BatchScanner below, reads the bytes of the line directly into a model::Batch,
//     with no DOM, no token strings and no field paths. It accepts a line only when it is plainly
//     well formed JSON of the one expected shape: an object with exactly the keys "batch" and
//     "requests" in any order, "requests" an array of objects with exactly "prefix_len",
//     "extend_len" and "prefix_pages" in any order, every key written without escapes, every
//     number a plain non-negative integer (0 or a digit 1-9 then digits, no sign, fraction or
//     exponent) that fits in int64, and only JSON whitespace (space, tab, CR, LF) between tokens.
//     Every line it accepts is therefore valid JSON that nlohmann::json::parse reads to the same
//     values. At the first byte it does not expect (an unknown or duplicate key, an escape, null, a
//     string, a boolean, a minus sign, a fraction, a missing key, a syntax error, text, a NUL or a
//     byte-order mark around the object, ...) it gives up, whatever that byte means.
//  2. The DOM path, parse_object + parse_batch_shape, is the reader as it always was: it parses
//     the line again with nlohmann-json into a DOM and names the field and the reason of the first
//     problem, so every error message is the DOM path's.
//
// Either way the batch then gets the same checks of its meaning: the batch number, then
// model::validate. (The DOM path checks the batch number before the shape of the requests; a line
// the fast path accepts has no shape problem, so the order makes no difference to what it reports.)
// tests/trace_reader_test.cpp (TraceBatchPaths) and the fuzz targets check that the two paths
// agree. The scanner replaced a SAX handler on nlohmann's lexer, which spent most of a replay's
// time copying every character into token strings and converting numbers with strtoull
// (docs/benchmarks/model-replay-throughput.md).
class BatchScanner {
 public:
  // Reads `text` into `line`, reusing the capacity of its vectors; false (and `line` unspecified)
  // where the line is anything but plainly well formed.
  static bool read(std::string_view text, detail::BatchLine& line) {
    BatchScanner scanner(text);
    return scanner.read_line(line);
  }

 private:
  explicit BatchScanner(std::string_view text) : at_(text.data()), end_(text.data() + text.size()) {}

  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

  void skip_space() {
    while (at_ != end_ && is_space(*at_)) ++at_;
  }

  // The next token is the single character `c`, which is then consumed; otherwise it stays.
  bool take(char c) {
    skip_space();
    if (at_ == end_ || *at_ != c) return false;
    ++at_;
    return true;
  }

  // A key and its colon. Keys with an escape or a control character are given up on (a known key
  // has neither), so the bytes between the quotes are the key.
  bool key(std::string_view& name) {
    if (!take('"')) return false;
    const char* start = at_;
    while (at_ != end_ && *at_ != '"') {
      if (*at_ == '\\' || static_cast<unsigned char>(*at_) < 0x20) return false;
      ++at_;
    }
    if (at_ == end_) return false;
    name = std::string_view(start, static_cast<std::size_t>(at_ - start));
    ++at_;
    return take(':');
  }

  // A JSON integer without a sign that fits in int64: "0" or a non-zero digit then digits. Anything
  // that follows (a digit after a leading 0, '.', 'e', a letter) is left for the caller's next
  // take(), which refuses it.
  bool number(std::int64_t& out) {
    skip_space();
    if (at_ == end_ || *at_ < '0' || *at_ > '9') return false;
    std::uint64_t value = static_cast<std::uint64_t>(*at_++ - '0');
    if (value != 0) {
      constexpr std::uint64_t kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
      while (at_ != end_ && *at_ >= '0' && *at_ <= '9') {
        const auto digit = static_cast<std::uint64_t>(*at_ - '0');
        if (value > (kMax - digit) / 10) return false;
        value = value * 10 + digit;
        ++at_;
      }
    }
    out = static_cast<std::int64_t>(value);
    return true;
  }

  // Records a key in `seen` (one bit per key of its object); a key seen before is a duplicate.
  static bool first_time(unsigned& seen, unsigned bit) {
    if ((seen & bit) != 0) return false;
    seen |= bit;
    return true;
  }

  // `[` integers separated by commas `]`, appended to `pages`.
  bool pages(std::vector<std::int64_t>& pages) {
    if (!take('[')) return false;
    if (take(']')) return true;
    do {
      std::int64_t page = 0;
      if (!number(page)) return false;
      pages.push_back(page);
    } while (take(','));
    return take(']');
  }

  // One object of known keys: `field(name, seen)` reads the value of key `name` (false: not one of
  // them, or seen before); every key in `all` (a bit each) must appear.
  template <typename Field>
  bool object(unsigned all, const Field& field) {
    if (!take('{')) return false;
    unsigned seen = 0;
    do {
      std::string_view name;
      if (!key(name) || !field(name, seen)) return false;
    } while (take(','));
    return take('}') && seen == all;
  }

  bool request(model::Request& request) {
    return object(7, [&](std::string_view name, unsigned& seen) {
      if (name == "prefix_pages") return first_time(seen, 1) && pages(request.prefix_pages);
      if (name == "prefix_len") return first_time(seen, 2) && number(request.prefix_len);
      if (name == "extend_len") return first_time(seen, 4) && number(request.extend_len);
      return false;
    });
  }

  // The requests array into `requests`, whose elements (and their page vectors) are reused.
  bool requests(std::vector<model::Request>& requests) {
    std::size_t count = 0;
    if (!take('[')) return false;
    if (!take(']')) {
      do {
        if (count == requests.size()) requests.emplace_back();
        model::Request& slot = requests[count++];
        slot.prefix_pages.clear();
        if (!request(slot)) return false;
      } while (take(','));
      if (!take(']')) return false;
    }
    requests.resize(count);
    return true;
  }

  bool read_line(detail::BatchLine& line) {
    const bool ok = object(3, [&](std::string_view name, unsigned& seen) {
      if (name == "batch") return first_time(seen, 1) && number(line.index);
      if (name == "requests") return first_time(seen, 2) && requests(line.batch.requests);
      return false;
    });
    if (!ok) return false;
    skip_space();
    return at_ == end_;
  }

  const char* at_;
  const char* end_;
};

// The DOM path's shape checks of a batch line (the batch number among them, in the order the
// reader has always reported them); the caller applies model::validate.
detail::BatchLine parse_batch_shape(const LineChecker& checker, const json& batch_json, std::int64_t expected_index) {
  checker.refuse_unknown_keys(batch_json, "", {"batch", "requests"});
  detail::BatchLine line;
  line.index = checker.non_negative(checker.required(batch_json, "", "batch"), "batch");
  check_batch_number(checker, line.index, expected_index);
  const json& requests_json = checker.array(checker.required(batch_json, "", "requests"), "requests");
  line.batch.requests.reserve(requests_json.size());
  for (std::size_t r = 0; r < requests_json.size(); ++r) {
    line.batch.requests.push_back(parse_request(checker, requests_json[r], index_path("requests", r)));
  }
  return line;
}

}  // namespace

// FIELD and REASON are cut to their limits here, whoever raised the error, so the line stays short.
TraceError::TraceError(std::string file, std::int64_t line, std::string field, std::string reason)
    : TraceError(std::move(file), line, one_line(clip(field, limits::error_field_bytes)),
                 one_line(clip(reason, limits::error_reason_bytes)), Clipped{}) {}

TraceError::TraceError(std::string file, std::int64_t line, std::string field, std::string reason, Clipped)
    : std::runtime_error(one_line(fmt::format("{}:{}: {}: {}", file, line, field, reason))),
      file_(std::move(file)),
      line_(line),
      field_(std::move(field)),
      reason_(std::move(reason)) {}

TraceReader::TraceReader(const std::string& path) : name_(path) {
  auto file = std::make_unique<std::ifstream>(path);
  if (!file->is_open() && (errno == EMFILE || errno == ENFILE || errno == ENOMEM)) {
    // Out of descriptors or memory is this process's limit, not a bad trace (not exit 2).
    throw std::runtime_error(fmt::format("cannot open the trace {}: {} (a limit of this process or system)", path, std::strerror(errno)));
  }
  if (!file->is_open()) throw TraceError(path, 0, "file", fmt::format("cannot open: {}", std::strerror(errno)));
  in_ = std::move(file);
  read_header();
}

TraceReader::TraceReader(std::unique_ptr<std::istream> in, std::string name) : in_(std::move(in)), name_(std::move(name)) {
  if (!in_) throw std::invalid_argument("TraceReader: null stream");
  read_header();
}

TraceReader::~TraceReader() = default;

TraceError detail::line_too_long(const std::string& file, std::int64_t line) {
  return TraceError(file, line, "json", fmt::format("the line is longer than {} MiB, the longest line a trace may have (traces/README.md)",
                                                    detail::kLineBytesMax >> 20));
}

void TraceReader::read_header() {
  std::string text;
  const detail::LineRead read = detail::read_line(*in_, text);
  if (read == detail::LineRead::too_long) throw detail::line_too_long(name_, 1);
  if (read == detail::LineRead::end) {
    if (in_->bad()) throw TraceError(name_, 1, "file", "read error");
    throw TraceError(name_, 1, "header", "the file is empty (expected the trace header on line 1)");
  }
  line_ = 1;
  const LineChecker checker(name_, line_);
  header_ = parse_header(checker, checker.parse_object(text));
  repeated_pages_.size_for(header_.setting.pool_pages);
}

std::optional<model::Batch> TraceReader::next() {
  model::Batch batch;
  if (!next(batch)) return std::nullopt;
  return batch;
}

bool TraceReader::next(model::Batch& batch) {
  const detail::LineRead read = detail::read_line(*in_, text_);
  if (read == detail::LineRead::too_long) throw detail::line_too_long(name_, line_ + 1);
  if (read == detail::LineRead::end) {
    if (in_->bad()) throw TraceError(name_, line_ + 1, "file", "read error");
    return false;
  }
  ++line_;
  const LineChecker checker(name_, line_);
  const std::int64_t expected_index = batch_index_ + 1;
  // The fast path, or on any doubt the DOM path (see BatchScanner); then the same checks of meaning.
  detail::BatchLine line;
  line.batch = std::move(batch);
  if (!BatchScanner::read(text_, line)) line = parse_batch_shape(checker, checker.parse_object(text_), expected_index);
  batch = std::move(line.batch);
  check_batch_number(checker, line.index, expected_index);
  checker.check(model::validate(header_.setting, batch));
  checker.check(repeated_pages_.find(batch));
  ++batch_index_;
  return true;
}

namespace detail {

std::optional<BatchLine> read_batch_line_fast(const std::string& text) {
  BatchLine line;
  if (!BatchScanner::read(text, line)) return std::nullopt;
  return line;
}

BatchLine read_batch_line_dom(const std::string& text, const std::string& file, std::int64_t line, std::int64_t expected_index) {
  const LineChecker checker(file, line);
  return parse_batch_shape(checker, checker.parse_object(text), expected_index);
}

}  // namespace detail

nlohmann::json header_to_json(const TraceHeader& header) {
  const model::Setting& setting = header.setting;
  nlohmann::json kinds = nlohmann::json::array();
  for (const model::BufferKind& kind : setting.kinds) kinds.push_back(kind.name);
  const auto cap = [](const std::optional<std::int64_t>& value) { return value ? nlohmann::json(*value) : nlohmann::json(nullptr); };
  return {
      {"format", kFormatName},
      {"version", kFormatVersion},
      {"cp", setting.cp},
      {"page_size", setting.page_size},
      {"buffer_kinds", kinds},
      {"layers", {{"count", setting.layer_count()}, {"pattern", setting.layer_pattern}}},
      {"pool_pages", setting.pool_pages},
      {"split", model::to_string(setting.split)},
      {"caps",
       {{"max_total_extend_tokens", cap(setting.caps.max_total_extend_tokens)},
        {"max_batch_requests", cap(setting.caps.max_batch_requests)},
        {"staging_mib", cap(setting.caps.staging_mib_override)}}},
      {"source", header.source},
  };
}

nlohmann::json batch_to_json(const model::Batch& batch, std::int64_t batch_index) {
  nlohmann::json requests = nlohmann::json::array();
  for (const model::Request& request : batch.requests) {
    requests.push_back({{"prefix_len", request.prefix_len},
                        {"extend_len", request.extend_len},
                        {"prefix_pages", request.prefix_pages}});
  }
  return {{"batch", batch_index}, {"requests", std::move(requests)}};
}

// nlohmann's objects are std::maps, so its dump() writes keys in sorted order; this writes them in
// that order too, and integers in plain decimal as dump() does, so both give the same bytes. The
// line is sized for its longest possible text first and written through a pointer: an append per
// page id costs more than the digits themselves.
void append_batch_line(const model::Batch& batch, std::int64_t batch_index, std::string& line) {
  constexpr std::size_t kIntegerChars = 20;  // INT64_MIN, the longest an int64 prints
  constexpr std::string_view kRequest = ",{\"extend_len\":,\"prefix_len\":,\"prefix_pages\":[]}";
  std::size_t bound = 32 + kIntegerChars;  // {"batch":N,"requests":[ ... ]}
  for (const model::Request& request : batch.requests) bound += kRequest.size() + (request.prefix_pages.size() + 2) * (kIntegerChars + 1);
  line.resize(bound);
  char* at = line.data();
  char* const end = line.data() + line.size();
  const auto text = [&](std::string_view part) { at = std::copy(part.begin(), part.end(), at); };
  const auto integer = [&](std::int64_t value) { at = std::to_chars(at, end, value).ptr; };
  text("{\"batch\":");
  integer(batch_index);
  text(",\"requests\":[");
  for (std::size_t r = 0; r < batch.requests.size(); ++r) {
    const model::Request& request = batch.requests[r];
    text(r == 0 ? "{\"extend_len\":" : ",{\"extend_len\":");
    integer(request.extend_len);
    text(",\"prefix_len\":");
    integer(request.prefix_len);
    text(",\"prefix_pages\":[");
    for (std::size_t k = 0; k < request.prefix_pages.size(); ++k) {
      if (k > 0) *at++ = ',';
      integer(request.prefix_pages[k]);
    }
    text("]}");
  }
  text("]}");
  line.resize(static_cast<std::size_t>(at - line.data()));
}

// The writer refuses what the reader would refuse, so a written trace always reads back.
TraceWriter::TraceWriter(std::ostream& out, const TraceHeader& header) : out_(out), setting_(header.setting) {
  if (const std::optional<model::Problem> problem = model::validate(header.setting)) {
    throw std::invalid_argument(fmt::format("TraceWriter: invalid setting: {}: {}", problem->field, problem->reason));
  }
  repeated_pages_.size_for(setting_.pool_pages);
  if (!header.source.is_object()) throw std::invalid_argument("TraceWriter: source must be a JSON object");
  out_ << header_to_json(header).dump() << '\n';
  if (!out_) throw std::runtime_error("TraceWriter: writing the header failed");
}

void TraceWriter::write(const model::Batch& batch) {
  if (const std::optional<model::Problem> problem = model::validate(setting_, batch)) {
    throw std::invalid_argument(fmt::format("TraceWriter: invalid batch {}: {}: {}", next_index_, problem->field, problem->reason));
  }
  if (const std::optional<model::Problem> problem = repeated_pages_.find(batch)) {  // as the reader checks
    throw std::invalid_argument(fmt::format("TraceWriter: invalid batch {}: {}: {}", next_index_, problem->field, problem->reason));
  }
  append_batch_line(batch, next_index_, line_);
  line_ += '\n';
  out_ << line_;
  if (!out_) throw std::runtime_error(fmt::format("TraceWriter: writing batch {} failed", next_index_));
  ++next_index_;
}

}  // namespace cpkv::traces
