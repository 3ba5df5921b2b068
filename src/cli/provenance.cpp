#include "cli/provenance.hpp"

#include <fmt/format.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "cli/build_commit.inc"
#include "gemm/ordered_gemm.hpp"
#include "gpu/qkmla_gpu.hpp"
#include "reference/slice_gemm.hpp"

namespace qkmla::cli {

namespace {
std::string run(const std::string& cmd) {
  std::array<char, 256> buf{};
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    while (fgets(buf.data(), int(buf.size()), p)) out += buf.data();
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}
}  // namespace

std::string provenance(const std::string& command_line, int threads) {
  // The commit the binary was built from; the tree's own, if it has moved on since, beside it.
  std::string commit = QKMLA_BUILD_COMMIT;
  const std::string tree =
      run("git -C '" QKMLA_SOURCE_DIR "' describe --always --dirty --abbrev=12 2>/dev/null");
  if (commit.empty()) commit = tree;
  if (commit.empty() && std::getenv("QKMLA_COMMIT"))
    commit = std::getenv("QKMLA_COMMIT");  // a copied tree
  if (commit.empty()) commit = "unknown (not a git checkout)";
  if (!tree.empty() && tree != commit)
    commit += " (built then; the source tree is now at " + tree + ")";
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::string why;
  const std::string device =
      gpu::device_available(&why) ? gpu::device_description() : "CPU only (" + why + ")";
  // The instruction sets Highway chose on this CPU: they change the speed, never the values.
  const std::string products = ref::slice_gemm_target(), projections = gemm::ordered_gemm_target();
  const std::string simd = products == projections
                               ? products
                               : products + " (exact products), " + projections + " (projections)";
  return fmt::format(
      "`{}` at commit {}, {}, compiler {} with flags `{}`, CUDA: {}, {} threads, "
      "SIMD: {} (Highway), device: {}, {}",
      command_line, commit, QKMLA_BUILD_TYPE, QKMLA_COMPILER, QKMLA_FLAGS, QKMLA_CUDA_INFO, threads,
      simd, device, date);
}

}  // namespace qkmla::cli
