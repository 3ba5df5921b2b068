// The public API over the same layers the CLI calls: config -> generate_case or case_from_inputs
// -> make_golden (golden), read_case (load), run_audit + the audit printers (audit).
#include "api/qkmla.hpp"

#include <stdexcept>

#include "core/generator.hpp"
#include "core/presets.hpp"
#include "harness/audit.hpp"
#include "harness/golden.hpp"
#include "harness/layouts.hpp"
#include "harness/resources.hpp"
#include "io/case_io.hpp"
#include "io/inputs.hpp"
#include "io/safetensors.hpp"
#include "render/audit_view.hpp"

namespace qkmla::api {

struct GoldenCase::State {
  CaseFile file;  // inputs, config, ref.*, metadata: what `qkmla golden` writes
};

struct Access {
  static const GoldenCase::State& of(const GoldenCase& c) { return *c.s_; }
};

namespace {

Array to_array(const Tensor& t) { return {dtype_name(t.dtype), t.shape, t.data}; }

Tensor to_tensor(const std::string& name, const Array& a) {
  DType d;
  try {
    d = dtype_from_name(a.dtype);
  } catch (const std::invalid_argument&) {
    throw InputError("<array>", name, "unknown dtype '" + a.dtype + "'");
  }
  int64_t n = 1;
  for (int64_t s : a.shape) {
    if (s < 0) throw InputError("<array>", name, "negative dimension");
    n *= s;
  }
  if (n != int64_t(a.values.size()))
    throw InputError("<array>", name,
                     "shape holds " + std::to_string(n) + " values, " +
                         std::to_string(a.values.size()) + " given");
  Tensor t(d, a.shape);
  t.data = a.values;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isnan(t[i]) && round_to(d, t[i]) != t[i])
      throw InputError("<array>", name,
                       "value " + std::to_string(t[i]) + " at flat index " + std::to_string(i) +
                           " is not a " + a.dtype + " value");
  return t;
}

// Every library error as std::invalid_argument with the CLI's wording (exit 2 there).
template <class F>
auto guarded(F&& f) {
  try {
    return f();
  } catch (const ConfigError& e) {
    throw std::invalid_argument(std::string("invalid configuration: ") + e.what());
  } catch (const InputError& e) {
    throw std::invalid_argument(std::string("bad input: ") + e.what());
  } catch (const ResourceError& e) {
    throw std::invalid_argument(std::string("too big: ") + e.what());
  }
}

MlaConfig config_of(const CaseOptions& o) {
  if (o.seqlens.empty()) throw ConfigError("seqlens", "at least one sequence");
  MlaConfig c = config_for(find_preset(o.preset), o.seqlens[0]);
  if (o.heads) c.heads = o.heads;
  if (o.groups) c.groups = o.groups;
  if (o.latent_rank) c.latent_rank = o.latent_rank;
  if (o.d_c) c.d_c = o.d_c;
  if (o.d_r >= 0) c.d_r = o.d_r;
  if (o.d_v) c.d_v = o.d_v;
  c.seqlens = o.seqlens;
  c.batch = int(c.seqlens.size());
  c.s_q = o.sq;
  c.norm = parse_norm(o.norm);
  c.rope_order = parse_rope_order(o.rope_order);
  c.rope_style = parse_rope_style(o.rope_style);
  c.causal = o.causal;
  c.scenario = o.scenario;
  c.seed = o.seed;
  c.profile = parse_profile(o.profile);
  c.softmax_scale = 0.0;
  if (!o.config_json.empty()) apply_config_json(c, o.config_json);
  if (c.softmax_scale == 0.0) c.set_default_scale();
  c.validate();
  return c;
}

// The user's arrays through the CLI's --inputs path from the parsed file on: case_from_file takes
// the tensors in memory (each already checked to hold only values of its dtype), so nothing is
// written to disk.
InputsCase from_inputs(const CaseOptions& o) {
  SafetensorsFile f;
  for (const auto& [name, a] : o.inputs) f.tensors[name] = to_tensor(name, a);
  return case_from_file(std::move(f),
                        {"<inputs>", o.config_json.empty() ? "{}" : o.config_json, o.round_inputs});
}

}  // namespace

std::string GoldenCase::config_json() const { return qkmla::config_to_json(s_->file.k.cfg); }

std::vector<std::string> GoldenCase::names() const {
  std::vector<std::string> n;
  for (const auto& [name, t] : s_->file.k.tensors) n.push_back(name);
  for (const auto& [name, t] : s_->file.refs) n.push_back(name);
  return n;
}

Array GoldenCase::tensor(const std::string& name) const {
  if (s_->file.k.tensors.count(name)) return to_array(s_->file.k.tensors.at(name));
  if (s_->file.refs.count(name)) return to_array(s_->file.refs.at(name));
  throw std::invalid_argument("no tensor '" + name + "' in the case");
}

std::map<std::string, std::string> GoldenCase::metadata() const { return s_->file.metadata; }

void GoldenCase::save(const std::string& path) const {
  guarded([&] {
    write_case(path, s_->file.k, s_->file.refs, s_->file.metadata);
    return 0;
  });
}

GoldenCase golden(const CaseOptions& o) {
  return guarded([&] {
    std::map<std::string, std::string> extra;
    Case k;
    if (o.inputs.empty()) {
      const MlaConfig c = config_of(o);
      require_memory({c}, "this case", "shorter seqlens or a smaller shape");
      k = generate_case(c);
    } else {
      InputsCase in = from_inputs(o);
      extra = in.metadata;
      k = std::move(in.k);
    }
    const Layout layout = parse_layout(o.layout);
    const Level level = layout == Layout::Dense ? parse_level(o.level) : Level::Kernel;
    Golden g = make_golden(k, level, o.ref_bits, "qkmla::api::golden");
    if (!g.truth.ok())
      throw std::runtime_error("refused: the reference agrees on " +
                               std::to_string(g.truth.agreeing_bits) + " bits < " +
                               std::to_string(g.truth.required_bits) + "; raise ref_bits");
    g.metadata.insert(extra.begin(), extra.end());
    if (layout != Layout::Dense) {
      for (auto& [name, t] : paged_inputs(g.k, layout, o.page_size)) g.k.tensors[name] = t;
      g.metadata["qkmla.layout"] = o.layout + ", page_size " + std::to_string(o.page_size);
    }
    // The same bytes `qkmla golden` writes would give: the case as a reader of that file sees it.
    auto s = std::make_shared<GoldenCase::State>();
    s->file.k = std::move(g.k);
    s->file.refs = std::move(g.refs);
    s->file.metadata = std::move(g.metadata);
    return GoldenCase(std::move(s));
  });
}

GoldenCase load(const std::string& path) {
  return guarded([&] {
    auto s = std::make_shared<GoldenCase::State>();
    s->file = read_case(path);
    return GoldenCase(std::move(s));
  });
}

Verdict audit(const GoldenCase& c, const std::map<std::string, Array>& outputs,
              const AuditOptions& o) {
  return guarded([&] {
    std::map<std::string, Tensor> given;
    for (const auto& [name, a] : outputs) given[name] = to_tensor(name, a);
    qkmla::AuditOptions ao;
    ao.label = o.label, ao.lse_base = o.lse_base, ao.empty_lse = o.empty_lse;
    ao.form = o.form, ao.design = o.design, ao.diagnose = o.diagnose;
    ao.kv_chunk = o.kv_chunk;
    ao.rule = default_rule();
    const AuditResult r = audit_in_layout(Access::of(c).file, "<case>", parse_layout(o.layout),
                                          given, "<outputs>", ao);
    Verdict v;
    v.passed = r.pass();
    for (const TensorAudit& a : r.tensors)
      v.rows.push_back({a.j.tensor, a.j.v.pass, a.j.m.rel_l2, a.j.m.max_ulp, a.j.baseline_ratio,
                        a.yardstick, a.j.m.nonfinite_mismatch, a.j.v.failed});
    for (const Match& m : r.diagnosis) v.diagnosis.push_back(m.convention);
    v.missing = r.missing;
    v.table = audit_text(r, false);
    v.json = audit_json(r);
    return v;
  });
}

}  // namespace qkmla::api
