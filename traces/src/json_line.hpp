// One line of JSON into a DOM, for the trace reader and the Mooncake log reader alike (internal to
// traces/). nlohmann's own json::parse would do, but for three things a reader of untrusted lines
// needs: a cap on nesting depth (nlohmann's copy and dump of a DOM recurse, so a 70,000-deep
// `source` crashed `cpkv plan` with SIGSEGV), refusal of a key given twice, named by its full field
// path, in time linear in the line (a callback that scanned the keys seen so far took 29.5 s for
// 80,000 keys), and error text of bounded length whatever the line holds.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

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

}  // namespace cpkv::traces::detail
