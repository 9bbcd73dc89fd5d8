// One line of JSON into a DOM, for the trace reader and the Mooncake log reader alike (internal to
// traces/). nlohmann's own json::parse would do, but for three things a reader of untrusted lines
// needs: a cap on nesting depth (nlohmann's copy and dump of a DOM recurse, so a 70,000-deep
// `source` crashed `cpkv plan` with SIGSEGV), refusal of a key given twice, named by its full field
// path, in time linear in the line (a callback that scanned the keys seen so far took 29.5 s for
// 80,000 keys), and error text of bounded length whatever the line holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace cpkv::traces {
class TraceError;
}

namespace cpkv::traces::detail {

// Why a line is not a JSON DOM we accept: `field` is a field path (`requests[0].extend_len`) or
// `json` for a syntax error.
struct LineProblem {
  std::string field;
  std::string reason;
};

// The line's single JSON value, or nullopt with `problem` set: a syntax error (with nlohmann's
// byte offset and reason, its echo of the input cut short), nesting deeper than
// limits::json_depth_max, or a key given twice in one object. Runs in time linear in the line
// (up to the log factor of nlohmann's ordered std::map) and never recurses.
std::optional<nlohmann::json> parse_line(const std::string& text, LineProblem& problem);

// `text` whole when it has at most `max_bytes` bytes, else its first bytes (never half a UTF-8
// character) followed by "... (N bytes)": what the error line quotes of an input key or value.
std::string clip(std::string_view text, std::size_t max_bytes);

// `path` extended by an object key, or by an array index: `caps` + `staging_mib` is
// `caps.staging_mib`, `requests` + 3 is `requests[3]`; the key is clipped for the error line.
std::string join_path(std::string_view path, std::string_view key);
std::string index_path(std::string_view path, std::size_t index);

// The longest line either reader takes (traces/README.md states it): a line holding one request
// at model::limits::request_tokens_max with page_size 1 (2^24 page ids of up to 10 digits, 185 MB)
// fits. A longer line is refused once this many bytes are read, so a file of no newlines (1 GiB of
// NUL bytes took 2.1 GB and 5.8 s: issue 22, item 11) costs at most this much memory.
inline constexpr std::size_t kLineBytesMax = std::size_t{256} << 20;

// The result of read_line.
enum class LineRead { line, end, too_long };
// Reads the next line of `in` into `text` (without its '\n'; the last line may lack one), in
// chunks, never holding more than kLineBytesMax bytes of it: too_long once the line has more.
LineRead read_line(std::istream& in, std::string& text);
// The refusal of a line longer than kLineBytesMax, at `line` of `file`.
TraceError line_too_long(const std::string& file, std::int64_t line);

}  // namespace cpkv::traces::detail
