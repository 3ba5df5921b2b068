#include "report/report.hpp"

#include <chrono>
#include <exception>
#include <cmath>
#include <limits>
#include <map>

#include "core/generator.hpp"
#include "core/parallel.hpp"
#include "impl/cpu_impls.hpp"
#include "mp.hpp"
#include "reference.hpp"
#include "report/report_gpu.hpp"

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

// Everything computed for one profile.
struct ProfileRun {
  Case k;
  ref::Dots dots;
  Outputs ref_p, ref_2p, ref_abs;
  std::vector<Outputs> impls;  // cpu.explicit first, then cpu.absorbed variants, then gpu.*
  std::vector<Outputs> gpu_models;
};

const std::vector<std::string> kTensors = {"out", "lse", "alpha_k", "latent_out"};

// The reference of each tensor is ref.explicit at P bits; latent_out, which the explicit form
// does not need, is taken from ref.absorbed (both agree to ~P bits where both are computed:
// reference.equivalence tests).
const Outputs& truth_for(const ProfileRun& run, const std::string& t) {
  return run.ref_p.tensors.count(t) ? run.ref_p : run.ref_abs;
}

void add_rows(Report& rep, const ProfileRun& run, Profile p) {
  const double floor = unit_roundoff(stored_dtype(p)) / 16;  // SPEC §5
  std::map<std::string, double> baseline;                   // tensor -> rel_l2 of cpu.explicit
  auto measure = [&](const Outputs& o, const std::string& t) {
    const Outputs& truth = truth_for(run, t);
    const Tensor& x = o.tensors.at(t);
    return compare(x, truth.tensors.at(t), x.dtype, valid_mask(run.k, t),
                   o.lo.count(t) ? &o.lo.at(t) : nullptr, &truth.lo.at(t));
  };
  for (const Outputs& o : run.impls)
    if (o.impl.rfind("cpu.explicit.", 0) == 0)
      for (const std::string& t : kTensors)
        if (o.tensors.count(t)) baseline[t] = measure(o, t).rel_l2;
  std::vector<const Outputs*> all = {&run.ref_abs};
  for (const Outputs& o : run.impls) all.push_back(&o);
  for (const Outputs* o : all)
    for (const std::string& t : kTensors) {
      if (!o->tensors.count(t) || &truth_for(run, t) == o) continue;
      ReportRow row{o->impl, to_string(p), t, measure(*o, t), std::numeric_limits<double>::quiet_NaN(), o->seconds};
      if (baseline.count(t)) row.baseline_ratio = row.m.rel_l2 / std::max(baseline[t], floor);
      rep.rows.push_back(std::move(row));
    }
}

// quant.fp8 (SPEC §3): the reference on the dequantized fp8 cache against the reference on the
// bf16 cache it was quantized from (same seed, same other bits): the quantization error alone.
void add_quant_rows(Report& rep, const ProfileRun& fp8, const ProfileRun& bf16) {
  for (const std::string t : {"out", "lse"}) {
    const Tensor& x = fp8.ref_p.tensors.at(t);
    ReportRow row{"quant.fp8", to_string(Profile::FP8), t,
                  compare(x, bf16.ref_p.tensors.at(t), DType::BF16, valid_mask(fp8.k, t), &fp8.ref_p.lo.at(t),
                          &bf16.ref_p.lo.at(t)),
                  std::numeric_limits<double>::quiet_NaN(), 0.0};
    rep.rows.push_back(std::move(row));
  }
}

// Kernels on the device (serially: one device), each checked bit for bit against its model.
void add_device_runs(std::vector<ProfileRun>& runs, Report& rep, const ReportOptions& opts) {
  std::string why;
  bool any = false;
  for (ProfileRun& r : runs) {
    if (r.gpu_models.empty()) continue;
    any = true;
    if (!opts.gpu_device) continue;
    try {
      for (Outputs& o : gpu_device_outputs(r.k, r.gpu_models, rep.notes, &why)) r.impls.push_back(std::move(o));
    } catch (const std::exception& e) {  // a failing kernel launch: say so, keep the CPU rows
      rep.notes.push_back("GPU run failed in profile " + to_string(r.k.cfg.profile) + ": " + e.what());
    }
  }
  if (any && opts.gpu_device && !why.empty()) rep.notes.push_back("no CUDA device: GPU rows skipped (" + why + ")");
}

}  // namespace

Report run_report(const ReportOptions& opts) {
  const auto start = std::chrono::steady_clock::now();
  auto say = [&](const std::string& s) { if (opts.progress) opts.progress(s); };
  Report rep;
  rep.cfg = opts.cfg;
  rep.cfg.set_default_scale();
  std::vector<ProfileRun> runs(opts.profiles.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    MlaConfig c = rep.cfg;
    c.profile = opts.profiles[i];
    runs[i].k = generate_case(c);
  }
  // Phase 1: exact products and the CPU implementations, side by side (no multiprecision yet).
  // The largest tasks go first so that two workers finish together.
  say("exact key/value products and CPU profile implementations");
  std::vector<std::function<void()>> tasks;
  std::vector<std::vector<Outputs>> absorbed(runs.size());
  for (ProfileRun& r : runs) tasks.push_back([&r] { r.dots = ref::exact_dots(r.k); });
  for (ProfileRun& r : runs) tasks.push_back([&r] { r.impls.insert(r.impls.begin(), impl::cpu_explicit(r.k)); });
  for (size_t i = 0; i < runs.size(); ++i)
    tasks.push_back([&, i] { absorbed[i] = impl::cpu_absorbed_all(runs[i].k); });
  if (opts.gpu_model)
    for (ProfileRun& r : runs) tasks.push_back([&r] { r.gpu_models = gpu_model_outputs(r.k); });
  run_parallel(tasks, opts.threads);
  for (size_t i = 0; i < runs.size(); ++i) {
    for (Outputs& o : absorbed[i]) runs[i].impls.push_back(std::move(o));
    for (const Outputs& o : runs[i].gpu_models) runs[i].impls.push_back(o);
  }
  add_device_runs(runs, rep, opts);
  // Phase 2: the reference at P (explicit and absorbed), then the check at P + 64. Boost keeps one
  // global default precision, so each precision is one phase.
  {
    ref::PrecisionScope scope(opts.ref_bits);
    say("reference at " + std::to_string(ref::PrecisionScope::current_bits()) + " bits");
    tasks.clear();
    for (ProfileRun& r : runs) {
      tasks.push_back([&r] { r.ref_p = ref::ref_explicit(r.k, r.dots, false); });
      tasks.push_back([&r] { r.ref_abs = ref::ref_absorbed(r.k, r.dots); });
    }
    run_parallel(tasks, opts.threads);
  }
  int check_bits = 0;
  {
    ref::PrecisionScope scope(opts.check_bits ? opts.check_bits : opts.ref_bits + 64);
    check_bits = ref::PrecisionScope::current_bits();
    say("reference check at " + std::to_string(check_bits) + " bits");
    tasks.clear();
    for (ProfileRun& r : runs) tasks.push_back([&r] { r.ref_2p = ref::ref_explicit(r.k, r.dots, false); });
    run_parallel(tasks, opts.threads);
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const ProfileRun& r = runs[i];
    const Profile p = opts.profiles[i];
    ProfileReference pr;
    pr.profile = to_string(p);
    {
      ref::PrecisionScope scope(opts.ref_bits);
      pr.bits = ref::PrecisionScope::current_bits();
    }
    pr.check_bits = check_bits;
    pr.agreeing_bits = agreeing_bits(r.k, r.ref_p, r.ref_2p, {"out", "lse", "alpha_q", "alpha_k"});
    pr.required_bits = format_of(stored_dtype(p)).precision + 20;
    pr.dots_seconds = r.dots.seconds;
    pr.explicit_seconds = r.ref_p.seconds;
    pr.absorbed_seconds = r.ref_abs.seconds;
    pr.check_seconds = r.ref_2p.seconds;
    rep.references.push_back(pr);
    add_rows(rep, r, p);
  }
  const auto find = [&](Profile p) -> const ProfileRun* {
    for (size_t i = 0; i < runs.size(); ++i)
      if (opts.profiles[i] == p) return &runs[i];
    return nullptr;
  };
  if (find(Profile::FP8) && find(Profile::BF16)) add_quant_rows(rep, *find(Profile::FP8), *find(Profile::BF16));
  else if (find(Profile::FP8)) rep.notes.push_back("quant.fp8 rows need the bf16 profile in the same report");
  rep.total_seconds = seconds_since(start);
  return rep;
}

}  // namespace qkmla
