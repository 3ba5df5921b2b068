#include "io/toml_text.hpp"

#include <fmt/format.h>

#include "io/safetensors.hpp"

namespace qkmla {

namespace {

// The lexical states of TOML that decide where a non-ASCII byte may stand.
enum class Lex { Bare, Comment, Basic, Literal, MultiBasic, MultiLiteral };

struct Scan {
  const std::string& s;
  const std::string& path;
  size_t i = 0, line = 1, line_start = 0;

  bool at(const char* delim) const { return s.compare(i, 3, delim) == 0; }
  void newline() { ++line, line_start = i + 1; }
  [[noreturn]] void refuse() const {
    throw InputError(path, "toml",
                     fmt::format("line {}, column {}: non-ASCII byte 0x{:02X} outside a string or "
                                 "comment (TOML allows it only inside strings and comments; if it "
                                 "is in a string, put a blank before the opening quote)",
                                 line, i - line_start + 1, (unsigned char)s[i]));
  }
  // A backslash at i followed by a non-ASCII byte: never a TOML escape, and toml++ asks whether
  // that character is whitespace (a line-ending backslash), which is undefined for some (fuzz_text:
  // U+FDC0 after a backslash in a multi-line string).
  void refuse_escape() {
    if (i + 1 >= s.size() || (unsigned char)s[i + 1] < 0x80) return;
    ++i;
    throw InputError(path, "toml",
                     fmt::format("line {}, column {}: non-ASCII byte 0x{:02X} after a backslash "
                                 "(not a TOML escape sequence)",
                                 line, i - line_start + 1, (unsigned char)s[i]));
  }
  // Closes a multi-line string at i: its delimiter may be preceded by up to two quotes of content.
  void close_run(char quote) {
    size_t n = 0;
    while (i + n < s.size() && s[i + n] == quote && n < 5) ++n;
    i += n - 1;
  }
  // A line-ending backslash in a multi-line basic string: the whitespace and newlines after it are
  // trimmed, and toml++ classifies the first character after them.
  void line_ending_backslash() {
    refuse_escape();
    size_t j = i + 1;
    while (j < s.size() && (s[j] == ' ' || s[j] == '\t' || s[j] == '\r')) ++j;
    if (j >= s.size() || s[j] != '\n') {
      ++i;  // an escape sequence: its first character cannot end the string
      return;
    }
    for (++i; i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n'); ++i)
      if (s[i] == '\n') newline();
    if (i < s.size() && (unsigned char)s[i] >= 0x80) refuse();
    --i;
  }
};

// toml++ classifies the characters of a bare run (a bare key or a bare value: a number, a date, a
// boolean, or garbage) and, for a value, scans ahead up to ~120 characters until a terminator
// (blank, newline, "," "]" "}" "#"), through quotes. So a quote opens a string only outside a run,
// and after "=", "[", ",", "{", first on its line, or after the "." of a dotted key at the top
// level. In key position (top level, before the line's "=") "=" and "." end a run. The price: a
// non-ASCII string right after "=" with no blank inside an inline table, or after a dotted key
// part in a table header or inline table, is refused (write a blank, or quote the whole key).
struct Bare {
  char prev = '\n';  // the last character that is not a blank ("\n": none yet on this line)
  bool eq_on_line = false, run = false;
  int depth = 0;  // "[" and "{" opened outside a run and not yet closed

  bool key_position() const { return depth == 0 && !eq_on_line; }
  bool opens_string() const {
    return !run && (prev == '=' || prev == '[' || prev == ',' || prev == '{' || prev == '\n' ||
                    (prev == '.' && key_position()));
  }
  void step(char c) {
    if (c == '\n') {
      prev = '\n', eq_on_line = false, run = false;
      return;
    }
    if (c == ' ' || c == '\t' || c == '\r') {
      run = false;
      return;
    }
    if (c == ',') {
      run = false;
    } else if (c == ']' || c == '}') {
      run = false;
      if (depth > 0) --depth;
    } else if (key_position() && (c == '=' || c == '.')) {
      run = false;
    } else if ((c == '[' || c == '{' || c == '=') && !run) {
      depth += c != '=';  // structural
    } else {
      run = true;  // a bare character, or "[", "{", "=" inside a run
    }
    prev = c;
    eq_on_line = eq_on_line || c == '=';
  }
};

void refuse_unclassifiable(const std::string& text, const std::string& path) {
  Scan sc{text, path};
  Lex st = Lex::Bare;
  Bare bare;
  for (; sc.i < text.size(); ++sc.i) {
    const char c = text[sc.i];
    if (c == '\n') sc.newline();
    switch (st) {
      case Lex::Bare:
        if ((unsigned char)c >= 0x80) sc.refuse();
        if (c == '#') {
          st = Lex::Comment, bare.run = false;
        } else if ((c == '"' || c == '\'') && bare.opens_string()) {
          const bool multi = sc.at(c == '"' ? "\"\"\"" : "'''");
          st = c == '"' ? (multi ? Lex::MultiBasic : Lex::Basic)
                        : (multi ? Lex::MultiLiteral : Lex::Literal);
          if (multi) sc.i += 2;
          bare.prev = c;  // a closed string is not followed by another opening
        } else {
          bare.step(c);
        }
        break;
      case Lex::Comment:
        if (c == '\n') st = Lex::Bare, bare.step(c);
        break;
      case Lex::Basic:
        if (c == '\\') sc.refuse_escape();
        if (c == '\\' && sc.i + 1 < text.size() && text[sc.i + 1] != '\n')
          ++sc.i;
        else if (c == '"' || c == '\n')
          st = Lex::Bare;
        break;
      case Lex::Literal:
        if (c == '\'' || c == '\n') st = Lex::Bare;
        break;
      case Lex::MultiBasic:
        if (c == '\\')
          sc.line_ending_backslash();
        else if (sc.at("\"\"\""))
          sc.close_run('"'), st = Lex::Bare;
        break;
      case Lex::MultiLiteral:
        if (sc.at("'''")) sc.close_run('\''), st = Lex::Bare;
        break;
    }
  }
}

}  // namespace

toml::table parse_toml(const std::string& text, const std::string& path) {
  refuse_unclassifiable(text, path);
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    const toml::source_position p = e.source().begin;
    throw InputError(path, "toml",
                     fmt::format("line {}, column {}: {}", p.line, p.column, e.description()));
  }
}

}  // namespace qkmla
