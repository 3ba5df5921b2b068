// qkmla converge: the absorbed form and its variants evaluated at a ladder of precisions against a
// reference at 4x the largest; equivalent forms converge at one bit per bit, mutants plateau.
#include <iostream>
#include <memory>

#include "cli/case_flags.hpp"
#include "cli/commands.hpp"
#include "cli/output.hpp"
#include "cli/provenance.hpp"
#include "harness/converge.hpp"
#include "harness/resources.hpp"
#include "render/converge_view.hpp"

namespace qkmla::cli {

namespace {

struct ConvergeFlags {
  CaseFlags c;
  std::vector<int> bits{24, 32, 48, 64, 96, 128, 192, 256};
  std::string format = "table", output, plot;
};

}  // namespace

Runner add_converge(CLI::App& app, const std::string& command_line) {
  auto f = std::make_shared<ConvergeFlags>();
  f->c.preset = "tiny";  // MPFR at 4x the top precision for every series: small shapes by default
  f->c.sq = 2;
  f->c.seqlens = {0, 17, 40};
  auto* cmd = app.add_subcommand(
      "converge",
      "precision ladder: equivalent forms converge (slope -1 per bit), mutants plateau");
  add_case_flags(*cmd, f->c, 40);
  cmd->add_option("--bits", f->bits, "working precisions, comma separated")
      ->delimiter(',')
      ->check(CLI::Range(16, 2048));
  cmd->add_option("--format", f->format, "table|md|json")
      ->check(CLI::IsMember({"table", "md", "json"}))
      ->capture_default_str();
  cmd->add_option("--output,-o", f->output, "write to FILE instead of stdout");
  cmd->add_option("--plot", f->plot, "write an SVG plot (gnuplot) of every series");
  return [f, command_line] {
    if (f->c.seqlen) f->c.seqlens.clear();  // --seqlen given: one sequence, not the default batch
    MlaConfig base = build_config(f->c, 40);
    base.profile = build_profiles(f->c, {Profile::BF16}).at(0);
    require_memory({base}, "this case", "a shorter --seqlen or a smaller shape");
    const ConvergeResult r = run_converge(base, f->bits);
    const std::string how = provenance(command_line, 1);
    const std::string text =
        f->format == "json" ? converge_json(r, how) : converge_text(r, how, f->format == "md");
    if (!f->plot.empty())
      if (const std::string err = converge_svg(r, f->plot); !err.empty()) {
        std::cerr << "qkmla converge: --plot " << f->plot << ": " << err << "\n";
        return 2;
      }
    return write_output(text, f->output);
  };
}

}  // namespace qkmla::cli
