// `qkmla report`: every registered implementation in every requested profile, judged against the
// truth on the same bits, with the reference's own accuracy measured at two precisions (conventions
// §4, §5).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "render/rows.hpp"

namespace qkmla {

struct ReportOptions {
  MlaConfig cfg;  // dims, scenario, seed; profile is overridden per profile
  std::vector<Profile> profiles{Profile::FP64, Profile::FP32, Profile::BF16, Profile::FP16,
                                Profile::FP8};
  int ref_bits = 113;  // P
  int check_bits = 0;  // 0: P + 64
  int threads = 2;
  bool gpu_model = true;   // gpu.model.* rows (the kernels' CPU model) in the GPU profiles
  bool gpu_device = true;  // gpu.absorbed.* / gpu.explicit.* rows when a CUDA device exists
  // From this many latent values, kv_c, k_pe and the rope tables are held as floats
  // (compact_long_context: the same values; 0.67 GB less at 262144 tokens of paper-decode).
  // 2^25: from 65536 tokens at r = 512.
  int64_t compact_latent_values = int64_t(1) << 25;
  std::function<void(const std::string&)> progress;  // may be empty
};

struct ProfileReference {
  std::string profile;
  int bits = 0, check_bits = 0;
  double agreeing_bits = 0;  // ref.explicit at P vs at check_bits
  double required_bits = 0;  // stored-dtype precision + 20 (conventions §4)
  double dots_seconds = 0, explicit_seconds = 0, absorbed_seconds = 0, check_seconds = 0;
};

struct Report {
  MlaConfig cfg;
  std::vector<ProfileReference> references;
  std::vector<Row> rows;           // judged (harness/judge.hpp), grouped by profile
  std::vector<std::string> notes;  // e.g. "no CUDA device: GPU rows skipped", kernel-vs-model bits
  double total_seconds = 0;
  bool reference_ok() const;
};

Report run_report(const ReportOptions& opts);

// How the tables look: the default columns (implementation, tensor, rel_l2, max_ulp, ratio,
// vs_explicit, verdict) or every column (`wide`); rows in registry order or, within each profile,
// the largest ratio first (`worst_first`).
struct ReportView {
  bool wide = false;
  bool worst_first = false;
};

// Renderers; each starts with the summary (report/summary.hpp). `how` says how the report was
// made (command, commit, compiler, flags). `svgs`: charts to inline in the HTML (SVG documents).
std::string render_table(const Report& r, const std::string& how, const ReportView& v = {});
std::string render_markdown(const Report& r, const std::string& how, const ReportView& v = {});
std::string render_html(const Report& r, const std::string& how, const ReportView& v,
                        const std::vector<std::string>& svgs);
std::string render_json(const Report& r, const std::string& how);
std::string render_csv(const Report& r);

}  // namespace qkmla
