// Bytes from outside (file names, notes, quoted input) made safe for JSON and for a terminal.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace cpkv::traces {

// The length of the well-formed UTF-8 sequence at text[at] (1 to 4), or 0 when none starts there.
std::size_t utf8_sequence_bytes(std::string_view text, std::size_t at);

// `text` with every byte that is not part of a well-formed UTF-8 sequence written as the four
// characters \xNN, and, with `controls`, every control character too (a terminal would act on
// it). A file name of any bytes then fits in JSON, which nlohmann refuses to write otherwise
// ("invalid UTF-8 byte", after a whole run: issue 22, item 7), and stays recognisable.
std::string escape_bytes(std::string_view text, bool controls = false);

}  // namespace cpkv::traces
