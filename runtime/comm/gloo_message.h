#ifndef STRATA_RUNTIME_COMM_GLOO_MESSAGE_H_
#define STRATA_RUNTIME_COMM_GLOO_MESSAGE_H_

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace strata {

// A Gloo exception's text without the source location its macros put first
// ("[./gloo/transport/tcp/pair.cc:598] Connection closed by peer ..."), which
// says nothing to a user and reached their terminal in errors.
inline std::string GlooMessage(absl::string_view text) {
  if (absl::StartsWith(text, "[")) {
    const size_t close = text.find("] ");
    if (close != absl::string_view::npos && text.substr(0, close).find(':') != absl::string_view::npos) {
      text.remove_prefix(close + 2);
    }
  }
  return std::string(text);
}

}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_GLOO_MESSAGE_H_
