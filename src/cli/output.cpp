#include "cli/output.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>

namespace qkmla::cli {

int write_output(const std::string& text, const std::string& path, const std::string& flag) {
  if (path.empty()) {
    std::cout << text << std::flush;
    if (std::cout) return 0;
    std::cerr << "qkmla: standard output cannot be written (" << std::strerror(errno) << ")\n";
    return 2;
  }
  std::ofstream o(path);
  if (o) {
    o << text;
    o.close();
  }
  if (!o) {
    std::cerr << "qkmla: " << flag << " " << path << ": cannot be written (" << std::strerror(errno)
              << ")\n";
    return 2;
  }
  return 0;
}

}  // namespace qkmla::cli
