// "How it was made": command, commit, compiler, flags, date, threads, device.
#pragma once
#include <string>

namespace qkmla::cli {

std::string provenance(const std::string& command_line, int threads);

}  // namespace qkmla::cli
