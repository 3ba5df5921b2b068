// Where a command's text goes: a file named by a flag, or standard output.
#pragma once
#include <string>

namespace qkmla::cli {

// Writes text to path, or to stdout when path is empty. 0, or 2 when the file cannot be written
// (checked after the last byte: a full disk, or /dev/full, fails at flush or close, not at open).
int write_output(const std::string& text, const std::string& path,
                 const std::string& flag = "--output");

}  // namespace qkmla::cli
