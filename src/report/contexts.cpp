#include "report/contexts.hpp"

#include <fmt/format.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>

#include "gpu/qkmla_gpu.hpp"
#include "report/charts.hpp"

namespace qkmla {

bool ContextSweep::reference_ok() const {
  for (const Report& r : at)
    if (!r.reference_ok()) return false;
  return true;
}

ContextSweep run_context_sweep(const ReportOptions& base, const std::vector<int>& contexts,
                               const std::function<void(double, double)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  ContextSweep s;
  s.contexts = contexts;
  double total = 0, done = 0;
  for (int n : contexts) total += double(n) * double(base.profiles.size());
  for (int n : contexts) {
    Report merged;
    for (Profile p : base.profiles) {
      ReportOptions o = base;
      o.cfg.seqlens.assign(size_t(o.cfg.batch), n);
      o.profiles = {p};
      Report r = run_report(o);
      merged.cfg = r.cfg;
      merged.references.insert(merged.references.end(), r.references.begin(), r.references.end());
      merged.rows.insert(merged.rows.end(), r.rows.begin(), r.rows.end());
      merged.notes.insert(merged.notes.end(), r.notes.begin(), r.notes.end());
      merged.total_seconds += r.total_seconds;
      done += n;
      if (progress) progress(done, total);
    }
    s.at.push_back(std::move(merged));
  }
  s.total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s;
}

namespace {

// profile -> (impl, tensor) in first-seen order -> per context metrics.
using Key = std::pair<ImplId, std::string>;  // implementation, tensor
struct Series {
  std::vector<Key> order;
  std::map<Key, std::vector<const Metrics*>> m;
};

std::map<std::string, Series> by_profile(const ContextSweep& s, std::vector<std::string>* names) {
  std::map<std::string, Series> out;
  for (size_t i = 0; i < s.at.size(); ++i)
    for (const Row& row : s.at[i].rows) {
      if (!out.count(row.profile)) names->push_back(row.profile);
      Series& x = out[row.profile];
      const Key k{row.impl, row.tensor};
      if (!x.m.count(k)) {
        x.order.push_back(k);
        x.m[k].assign(s.at.size(), nullptr);
      }
      x.m[k][i] = &row.m;
    }
  return out;
}

std::string header(const ContextSweep& s, const std::string& how) {
  const MlaConfig& c = s.at.empty() ? MlaConfig{} : s.at.front().cfg;
  return fmt::format(
      "qkmla report --contexts: preset {} (H={} G={} r={} d_c={} d_r={} d_v={}), batch {}, S_q "
      "{}, {} norm, scenario {}, seed {}, contexts [{}], {:.0f} s\nMade by {}\n",
      c.preset, c.heads, c.groups, c.latent_rank, c.d_c, c.d_r, c.d_v, c.batch, c.s_q,
      to_string(c.norm), c.scenario, c.seed, fmt::join(s.contexts, ","), s.total_seconds, how);
}

}  // namespace

std::string render_context_table(const ContextSweep& s, const std::string& how, bool markdown) {
  std::string text = header(s, how);
  for (size_t i = 0; i < s.at.size(); ++i)
    for (const ProfileReference& r : s.at[i].references)
      text += fmt::format("reference at {} tokens, {}: {:.1f} agreeing bits (required {:.0f})\n",
                          s.contexts[i], r.profile, r.agreeing_bits, r.required_bits);
  std::vector<std::string> names;
  const auto series = by_profile(s, &names);
  Table t;
  t.header = {"implementation", "tensor"};
  t.numeric = {false, false};
  for (int n : s.contexts) {
    t.header.push_back(fmt::format("rel_l2 @{}", n));
    t.numeric.push_back(true);
  }
  for (int n : s.contexts) {
    t.header.push_back(fmt::format("max_ulp @{}", n));
    t.numeric.push_back(true);
  }
  for (const std::string& p : names) {
    t.sections.emplace_back(t.rows.size(), "profile " + p);
    const Series& x = series.at(p);
    for (const Key& k : x.order) {
      std::vector<std::string> cells = {to_string(k.first), k.second};
      for (const Metrics* m : x.m.at(k)) cells.push_back(m ? num(m->rel_l2) : "-");
      for (const Metrics* m : x.m.at(k)) cells.push_back(m ? num(m->max_ulp) : "-");
      t.rows.push_back(std::move(cells));
    }
  }
  return text + "\n" + (markdown ? to_markdown(t) : to_text(t));
}

std::string render_context_json(const ContextSweep& s, const std::string& how) {
  nlohmann::ordered_json j;
  j["how"] = how;
  j["contexts"] = s.contexts;
  j["total_seconds"] = s.total_seconds;
  for (size_t i = 0; i < s.at.size(); ++i) {
    nlohmann::ordered_json c;
    c["context"] = s.contexts[i];
    for (const ProfileReference& r : s.at[i].references)
      c["reference"].push_back({{"profile", r.profile},
                                {"agreeing_bits", r.agreeing_bits},
                                {"required_bits", r.required_bits}});
    c["rows"] = rows_json(s.at[i].rows);
    j["at"].push_back(c);
  }
  return j.dump(1) + "\n";
}

namespace {

// The most splits of any sequence in gpu.model's split-KV plan (as the report runs it: the
// absorbed form, split for this device's multiprocessors, or an H200's without one).
std::string split_count(const MlaConfig& c) {
  gpu::Dims d;
  d.B = c.batch, d.S_q = c.s_q, d.H = c.heads, d.G = c.groups;
  gpu::RunOptions o;
  if (const int n = gpu::device_sm_count(); n > 0) o.sm_count = n;
  return std::to_string(gpu::split_info(d, c.seqlens, o).max_splits);
}

}  // namespace

std::vector<std::pair<std::string, Plot>> context_charts(const ContextSweep& s) {
  std::vector<std::string> names;
  const auto series = by_profile(s, &names);
  std::vector<std::pair<std::string, Plot>> out;
  for (const std::string& p : names)
    for (const bool ulp : {false, true}) {
      Plot plot;
      plot.title =
          fmt::format("{} of out against context, profile {}", ulp ? "max_ulp" : "rel_l2", p);
      plot.xlabel = "context (tokens, log scale)";
      plot.ylabel = ulp ? "max_ulp (log scale)" : "rel_l2 (log scale)";
      plot.log_x = true;
      const Series& x = series.at(p);
      for (const Key& k : x.order) {
        if (k.second != "out" || k.first == ref_id(Form::Absorbed))
          continue;  // ~1e-33: off the chart
        PlotSeries line;
        line.name = to_string(k.first.without_profile());
        line.dashed = line.name == "cpu.explicit";
        if (line.name == "gpu.model") {  // its split-KV plan changes with the context
          std::string plans;
          for (const Report& r : s.at) plans += (plans.empty() ? "" : ", ") + split_count(r.cfg);
          line.name += " (splits " + plans + ")";
        }
        for (size_t i = 0; i < s.contexts.size(); ++i)
          if (const Metrics* m = x.m.at(k)[i])
            line.points.emplace_back(double(s.contexts[i]), ulp ? m->max_ulp : m->rel_l2);
        plot.series.push_back(std::move(line));
      }
      out.emplace_back(p + (ulp ? "-max_ulp" : "-rel_l2"), std::move(plot));
    }
  return out;
}

std::string write_context_charts(const ContextSweep& s, const std::string& path) {
  const bool svg = path.size() > 4 && path.compare(path.size() - 4, 4, ".svg") == 0;
  const std::string stem = svg ? path.substr(0, path.size() - 4) : path;
  for (const auto& [suffix, plot] : context_charts(s)) {
    const std::string file = stem + "-" + suffix + ".svg";
    if (std::string err = write_svg(plot, file); !err.empty()) return file + ": " + err;
  }
  return "";
}

}  // namespace qkmla
