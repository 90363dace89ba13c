// hmc::printable(): user text (module, scenario and file names) made safe for a terminal.

#include "hmc/text.hpp"

#include <doctest/doctest.h>

#include <string>
#include <string_view>

using hmc::printable;
using namespace std::string_literals;

TEST_SUITE("text") {
  TEST_CASE("plain ASCII and valid multi-byte UTF-8 are copied unchanged") {
    CHECK(printable("") == "");
    CHECK(printable("scratch_linear a/b ~1 \"q\" 'x' {}") == "scratch_linear a/b ~1 \"q\" 'x' {}");
    CHECK(printable("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80") ==
          "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");  // é € 😀
    CHECK(printable("\xC2\xA0") == "\xC2\xA0");          // U+00A0, first code point past C1
  }

  TEST_CASE("a newline cannot start a fake line such as '# OK'") {
    const std::string name = "a\n# OK: 1 scenario passed";
    const std::string shown = printable(name);
    CHECK(shown == "a\\n# OK: 1 scenario passed");
    CHECK(shown.find('\n') == std::string::npos);
    CHECK(printable("x\r# OK") == "x\\r# OK");
    CHECK(printable("a\tb") == "a\\tb");
  }

  TEST_CASE("NUL, ESC, DEL and every other C0 byte are escaped as hex") {
    CHECK(printable("a\0b"s) == "a\\x00b");
    CHECK(printable("\x1b[2J\x1b]0;title\x07") == "\\x1b[2J\\x1b]0;title\\x07");
    CHECK(printable("\x7f") == "\\x7f");
    for (int byte = 0; byte < 0x20; ++byte) {
      const std::string shown = printable(std::string(1, static_cast<char>(byte)));
      CAPTURE(byte);
      CHECK(shown.size() >= 2);
      CHECK(shown[0] == '\\');
      for (char c : shown) CHECK((c >= 0x20 && c < 0x7F));
    }
  }

  TEST_CASE("C1 controls, line separators and bidi overrides are escaped as code points") {
    CHECK(printable("\xC2\x80") == "\\u0080");
    CHECK(printable("\xC2\x9B" "31m") == "\\u009b31m");  // CSI: an escape sequence in one char
    CHECK(printable("\xC2\x9F") == "\\u009f");
    CHECK(printable("a\xE2\x80\xA8z") == "a\\u2028z");
    CHECK(printable("\xE2\x80\xA9") == "\\u2029");
    CHECK(printable("\xE2\x80\xAE" "cod.exe") == "\\u202ecod.exe");  // right-to-left override
    CHECK(printable("\xE2\x81\xA6\xE2\x81\xA9") == "\\u2066\\u2069");
  }

  TEST_CASE("bytes that are not valid UTF-8 are escaped one by one") {
    CHECK(printable("\xFF") == "\\xff");
    CHECK(printable("a\x80z") == "a\\x80z");                  // stray continuation byte
    CHECK(printable("\xC0\xAF") == "\\xc0\\xaf");             // overlong '/'
    CHECK(printable("\xE0\x80\xAF") == "\\xe0\\x80\\xaf");    // overlong, 3 bytes
    CHECK(printable("\xED\xA0\x80") == "\\xed\\xa0\\x80");    // UTF-16 surrogate
    CHECK(printable("\xF4\x90\x80\x80") == "\\xf4\\x90\\x80\\x80");  // past U+10FFFF
    CHECK(printable("\xE2\x82") == "\\xe2\\x82");             // truncated at the end
    CHECK(printable("\xE2\x82x") == "\\xe2\\x82x");           // truncated before ASCII
    CHECK(printable("\xC3\xA9\xC3") == "\xC3\xA9\\xc3");
  }

  TEST_CASE("printable is idempotent, so escaped text may pass through it again") {
    const std::string inputs[] = {"a\n# OK"s, "\x1b[31m"s, "\0\x7f\xC2\x85\xFF"s,
                                  "back\\slash \\n"s, "\"\\u001b\""s, "\xE2\x80\xAE"s};
    for (const std::string& input : inputs) {
      const std::string once = printable(input);
      CAPTURE(once);
      CHECK(printable(once) == once);
    }
    CHECK(printable("C:\\dir\\n") == "C:\\dir\\n");  // a backslash is kept as is
  }
}
