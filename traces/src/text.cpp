#include "cpkv/traces/text.hpp"

#include <fmt/format.h>

namespace cpkv::traces {

std::size_t utf8_sequence_bytes(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(at);
  const std::size_t length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
  if (length == 0 || at + length > text.size()) return 0;
  for (std::size_t k = 1; k < length; ++k) {
    if ((byte(at + k) & 0xC0) != 0x80) return 0;
  }
  // As strict as nlohmann's decoder (RFC 3629): no overlong form, no surrogate, nothing past U+10FFFF.
  const unsigned char second = length > 1 ? byte(at + 1) : 0;
  if (lead == 0xC0 || lead == 0xC1 || lead > 0xF4) return 0;
  if ((lead == 0xE0 && second < 0xA0) || (lead == 0xED && second >= 0xA0)) return 0;
  if ((lead == 0xF0 && second < 0x90) || (lead == 0xF4 && second >= 0x90)) return 0;
  return length;
}

std::string escape_bytes(std::string_view text, bool controls) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t at = 0; at < text.size();) {
    const auto byte = static_cast<unsigned char>(text[at]);
    const std::size_t length = utf8_sequence_bytes(text, at);
    if (length == 0 || (controls && (byte < 0x20 || byte == 0x7F))) {
      out += fmt::format("\\x{:02X}", byte);
      ++at;
      continue;
    }
    out.append(text, at, length);
    at += length;
  }
  return out;
}

}  // namespace cpkv::traces
