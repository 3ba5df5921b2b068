// qkmla audit CASE OUTPUTS: a third party's outputs against a golden case's reference, with the
// gate rule, worst elements and per-head / per-sequence breakdowns.
#include <limits>
#include <memory>

#include "cli/commands.hpp"
#include "cli/output.hpp"
#include "core/design.hpp"
#include "harness/audit.hpp"
#include "harness/layouts.hpp"
#include "io/case_io.hpp"
#include "io/outputs_io.hpp"
#include "io/safetensors.hpp"
#include "render/audit_view.hpp"
#include "render/table.hpp"

namespace qkmla::cli {

namespace {

struct AuditFlags {
  std::string case_path, outputs_path, budgets, junit, format = "table", output, layout = "dense";
  AuditOptions o;
};

}  // namespace

Runner add_audit(CLI::App& app, const std::string&) {
  auto f = std::make_shared<AuditFlags>();
  auto* cmd = app.add_subcommand(
      "audit",
      "judge a third party's outputs (safetensors file or .npy folder) against a golden case");
  cmd->add_option("case", f->case_path, "golden case (qkmla golden)")->required();
  cmd->add_option("outputs", f->outputs_path, "outputs: .safetensors file or folder of .npy files")
      ->required();
  cmd->add_option("--label", f->o.label,
                  "name of the audited implementation (reported as audit.<label>)")
      ->capture_default_str();
  cmd->add_option("--lse-base", f->o.lse_base, "base of the given lse: e or 2")
      ->check(CLI::IsMember({"e", "2"}))
      ->capture_default_str();
  CLI::Option* empty_lse =
      cmd->add_option("--empty-lse", f->o.empty_lse,
                      "what the outputs hold for rows with no visible key: -inf, +inf or nan "
                      "(default -inf; +inf with --layout flashmla)")
          ->check(CLI::IsMember({"-inf", "+inf", "nan"}));
  cmd->add_option("--layout", f->layout,
                  "the outputs as FlashMLA (out, softmax_lse [B,H,S_q], +inf for empty rows) or "
                  "FlashInfer (o, lse flattened) return them (docs/layouts.md)")
      ->check(CLI::IsMember({"dense", "flashmla", "flashinfer"}))
      ->capture_default_str();
  cmd->add_option("--form", f->o.form,
                  "the audited implementation's form: absorbed or explicit (picks the yardstick; "
                  "default: both, where the explicit samples are affordable)")
      ->check(CLI::IsMember({"absorbed", "explicit"}));
  cmd->add_option("--kv-chunk", f->o.kv_chunk,
                  "the audited implementation attends over KV chunks of N tokens merged one "
                  "after another by their lse (a chunked prefill): the yardstick samples that "
                  "chunking instead of split-KV into 2-4 chunks")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  cmd->add_option(
      "--design", f->o.design,
      "the rounding points of the audited design, e.g. "
      "q_latent=bf16,p=bf16,latent_out=fp32,out=bf16,alpha_k=fp32; gains=merged if "
      "the gains are merged into w_uk offline; also score, cache, lse, latent_file, sigma, "
      "partials, prelude, "
      "scale_in_q=yes, "
      "exp2=yes, rsqrt=approx. Strict: judged against this design only (default: "
      "every legitimate design consistent with what was delivered, and on FAIL the same "
      "against the truth at the softmax scale stored in the model dtype, as MLX and JAX "
      "modules compute)");
  cmd->add_flag("!--no-diagnose", f->o.diagnose,
                "on FAIL, do not evaluate the reference under alternative conventions (faster)");
  cmd->add_option("--budgets", f->budgets, "budget overrides (TOML: baseline_k, [[budget]])")
      ->check(CLI::ExistingFile);
  cmd->add_option("--junit", f->junit, "write JUnit XML to FILE");
  cmd->add_option("--format", f->format, "table|md|json")
      ->check(CLI::IsMember({"table", "md", "json"}))
      ->capture_default_str();
  cmd->add_option("--output,-o", f->output, "write to FILE instead of stdout");
  return [f, empty_lse] {
    const CaseFile cf = read_case(f->case_path);
    f->o.rule = default_rule();
    if (!f->budgets.empty()) apply_budget_file(f->o.rule, f->budgets);
    if (f->o.design.empty() && !f->o.rule.design.empty()) {  // the file's [design] table
      f->o.design = f->o.rule.design;
      try {
        parse_design(f->o.design, cf.k.cfg.profile,
                     f->o.form.empty() ? Form::Absorbed : parse_form(f->o.form));
      } catch (const ConfigError& e) {
        throw InputError(f->budgets, "design", e.what());
      }
    }
    const Layout layout = parse_layout(f->layout);
    if (layout != Layout::Dense && cf.k.cfg.level != Level::Kernel)
      throw InputError(f->case_path, "level",
                       "--layout " + f->layout + " audits a kernel-level case (golden --layout)");
    if (layout == Layout::FlashMla && empty_lse->count() == 0)
      f->o.empty_lse = "+inf";  // FlashMLA's convention for a row that sees no token
    const AuditResult r = audit_in_layout(cf, f->case_path, layout, read_outputs(f->outputs_path),
                                          f->outputs_path, f->o);
    if (!f->junit.empty())
      if (const int rc = write_output(audit_junit(r), f->junit, "--junit")) return rc;
    const std::string text = f->format == "json" ? audit_json(r)
                             : f->format == "md" ? audit_text(r, true)
                                                 : wrap_lines(audit_text(r, false));
    if (const int rc = write_output(text, f->output)) return rc;
    return r.pass() ? 0 : 1;
  };
}

}  // namespace qkmla::cli
