// `qkmla report --contexts 4096,16384,...`: the same report at several context lengths, one profile
// at a time (memory: one case and its truth at once), read as error against context: a table per
// profile (rows: implementation x tensor; columns: rel_l2 and max_ulp at each context) and plots of
// rel_l2 and max_ulp of `out` against context (log x), one line per implementation.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "render/plot.hpp"
#include "report/report.hpp"

namespace qkmla {

struct ContextSweep {
  std::vector<int> contexts;  // tokens per sequence, ascending
  std::vector<Report> at;     // at[i]: every profile's rows at contexts[i]
  double total_seconds = 0;
  bool reference_ok() const;
};

// progress(done, total): token-weighted work finished (each context x profile costs ~its tokens).
ContextSweep run_context_sweep(const ReportOptions& base, const std::vector<int>& contexts,
                               const std::function<void(double, double)>& progress = {});

std::string render_context_table(const ContextSweep& s, const std::string& how, bool markdown);
std::string render_context_json(const ContextSweep& s, const std::string& how);

// Per profile: rel_l2 of out, then max_ulp of out, against context.
std::vector<std::pair<std::string, Plot>> context_charts(const ContextSweep& s);  // (suffix, plot)
// Draws FILE-<profile>-rel_l2.svg and FILE-<profile>-max_ulp.svg; returns "" or what went wrong.
std::string write_context_charts(const ContextSweep& s, const std::string& path);

}  // namespace qkmla
