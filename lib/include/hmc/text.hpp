#pragma once
// Text from users (module, scenario and file names, JSON keys) made safe to print on a
// terminal or in a line-oriented log: no user text may end a line, fake a `# OK` footer or
// send a terminal escape sequence.

#include <string>
#include <string_view>

namespace hmc {

// `text` with every control character and every byte that is not UTF-8 escaped:
//   newline, carriage return, tab  -> \n \r \t
//   other C0 bytes (NUL, ESC, ...) and DEL -> \x00 \x1b \x7f
//   C1 controls U+0080..U+009F, the line and paragraph separators U+2028/U+2029 and the
//   bidirectional overrides and isolates U+202A..U+202E, U+2066..U+2069 -> \u0085 \u202e
//   a byte that is not part of valid UTF-8 (stray continuation, overlong form, surrogate,
//   past U+10FFFF, truncated sequence) -> \xNN, one per byte
// Everything else, valid multi-byte UTF-8 included, is copied. A backslash is kept as is,
// so printable() is idempotent: printable(printable(s)) == printable(s), and text that is
// already escaped (a JSON string literal, an error message built from printable parts) may
// safely be passed through it again. Thread-safe, never throws but std::bad_alloc.
std::string printable(std::string_view text);

}  // namespace hmc
