#ifndef STRATA_PROTO_UTF8_H_
#define STRATA_PROTO_UTF8_H_

#include <string_view>

namespace strata {

// Whether s is well-formed UTF-8: no overlong forms, surrogates (U+D800 to
// U+DFFF) or values past U+10FFFF, as proto3 strings and JSON require.
bool IsValidUtf8(std::string_view s);

// Whether s holds an ASCII control character (below 0x20, or DEL): a name
// with one would break an error's single line or drive the terminal. A tab
// breaks neither, and `allow_tab` lets it pass (a path may hold one).
bool HasControlCharacter(std::string_view s, bool allow_tab = false);

}  // namespace strata

#endif  // STRATA_PROTO_UTF8_H_
