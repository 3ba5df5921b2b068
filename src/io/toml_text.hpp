// TOML text (budget tables, gate matrices, --config files) parsed with toml++, bad input reported
// as InputError naming the file, the line and column, and the problem.
#pragma once
#include <toml++/toml.h>

#include <string>

namespace qkmla {

// toml++ 3.3 (Debian 12) reaches __builtin_unreachable() when it classifies some non-ASCII code
// points as whitespace (marzer/tomlplusplus#190, #295; fixed upstream by PR #305, not in 3.3): a
// non-ASCII character where TOML allows only ASCII (outside strings and comments, and after a
// line-ending backslash in a multi-line string) is undefined behaviour there. parse_toml refuses
// exactly those characters before toml++ sees them: TOML 1.0 allows none of them, so no valid file
// is refused.
toml::table parse_toml(const std::string& text, const std::string& path);

}  // namespace qkmla
