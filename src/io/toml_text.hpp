// TOML text (budget tables, gate matrices, --config files) parsed with toml++, bad input reported
// as InputError naming the file, the line and column, and the problem.
#pragma once
#include <toml++/toml.h>

#include <string>

namespace qkmla {

// toml++ 3.3 (Debian 12) reaches __builtin_unreachable() when it classifies some non-ASCII code
// points as whitespace (U+00A1-U+0499, U+2C4E-U+3047, U+FAF6-U+FEFE; marzer/tomlplusplus#190,
// #295; fixed upstream by PR #305, not in 3.3). It classifies the characters outside strings and
// comments, after a line-ending backslash in a multi-line string, and those a bare value's
// look-ahead reaches (through quotes). parse_toml refuses a non-ASCII byte at any such place before
// toml++ sees it. TOML 1.0 allows none there, except in two spellings it also refuses (a string
// right after "=" with no blank inside an inline table, a quoted dotted-key part inside a table
// header or inline table); the message says where.
toml::table parse_toml(const std::string& text, const std::string& path);

}  // namespace qkmla
