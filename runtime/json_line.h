#ifndef STRATA_RUNTIME_JSON_LINE_H_
#define STRATA_RUNTIME_JSON_LINE_H_

#include <string>

#include "nlohmann/json.hpp"

namespace strata {

// `value` on one line with ", " and ": " between items, as Python's
// json.dumps writes it and as the --metrics lines and trace events have
// always looked (readers match '{"step": '). Strings are escaped and numbers
// written by nlohmann (non-finite floats as null); bytes that are not UTF-8
// become U+FFFD instead of throwing. Objects keep their insertion order.
std::string JsonLine(const nlohmann::ordered_json& value);

}  // namespace strata

#endif  // STRATA_RUNTIME_JSON_LINE_H_
