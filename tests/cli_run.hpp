// Running the qkmla binary (QKMLA_BINARY, set by tests/CMakeLists.txt) from a test: exit code and
// the merged stdout and stderr.
#pragma once
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace qkmla::test {

struct Run {
  int code;
  std::string out;
};

// A shell command line, stderr merged into stdout.
inline Run run_raw(const std::string& cmd_line) {
  const std::string cmd = cmd_line + " 2>&1";
  Run r{-1, ""};
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// qkmla with these arguments.
inline Run run(const std::string& args) { return run_raw(std::string(QKMLA_BINARY) + " " + args); }

}  // namespace qkmla::test
