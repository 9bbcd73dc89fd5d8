// One line of JSON into a DOM with a depth cap, duplicate keys named by path, bounded error text
// (json_line.hpp says why nlohmann's json::parse alone is not enough).
#include "json_line.hpp"

#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cpkv/traces/trace.hpp"

namespace cpkv::traces::detail {

namespace {

using nlohmann::json;

// nlohmann's message without its "[json.exception.parse_error.101] " tag and "parse error at line
// 1, column N: " preamble (the line is ours, the byte offset is given), with the input it echoes
// after "last read: '" cut short: an unterminated 100 MB string would be quoted whole.
std::string syntax_reason(std::size_t byte, const json::exception& error) {
  std::string_view text = error.what();
  const std::size_t tag_end = text.find("] ");
  if (tag_end != std::string_view::npos) text.remove_prefix(tag_end + 2);
  const std::size_t detail = text.find(": ");
  if (detail != std::string_view::npos) text.remove_prefix(detail + 2);
  std::string reason = fmt::format("invalid JSON at byte {}: ", byte);
  constexpr std::string_view kEcho = "last read: '";
  const std::size_t echo = text.find(kEcho);
  const std::size_t echo_end = text.rfind('\'');
  if (echo == std::string_view::npos || echo_end == std::string_view::npos || echo_end < echo + kEcho.size()) {
    return reason + std::string(text);
  }
  const std::size_t token = echo + kEcho.size();
  reason += text.substr(0, token);
  reason += clip(text.substr(token, echo_end - token), limits::quoted_value_bytes);
  reason += text.substr(echo_end);
  return reason;
}

// A SAX handler for nlohmann::json::sax_parse that builds the DOM as nlohmann's own builder does
// (one std::map insertion per member, so a duplicate is found in O(log n)), and stops at the first
// duplicate key or at nesting deeper than limits::json_depth_max, naming the field path. sax_parse
// itself keeps its state on a heap stack, so nothing here recurses however deep the input.
class StrictDomBuilder {
 public:
  bool null() { return value(nullptr); }
  bool boolean(bool v) { return value(v); }
  bool number_integer(json::number_integer_t v) { return value(v); }
  bool number_unsigned(json::number_unsigned_t v) { return value(v); }
  bool number_float(json::number_float_t v, const json::string_t&) { return value(v); }
  bool string(json::string_t& v) { return value(std::move(v)); }
  bool binary(json::binary_t& v) { return value(std::move(v)); }
  bool start_object(std::size_t) { return open(json::value_t::object); }
  bool start_array(std::size_t) { return open(json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(json::string_t& name) {
    Level& top = levels_.back();
    auto [member, inserted] = top.container->get_ref<json::object_t&>().try_emplace(std::move(name));
    if (!inserted) return fail(join_path(path(levels_.size() - 1), member->first), "duplicate key");
    top.key = &member->first;
    top.member = &member->second;
    return true;
  }

  bool parse_error(std::size_t byte, const std::string&, const json::exception& error) {
    // 406 is nlohmann's out_of_range for a number beyond a double (1e400).
    if (error.id == 406) return fail("json", "a number is out of range (larger than a double can hold)");
    return fail("json", syntax_reason(byte, error));
  }

  json& root() { return root_; }
  LineProblem& problem() { return problem_; }

 private:
  // An open object or array: where it is, and for an object the member being read.
  struct Level {
    json* container = nullptr;
    const std::string* key = nullptr;
    json* member = nullptr;
  };

  // Where the next value goes: the root, the end of the open array, or the open object's member.
  json* slot() {
    if (levels_.empty()) return &root_;
    Level& top = levels_.back();
    if (top.container->is_array()) {
      json::array_t& array = top.container->get_ref<json::array_t&>();
      array.emplace_back();
      return &array.back();
    }
    return top.member;
  }

  template <typename Value>
  bool value(Value&& v) {
    *slot() = json(std::forward<Value>(v));
    return true;
  }

  bool open(json::value_t type) {
    json* place = slot();
    if (levels_.size() >= limits::json_depth_max) {
      return fail(path(levels_.size()), fmt::format("nesting deeper than {} levels (the reader's limit)", limits::json_depth_max));
    }
    *place = json(type);
    levels_.push_back(Level{place, nullptr, nullptr});
    return true;
  }

  bool close() {
    levels_.pop_back();
    return true;
  }

  // The field path of the value being read in the first `depth` open levels.
  std::string path(std::size_t depth) const {
    std::string text;
    for (std::size_t i = 0; i < depth; ++i) {
      const Level& level = levels_[i];
      text = level.container->is_array() ? index_path(text, level.container->size() - 1) : join_path(text, *level.key);
    }
    return text;
  }

  bool fail(std::string field, std::string reason) {
    problem_ = LineProblem{std::move(field), std::move(reason)};
    return false;
  }

  json root_;
  std::vector<Level> levels_;
  LineProblem problem_;
};

}  // namespace

std::optional<json> parse_line(const std::string& text, LineProblem& problem) {
  StrictDomBuilder builder;
  if (!json::sax_parse(text, &builder, json::input_format_t::json, /*strict=*/true, /*ignore_comments=*/false)) {
    problem = std::move(builder.problem());
    return std::nullopt;
  }
  return std::move(builder.root());
}

std::string clip(std::string_view text, std::size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  std::size_t cut = max_bytes;
  // Back off UTF-8 continuation bytes (10xxxxxx) so no character is cut in half.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return fmt::format("{}... ({} bytes)", text.substr(0, cut), text.size());
}

std::string join_path(std::string_view path, std::string_view key) {
  const std::string shown = clip(key, limits::quoted_key_bytes);
  return path.empty() ? shown : fmt::format("{}.{}", path, shown);
}

std::string index_path(std::string_view path, std::size_t index) { return fmt::format("{}[{}]", path, index); }

LineRead read_line(std::istream& in, std::string& text) {
  text.clear();
  char chunk[1 << 16];
  bool any = false;
  while (true) {
    in.getline(chunk, sizeof chunk);  // NUL bytes are kept: the count, not strlen, says what was read
    if (in.bad()) return LineRead::end;  // the caller names the read error
    const auto got = static_cast<std::size_t>(in.gcount());
    const bool chunk_full = in.fail() && !in.eof() && !in.bad() && got == sizeof chunk - 1;  // no newline yet
    if (chunk_full) {
      if (text.size() + got > kLineBytesMax) return LineRead::too_long;
      text.append(chunk, got);
      in.clear();
      any = true;
      continue;
    }
    const bool newline = !in.fail() && !in.eof();  // the delimiter was extracted and counted
    const std::size_t kept = newline && got > 0 ? got - 1 : got;
    if (text.size() + kept > kLineBytesMax) return LineRead::too_long;
    text.append(chunk, kept);
    if (newline || kept > 0 || any) {
      if (!newline) in.clear(in.rdstate() & ~std::ios::failbit);  // a last line without '\n' reads as a line
      return LineRead::line;
    }
    return LineRead::end;
  }
}

}  // namespace cpkv::traces::detail
