// RC_PARAMS, the RapidCheck settings `cpkv mutants` and `cpkv soak` honour (cli/rc_params.cpp).
#pragma once

#include <string>

namespace cpkv::cli {

// Throws OptionError (exit 2) naming the first key of `text` ("key=value key=value") that
// RapidCheck does not know, and listing the ones it does: RapidCheck ignores an unknown key, so a
// typo (`max_sucess=3`) ran the default 100 cases without a word (issue 22, item 21).
void refuse_unknown_rc_params_keys(const std::string& text);

// RapidCheck reads RC_PARAMS on first use and ends the process when it cannot parse it: reads it
// first, so a bad one is bad input (OptionError, exit 2) like any option.
void check_rc_params();

}  // namespace cpkv::cli
