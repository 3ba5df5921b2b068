#include "report/report.hpp"

#include <chrono>
#include <cmath>
#include <exception>
#include <map>
#include <set>

#include "core/generator.hpp"
#include "core/parallel.hpp"
#include "gpu/qkmla_gpu.hpp"
#include "harness/bitwise.hpp"
#include "harness/judge.hpp"
#include "harness/registry.hpp"
#include "harness/yardstick.hpp"

namespace qkmla {

bool Report::reference_ok() const {
  for (const ProfileReference& p : references)
    if (p.agreeing_bits < p.required_bits) return false;
  return true;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

const std::vector<std::string> kTensors = {"out", "lse", "alpha_k", "latent_out"};

// Everything computed for one profile.
struct ProfileRun {
  Case k;
  std::vector<ImplId> ids;     // registered for the report, CPU-side (device kernels apart)
  std::vector<Outputs> impls;  // in registry order: cpu.explicit first
};

bool wanted(const ImplId& id, const ReportOptions& o) {
  if (id.family == Family::GpuModel) return o.gpu_model;
  return id.family != Family::Gpu;  // the device kernels run serially, after the CPU work
}

// The yardstick of each row, from the correct implementations the report already ran: the
// absorbed variants and the GPU kernels' model (split-KV) are correct implementations of the
// absorbed design and sample its rounding noise, cpu.explicit and the explicit model the explicit
// design's. A row's yardstick is the RMS rel_l2 of the *other* runs of its design (leave one
// out): a judged run is never part of its own yardstick.
// A row with fewer than two other runs of its design here (the explicit design: cpu.explicit and
// the explicit model; gamma_merged; alpha_k_bf16) has no yardstick in the report, since one other
// run is one sample of a noisy ratio (fp32 lse: 5.2): its ratio is left empty and `qkmla gate`
// judges it with the fuller ensemble of harness/yardstick.hpp.
struct DesignRun {
  ImplId impl;
  std::map<std::string, double> rel_l2;
};

std::map<std::string, std::vector<DesignRun>> design_runs(const ProfileRun& run,
                                                          const Truth& truth) {
  std::map<std::string, std::vector<DesignRun>> out;
  for (const Outputs& o : run.impls) {
    const ImplId& id = o.id;
    if (id.family != Family::Cpu && id.family != Family::GpuModel) continue;
    out[to_string(design_of(id, run.k.cfg.profile))].push_back(
        {o.id, rel_l2_of(run.k, truth, o, kTensors)});
  }
  return out;
}

std::map<std::string, double> leave_one_out(const std::vector<DesignRun>& runs, const Outputs& o) {
  std::map<std::string, std::pair<double, int>> acc;
  for (const DesignRun& d : runs) {
    if (d.impl == o.id) continue;
    for (const auto& [t, e] : d.rel_l2) acc[t].first += e * e, acc[t].second += 1;
  }
  std::map<std::string, double> out;
  for (const auto& [t, sn] : acc)
    if (sn.second >= 2) out[t] = std::sqrt(sn.first / sn.second);
  return out;
}

std::vector<Row> rows_of(const ProfileRun& run, const Truth& truth, const GateRule& rule) {
  std::vector<Row> rows;
  const Profile p = run.k.cfg.profile;
  std::map<std::string, double>
      explicit_err;  // tensor -> rel_l2 of cpu.explicit: absorption's cost
  for (const Outputs& o : run.impls)
    if (o.id.family == Family::Cpu && o.id.form == Form::Explicit)
      explicit_err = rel_l2_of(run.k, truth, o, kTensors);
  const auto by_design = design_runs(run, truth);
  for (const Judged& j : judge_outputs(rule, run.k, truth, truth.absorbed_p, kTensors, {}))
    if (truth.of(j.tensor) != &truth.absorbed_p)  // the equivalence row: measured, not judged
      rows.push_back({truth.absorbed_p.id,
                      to_string(p),
                      j.tensor,
                      "",
                      j.m,
                      std::nan(""),
                      std::nan(""),
                      truth.absorbed_p.seconds,
                      false,
                      {}});
  for (const Outputs& o : run.impls) {
    const std::string design = to_string(design_of(o.id, p));
    const std::map<std::string, double> ys = by_design.count(design)
                                                 ? leave_one_out(by_design.at(design), o)
                                                 : std::map<std::string, double>{};
    for (const Judged& j : judge_outputs(rule, run.k, truth, o, kTensors, ys)) {
      Row row{o.id,         to_string(p), j.tensor, "", j.m, j.baseline_ratio,
              std::nan(""), o.seconds,    true,     j.v};
      if (explicit_err.count(j.tensor))
        row.vs_explicit = baseline_ratio(j.m.rel_l2, explicit_err.at(j.tensor),
                                         baseline_floor(o.tensors.at(j.tensor).dtype));
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

// quant.fp8 (conventions §3): the reference on the dequantized fp8 cache against the reference on
// the bf16 cache it was quantized from (same seed, same other bits): the quantization error alone.
void add_quant_rows(Report& rep, const Case& fp8, const Truth& t8, const Truth& t16) {
  ImplId id;
  id.family = Family::Quant, id.profile = fp8.cfg.profile;
  for (const std::string t : {"out", "lse"}) {
    Row row{id, to_string(id.profile.value()), t, "", {}, std::nan(""), std::nan(""), 0.0, false,
            {}};
    row.m = compare(t8.explicit_p.tensors.at(t), t16.explicit_p.tensors.at(t), DType::BF16,
                    valid_mask(fp8, t), &t8.explicit_p.lo.at(t), &t16.explicit_p.lo.at(t));
    rep.rows.push_back(std::move(row));
  }
}

// Kernels on the device (serially: one device), each checked bit for bit against its model.
void add_device_runs(std::vector<ProfileRun>& runs, Report& rep, const ReportOptions& opts) {
  std::string why;
  bool any = false;
  for (ProfileRun& r : runs) {
    std::vector<ImplId> device;
    for (const ImplId& id : registered_ids(r.k.cfg, kReport)) {
      any |= id.family == Family::GpuModel;
      if (id.family == Family::Gpu) device.push_back(id);
    }
    if (!opts.gpu_device || device.empty()) continue;
    try {
      for (Outputs& d : run_impls(r.k, device)) {
        for (const Outputs& m : r.impls) {
          const ImplId mid = m.id;
          if (mid.family == Family::GpuModel && mid.form == d.id.form)
            rep.notes.push_back(bitwise_summary(d, m));
        }
        r.impls.push_back(std::move(d));
      }
    } catch (const std::exception& e) {  // a failing kernel launch: say so, keep the CPU rows
      rep.notes.push_back("GPU run failed in profile " + to_string(r.k.cfg.profile) + ": " +
                          e.what());
    }
  }
  if (any && opts.gpu_device && !gpu::device_available(&why))
    rep.notes.push_back("no CUDA device: GPU rows skipped (" + why + ")");
  std::set<std::string>
      said;  // GPU rows a config rules out (fp64 has none by design: not repeated)
  for (const ProfileRun& r : runs)
    for (const auto& [id, reason] : unavailable_ids(r.k.cfg, kReport))
      if (id.family == Family::GpuModel && r.k.cfg.profile != Profile::FP64 &&
          said.insert(reason).second)
        rep.notes.push_back("gpu.model rows not run: " + reason);
}

}  // namespace

Report run_report(const ReportOptions& opts) {
  const auto start = std::chrono::steady_clock::now();
  auto say = [&](const std::string& s) {
    if (opts.progress) opts.progress(s);
  };
  Report rep;
  rep.cfg = opts.cfg;
  rep.cfg.set_default_scale();
  std::vector<ProfileRun> runs(opts.profiles.size());
  std::vector<const Case*> cases;
  std::vector<std::function<void()>> tasks;
  for (size_t i = 0; i < runs.size(); ++i) {
    MlaConfig c = rep.cfg;
    c.profile = opts.profiles[i];
    tasks.push_back([&runs, i, c, &opts] {  // independent draws
      runs[i].k = generate_case(c);
      compact_long_context(runs[i].k, opts.compact_latent_values);
    });
    for (const ImplId& id : registered_ids(c, kReport))
      if (wanted(id, opts)) runs[i].ids.push_back(id);
    cases.push_back(&runs[i].k);
  }
  run_parallel(tasks, opts.threads);
  tasks.clear();
  // The CPU implementations fill the threads the reference's phases leave idle, one task per
  // (profile, family).
  say("exact key products and CPU profile implementations");
  std::vector<std::vector<std::vector<Outputs>>> got(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    std::map<const ImplFamily*, std::vector<ImplId>> by_family;
    std::vector<const ImplFamily*> order;
    for (const ImplId& id : runs[i].ids) {
      const ImplFamily* f = &family_of(id, runs[i].k.cfg);
      if (!by_family.count(f)) order.push_back(f);
      by_family[f].push_back(id);
    }
    got[i].resize(order.size());
    for (size_t n = 0; n < order.size(); ++n)
      tasks.push_back(
          [&, i, n, ids = by_family[order[n]]] { got[i][n] = run_impls(runs[i].k, ids); });
  }
  TruthOptions to;
  to.bits = opts.ref_bits, to.check_bits = opts.check_bits, to.absorbed = true,
  to.threads = opts.threads;
  std::vector<Truth> truths;
  {
    // compute_truths runs the exact products, the reference at P and its check, and `tasks` where
    // a phase leaves a thread idle; progress lines mark the phases that take long.
    say("reference at P and its check at P + 64");
    truths = compute_truths(cases, to, tasks);
  }
  for (size_t i = 0; i < runs.size(); ++i)
    for (std::vector<Outputs>& v : got[i])
      for (Outputs& o : v) runs[i].impls.push_back(std::move(o));
  add_device_runs(runs, rep, opts);
  const GateRule rule = default_rule();
  for (size_t i = 0; i < runs.size(); ++i) {
    const Truth& t = truths[i];
    ProfileReference pr;
    pr.profile = to_string(opts.profiles[i]);
    pr.bits = t.bits, pr.check_bits = t.check_bits;
    pr.agreeing_bits = t.agreeing_bits, pr.required_bits = t.required_bits;
    pr.dots_seconds = t.dots.seconds(), pr.explicit_seconds = t.explicit_p.seconds;
    pr.absorbed_seconds = t.absorbed_p.seconds, pr.check_seconds = t.check.seconds;
    rep.references.push_back(pr);
    const std::vector<Row> rows = rows_of(runs[i], t, rule);
    rep.rows.insert(rep.rows.end(), rows.begin(), rows.end());
  }
  auto find = [&](Profile p) -> int {
    for (size_t i = 0; i < runs.size(); ++i)
      if (opts.profiles[i] == p) return int(i);
    return -1;
  };
  const int i16 = find(Profile::BF16);
  for (Profile p8 : {Profile::FP8, Profile::FP8_B128}) {  // each fp8 format its own quant rows
    const int i8 = find(p8);
    if (i8 >= 0 && i16 >= 0)
      add_quant_rows(rep, runs[size_t(i8)].k, truths[size_t(i8)], truths[size_t(i16)]);
    else if (i8 >= 0)
      rep.notes.push_back("quant." + to_string(p8) + " rows need the bf16 profile in the report");
  }
  rep.total_seconds = seconds_since(start);
  return rep;
}

}  // namespace qkmla
