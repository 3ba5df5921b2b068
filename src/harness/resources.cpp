#include "harness/resources.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <limits>

namespace qkmla {

// Fitted on peak RSS (GNU time) of `qkmla report` on this machine. The reference's exact key and
// value products (4 levels x 8 B per key/value element) are held whole up to 1 GiB and streamed in
// 4 cached 256-token blocks beyond (reference/dots.hpp, the default limit). Everything else per
// token (the case, ref.absorbed's per-token state, the CPU implementations' keys and values):
//   before streaming (c31689f-b53db8e): paper-decode 2048 / 4096 tokens 411 / 759 MB, i.e. 41.5 B
//   per key/value element (G (d_c + d_v) = 4096 per token) of which 32 B are the products;
//   streamed (787bae3): paper-decode bf16 16384 tokens 980 MB, 65536 tokens 4.17 GB (one profile
//   at a time), i.e. 65 KB per token at the margin: 12 B per key/value element + 40 B per latent
//   and rope value (71 KB) covers it with ~10 % to spare; tiny, batch 200 / 400 x 512 tokens:
//   305 / 604 MB; deepseek-v3 256 / 512 tokens: 616 / 963 MB, a 270 MB base of which 210 MB
//   scale with the weights (16.8 M elements: 12.5 B each); S_q = 4 instead of 1: +7 MB.
//   Since the CPU implementations project keys and values 256 tokens at a time (d1f3f46), the
//   same bf16 report measures 762 MB at 16384 tokens and 2.84 GB at 65536 (42 KB per token at the
//   margin), so this estimate (4.7 GB at 65536) is now conservative; it is kept until it is
//   refitted on every shape above.
double case_peak_bytes(const MlaConfig& c) {
  const double tokens = double(c.batch) * double(c.max_seqlen() + 2);  // + 2 rows of padding
  const double elems = double(c.groups) * double(c.d_c + c.d_v);       // key/value per token
  const double whole = tokens * elems * 32.0;
  const double products = whole <= double(int64_t(1) << 30) ? whole : 5 * 256 * elems * 32.0 * 2;
  const double per_token = 12.0 * elems + 40.0 * (c.latent_rank + c.d_r);
  const double weights = double(c.latent_rank) * elems;
  const double rows = double(c.batch) * c.s_q * c.heads;
  return 64e6 + 16.0 * weights + products + tokens * per_token +
         rows * 8.0 * (c.latent_rank + c.d_r + c.d_v) + rows * tokens / std::max(1, c.batch) * 8.0;
}

namespace {

double read_number(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max") return std::numeric_limits<double>::infinity();
  try {
    return std::stod(s);
  } catch (...) {
    return std::numeric_limits<double>::infinity();
  }
}

double mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return std::numeric_limits<double>::infinity();
}

double rlimit_left(int which) {
  rlimit r{};
  if (getrlimit(which, &r) != 0 || r.rlim_cur == RLIM_INFINITY)
    return std::numeric_limits<double>::infinity();
  return double(r.rlim_cur);
}

}  // namespace

double available_bytes(std::string* source) {
  struct Limit {
    double bytes;
    const char* name;
  };
  const double cg_max = read_number("/sys/fs/cgroup/memory.max");
  const double cg_cur = read_number("/sys/fs/cgroup/memory.current");
  const Limit limits[] = {{mem_available(), "MemAvailable in /proc/meminfo"},
                          {std::isinf(cg_max) || std::isinf(cg_cur) ? cg_max : cg_max - cg_cur,
                           "the cgroup's memory.max"},
                          {rlimit_left(RLIMIT_AS), "the address-space limit (ulimit -v)"},
                          {rlimit_left(RLIMIT_DATA), "the data-segment limit (ulimit -d)"}};
  const Limit* least = &limits[0];
  for (const Limit& l : limits)
    if (l.bytes < least->bytes) least = &l;
  if (source) *source = least->name;
  return least->bytes;
}

std::string human_bytes(double b) {
  if (b >= 1e12) return fmt::format("{:.3g} TB", b / 1e12);
  if (b >= 1e9) return fmt::format("{:.3g} GB", b / 1e9);
  return fmt::format("{:.3g} MB", b / 1e6);
}

void require_memory(const std::vector<MlaConfig>& at_once, const std::string& what,
                    const std::string& reduce) {
  double need = 0, largest = 0;
  for (const MlaConfig& c : at_once) {
    const double b = case_peak_bytes(c);
    need += b, largest = std::max(largest, b);
  }
  std::string source;
  const double have = available_bytes(&source);
  if (need <= 0.9 * have) return;
  std::string per;
  if (at_once.size() > 1)
    per = fmt::format(" ({} cases at once, the largest {})", at_once.size(), human_bytes(largest));
  throw ResourceError(fmt::format(
      "{} needs about {} of memory{}, more than the {} available ({}); reduce it with {}", what,
      human_bytes(need), per, human_bytes(have), source, reduce));
}

}  // namespace qkmla
