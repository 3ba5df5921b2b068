// Memory a request needs, estimated before anything is allocated, and what the machine allows.
// A request that does not fit is refused with the size needed, what is available, and the flag that
// would reduce it (exit 2), instead of failing later in an allocation with no context.
#pragma once
#include <string>
#include <vector>

#include "core/config.hpp"

namespace qkmla {

// Refusal: what was too big and what would fit. Exit code 2.
struct ResourceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Peak bytes to hold one case and compute its truth and CPU implementations: a model fitted to
// peak RSS measured on this machine (see resources.cpp: the exact key products while they are
// held whole, the weights, the case and the implementations' per-token caches, the packed
// logits), validated on held-out shapes by reports/memory_model.sh.
double case_peak_bytes(const MlaConfig& c);

// Peak bytes of a report of the cases `at_once` (its profiles) on `threads` threads: each case's
// case_peak_bytes but for its exact products, plus the products of the largest wave the truths run
// in (compute_truths, harness/truth.hpp): one wave's products are alive at a time.
double report_peak_bytes(const std::vector<MlaConfig>& at_once, int threads);

// Peak bytes of the truth alone (`qkmla reference`), which streams: the case as doubles, each
// run's logits (one MPFR value of ~64 B per visible row x token), the cached product blocks; 2x
// margin on the logits.
double reference_peak_bytes(const MlaConfig& c);

// This process's peak resident set so far.
double peak_rss_bytes();

// Peak bytes of `qkmla certify` on one case: case_peak_bytes plus what certify holds whole for
// one sequence at a time (it never streams): its exact key and value products at the whole-product
// rate, the two forms' rational alpha_k per token and group, and the Gram check's c^T and
// M c^T products per token.
double certify_peak_bytes(const MlaConfig& c);

// Bytes this process may still allocate: the smallest of MemAvailable (/proc/meminfo), the cgroup
// v2 limit left (memory.max - memory.current) and RLIMIT_AS / RLIMIT_DATA left; `source` names the
// one that binds.
double available_bytes(std::string* source);

// Throws ResourceError when the cases held at the same time do not fit. `reduce` says how to need
// less (e.g. "--profile one at a time, a shorter --seqlen or a smaller --batch").
void require_memory(const std::vector<MlaConfig>& at_once, const std::string& what,
                    const std::string& reduce, double (*model)(const MlaConfig&) = case_peak_bytes);
// The same for a report (report_peak_bytes).
void require_report_memory(const std::vector<MlaConfig>& at_once, int threads,
                           const std::string& what, const std::string& reduce);

std::string human_bytes(double b);  // "5.3 GB"

}  // namespace qkmla
