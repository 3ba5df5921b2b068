// qkmla converge: the absorbed form and its variants evaluated at a ladder of precisions against a
// reference at 4x the largest; equivalent forms converge at one bit per bit, mutants plateau.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/case_flags.hpp"
#include "cli/commands.hpp"
#include "cli/provenance.hpp"
#include "core/generator.hpp"
#include "deep_diff.hpp"
#include "mp.hpp"
#include "ref_common.hpp"
#include "reference.hpp"
#include "io/safetensors.hpp"

namespace qkmla::cli {

namespace {

struct ConvergeFlags {
  CaseFlags c;
  std::vector<int> bits{24, 32, 48, 64, 96, 128, 192, 256};
  std::string format = "table", output, plot;
};

struct Series {
  std::string impl, scenario;
  ref::AbsorbedOptions opt;
  bool explicit_form = false;
  std::vector<std::pair<int, double>> points = {};
  double slope = 0, tail_slope = 0;
  Series(std::string i, std::string s, ref::AbsorbedOptions o, bool e = false)
      : impl(std::move(i)), scenario(std::move(s)), opt(o), explicit_form(e) {}
};

double fit_slope(const std::vector<std::pair<int, double>>& pts, size_t from) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = from; i < pts.size(); ++i) {
    if (!(pts[i].second > 0)) continue;
    const double x = pts[i].first, y = std::log2(pts[i].second);
    n += 1, sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  return n < 2 ? std::nan("") : (n * sxy - sx * sy) / (n * sxx - sx * sx);
}

std::string render_svg(const std::vector<Series>& series, const std::string& svg, const std::string& title) {
  const std::string data = svg + ".dat", script = svg + ".gp";
  std::ofstream d(data);
  for (const Series& s : series) {
    d << "# " << s.impl << "\n";
    for (const auto& [p, diff] : s.points) d << p << " " << (diff > 0 ? diff : 1e-300) << "\n";
    d << "\n\n";
  }
  d.close();
  std::ofstream g(script);
  g << "set terminal svg size 900,560 dynamic background rgb 'white'\nset output '" << svg << "'\n"
    << "set title '" << title << "'\nset xlabel 'working precision p (bits)'\n"
    << "set ylabel 'relative difference to the 4x-precision reference'\nset logscale y 2\nset format y '2^{%L}'\n"
    << "set key outside right\nset grid\nplot ";
  for (size_t i = 0; i < series.size(); ++i)
    g << (i ? ", " : "") << "'" << data << "' index " << i << " with linespoints title '" << series[i].impl
      << (series[i].scenario == "normal" ? "" : " (" + series[i].scenario + ")") << fmt::format(", slope {:.2f}'", series[i].slope);
  g << "\n";
  g.close();
  const int rc = std::system(("gnuplot '" + script + "'").c_str());
  std::remove(data.c_str());
  std::remove(script.c_str());
  return rc == 0 ? "" : "gnuplot failed (install it: apt-get install gnuplot-nox)";
}

}  // namespace

Runner add_converge(CLI::App& app, const std::string& command_line) {
  auto f = std::make_shared<ConvergeFlags>();
  f->c.preset = "tiny";  // MPFR at 4x the top precision for every series: small shapes by default
  f->c.sq = 2;
  f->c.seqlens = {0, 17, 40};
  auto* cmd = app.add_subcommand("converge", "precision ladder: equivalent forms converge (slope -1 per bit), mutants plateau");
  add_case_flags(*cmd, f->c, 40);
  cmd->add_option("--bits", f->bits, "working precisions, comma separated")->delimiter(',')->check(CLI::Range(16, 2048));
  cmd->add_option("--format", f->format, "table|md|json")->check(CLI::IsMember({"table", "md", "json"}))->capture_default_str();
  cmd->add_option("--output,-o", f->output, "write to FILE instead of stdout");
  cmd->add_option("--plot", f->plot, "write an SVG plot (gnuplot) of every series");
  return [f, command_line] {
    if (f->c.seqlen) f->c.seqlens.clear();  // --seqlen given: one sequence, not the default batch
    MlaConfig base = build_config(f->c, 40);
    base.profile = build_profiles(f->c, {Profile::BF16}).at(0);
    std::sort(f->bits.begin(), f->bits.end());
    const int ref_bits = 4 * f->bits.back();
    std::vector<Series> series = {
        {"ref.explicit", base.scenario, {}, true},
        {"ref.absorbed", base.scenario, {}},
        {"ref.absorbed.alpha_q_folded", base.scenario, {.alpha_q_folded = true}},
        {"ref.absorbed.q_normed_first", base.scenario, {.q_normed_first = true}},
        {"ref.absorbed.gamma_merged", base.scenario, {.gamma_merged = true}},
        {"ref.absorbed.gram_alpha_k", base.scenario, {.gram_alpha_k = true}},
        {"mutant.no_gamma_k", base.scenario, {.no_gamma_k = true}},
        {"mutant.eps_outside_sqrt", "tiny_keys", {.eps_outside_sqrt = true}},
    };
    std::map<std::string, std::pair<Case, ref::Dots>> cases;
    std::map<std::string, Outputs> truth;
    ref::set_deep_capture(true);
    for (const Series& s : series)
      if (!cases.count(s.scenario)) {
        MlaConfig c = base;
        c.scenario = s.scenario;
        Case k = generate_case(c);
        ref::Dots d = ref::exact_dots(k);
        ref::PrecisionScope scope(ref_bits);
        truth[s.scenario] = ref::ref_explicit(k, d, false);
        cases.emplace(s.scenario, std::make_pair(std::move(k), std::move(d)));
      }
    for (int p : f->bits) {
      ref::PrecisionScope scope(p);
      for (Series& s : series) {
        const auto& [k, d] = cases.at(s.scenario);
        const Outputs o = s.explicit_form ? ref::ref_explicit(k, d, false) : ref::ref_absorbed(k, d, s.opt);
        s.points.emplace_back(p, ref::deep_rel_diff(k, o, truth.at(s.scenario), {"out", "lse"}));
      }
    }
    ref::set_deep_capture(false);
    for (Series& s : series) {
      s.slope = fit_slope(s.points, 0);
      s.tail_slope = fit_slope(s.points, s.points.size() >= 4 ? s.points.size() - 4 : 0);
    }
    const std::string how = provenance(command_line, 1);
    std::string text;
    if (f->format == "json") {
      nlohmann::ordered_json j;
      j["case"] = nlohmann::json::parse(config_to_json(base));
      j["reference_bits"] = ref_bits;
      j["how"] = how;
      for (const Series& s : series) {
        nlohmann::json pts = nlohmann::json::array();
        for (const auto& [p, diff] : s.points) pts.push_back({p, diff});
        j["series"].push_back({{"impl", s.impl}, {"scenario", s.scenario}, {"points", pts}, {"slope", s.slope}, {"tail_slope", s.tail_slope}});
      }
      text = j.dump(1) + "\n";
    } else {
      const bool md = f->format == "md";
      text = fmt::format("{}qkmla converge: preset {}, seqlens [{}], S_q {}, {} norm, profile {} inputs, seed {}; reference: "
                         "ref.explicit at {} bits\n{}{}\n\n",
                         md ? "# " : "", base.preset, fmt::join(base.seqlens, ","), base.s_q, to_string(base.norm), to_string(base.profile),
                         base.seed, ref_bits, md ? "\nMade by " : "", how);
      text += md ? "| series | scenario |" : fmt::format("{:<30} {:<10}", "series", "scenario");
      for (int p : f->bits) text += md ? fmt::format(" {} |", p) : fmt::format(" {:>9}", p);
      text += md ? " slope | last-4 slope |\n|---|---|" : fmt::format(" {:>7} {:>7}\n", "slope", "last4");
      if (md) {
        for (size_t i = 0; i < f->bits.size() + 2; ++i) text += "---|";
        text += "\n";
      }
      for (const Series& s : series) {
        text += md ? fmt::format("| `{}` | {} |", s.impl, s.scenario) : fmt::format("{:<30} {:<10}", s.impl, s.scenario);
        for (const auto& [p, diff] : s.points) text += md ? fmt::format(" 2^{:.1f} |", std::log2(diff)) : fmt::format(" 2^{:>6.1f}", std::log2(diff));
        text += md ? fmt::format(" {:.3f} | {:.3f} |\n", s.slope, s.tail_slope) : fmt::format(" {:>7.3f} {:>7.3f}\n", s.slope, s.tail_slope);
      }
      text += "\nEntries are the worst normwise relative difference over rows of out and lse (lse relative to max(|lse|, 1)).\n"
              "Equivalent forms: slope about -1 (one bit of agreement per bit of precision); a mutant plateaus (slope near 0).\n";
    }
    if (!f->plot.empty()) {
      const std::string err = render_svg(series, f->plot, fmt::format("qkmla converge: {} ({} norm), reference {} bits", base.preset, to_string(base.norm), ref_bits));
      if (!err.empty()) {
        std::cerr << "qkmla converge: --plot " << f->plot << ": " << err << "\n";
        return 2;
      }
    }
    return write_output(text, f->output);
  };
}

}  // namespace qkmla::cli
