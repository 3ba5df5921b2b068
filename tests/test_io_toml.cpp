// io.toml.*: the TOML entry point every TOML input goes through (io/toml_text.hpp).
#include <doctest/doctest.h>

#include "io/safetensors.hpp"
#include "io/toml_text.hpp"

using namespace qkmla;

namespace {

std::string refusal(const std::string& text) {
  try {
    parse_toml(text, "t.toml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// The inputs toml++ 3.3 meets with undefined behaviour (found by fuzz_text; tomlplusplus#190,
// #295) are refused with line and column before it sees them.
TEST_CASE("io.toml.non_ascii_where_toml_allows_only_ascii_is_refused") {
  CHECK(refusal("\xc2\xa7") ==
        "t.toml: toml: line 1, column 1: non-ASCII byte 0xC2 outside a string or comment (TOML "
        "allows it only inside strings and comments; if it is in a string, put a blank before the "
        "opening quote)");
  CHECK(refusal("\xcc\xaa").find("line 1, column 1: non-ASCII byte 0xCC") != std::string::npos);
  CHECK(refusal("a = 1\nb = 2 \xc3\xa9\n").find("line 2, column 7") != std::string::npos);
  CHECK(refusal("s = \"\"\"\\\n\xc2\xa7\"\"\"\n").find("line 2, column 1") != std::string::npos);
  CHECK(refusal("s = \"\"\"\\   \n  \n  \xc2\xa7\"\"\"\n").find("line 3, column 3") !=
        std::string::npos);
  // A quote where no string may start: toml++ scans on past it, classifying what follows (found
  // by the fuzz campaign: `seqlens = [0, 1"""p...` followed by U+0410 within 120 characters).
  CHECK(refusal("s = [0, 1\"\"\"p\xd0\x90\"\"\"]").find("line 1, column 14") != std::string::npos);
  CHECK(refusal("a = 1.\"\xc3\xa9\"").find("line 1, column 8") != std::string::npos);
  CHECK(refusal("a = \"x\"\"\xc3\xa9\"").find("line 1, column 9") != std::string::npos);
  // A quote inside a bare value run is no string either (second campaign: `[++d_v\x02{"h...`).
  CHECK(refusal("e = [+d{\"h)\xc2\xa7\"]").find("line 1, column 12") != std::string::npos);
  CHECK(refusal("e = [\n 1.5=\"\xc3\xa9\"]").find("line 2, column 7") != std::string::npos);
  CHECK(refusal("e = 1=\"\xc3\xa9\"").find("line 1, column 8") != std::string::npos);
  // A backslash before a non-ASCII character (found by fuzz_text in the test command: U+FDC0
  // after a backslash in a multi-line string reached TOML_UNREACHABLE).
  CHECK(refusal("s = \"\"\"a\\\xef\xb7\x80\"\"\"\n") ==
        "t.toml: toml: line 1, column 10: non-ASCII byte 0xEF after a backslash (not a TOML "
        "escape sequence)");
  CHECK(refusal("s = \"a\\\xc2\xa7\"").find("line 1, column 8") != std::string::npos);
}

// Non-ASCII text where TOML allows it parses as before.
TEST_CASE("io.toml.non_ascii_in_strings_and_comments_is_kept") {
  const toml::table t = parse_toml(
      "# \xc2\xa7 6\na = \"\xc2\xa7 1.4\" # \xc3\xa9\nb = '\xc3\xa9'\nc = \"\"\"x\n\xc2\xa7\"\"\"\n"
      "d = '''\xc2\xa7''''\ne = \"\"\"\\\n  y\xc2\xa7\"\"\"\nf = \"q\\\"\xc2\xa7\"\n"
      "g.\"\xc3\xa9\" = 1\nh = [\n  \"\xc3\xa9\",\"\xc2\xa7\"]\ni = {j = "
      "\"\xc3\xa9\"}\nk=\"\xc3\xa9\"\n"
      "[\"\xc3\xa9\"]\nl = [[\"\xc3\xa9\"], {m = \"\xc2\xa7\"}]\n",
      "t.toml");
  CHECK(t["a"].value<std::string>() == "\xc2\xa7 1.4");
  CHECK(t["b"].value<std::string>() == "\xc3\xa9");
  CHECK(t["c"].value<std::string>() == "x\n\xc2\xa7");
  CHECK(t["d"].value<std::string>() == "\xc2\xa7'");
  CHECK(t["e"].value<std::string>() == "y\xc2\xa7");
  CHECK(t["f"].value<std::string>() == "q\"\xc2\xa7");
  CHECK(t["g"]["\xc3\xa9"].value<int64_t>() == 1);
  CHECK(t["h"][1].value<std::string>() == "\xc2\xa7");
  CHECK(t["i"]["j"].value<std::string>() == "\xc3\xa9");
  CHECK(t["k"].value<std::string>() == "\xc3\xa9");
  CHECK(t["\xc3\xa9"]["l"][0][0].value<std::string>() == "\xc3\xa9");
  CHECK(t["\xc3\xa9"]["l"][1]["m"].value<std::string>() == "\xc2\xa7");
}

TEST_CASE("io.toml.parse_errors_name_file_line_and_column") {
  CHECK(refusal("a = 1\nb = = 2\n").rfind("t.toml: toml: line 2, column ", 0) == 0);
  CHECK(refusal("[x]\n[x]\n").find("line 2") != std::string::npos);
}
