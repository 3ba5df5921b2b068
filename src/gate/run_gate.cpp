#include "gate/run_gate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/generator.hpp"
#include "core/parallel.hpp"
#include "harness/judge.hpp"
#include "harness/registry.hpp"
#include "harness/truth.hpp"
#include "harness/yardstick.hpp"
#include "io/safetensors.hpp"
#include "render/junit.hpp"
#include "render/table.hpp"

namespace qkmla {

std::vector<GateCase> GateResults::testcases() const {
  std::vector<GateCase> out;
  std::map<std::string, size_t> slot;  // suite|mutant|profile -> index in out
  for (const GateCase& c : cases) {
    if (c.mutant.empty()) {
      out.push_back(c);
      continue;
    }
    const std::string key = c.mutant + "|" + c.profile;  // across every entry that runs mutants
    const bool killed = c.expect_pass ? !c.ok : c.ok;
    auto it = slot.find(key);
    if (it == slot.end()) {
      GateCase agg = c;
      agg.suite = "mutants";
      agg.name = c.mutant + "/" + c.profile;
      agg.message = killed ? c.message + " (" + c.name + ")" : c.message;
      slot[key] = out.size();
      out.push_back(agg);
      continue;
    }
    GateCase& agg = out[it->second];
    const bool agg_killed = agg.expect_pass ? !agg.ok : agg.ok;
    agg.seconds += c.seconds;
    if (killed && !agg_killed) {
      agg.ok = !c.expect_pass;
      agg.metric = c.metric;
      agg.scenario = c.scenario;
      agg.message = c.message + " (" + c.name + ")";
    }
  }
  return out;
}

int GateResults::passed() const {
  int n = 0;
  for (const GateCase& c : testcases()) n += c.ok;
  return n;
}
int GateResults::failed() const { return int(testcases().size()) - passed(); }

namespace {

// The judged ids of one job: the registered ids of its case that its entry's patterns match.
std::vector<ImplId> wanted_ids(const GateEntry& entry, const MlaConfig& cfg) {
  std::vector<ImplId> out;
  for (const ImplId& id : registered_ids(cfg, kGate))
    for (const std::string& p : entry.impls)
      if (id_matches(p, id)) {
        out.push_back(id);
        break;
      }
  return out;
}

GateCase mutant_case(const GateEntry& entry, const GateJob& job, const Outputs& o,
                     const std::vector<Judged>& judged) {
  const ImplId id = o.id;
  GateCase g{entry.name,       to_string(o.id),   job.label, id.name, to_string(job.cfg.profile),
             job.cfg.scenario, entry.expect_pass, false,     "",      "",
             o.seconds};
  double worst = 0;
  for (const Judged& j : judged) {
    if (!j.v.pass && g.metric.empty()) {
      g.metric = j.v.first_metric;
      g.message = "killed on " + j.tensor + ": " + j.v.failed.front();
    }
    if (!std::isnan(j.baseline_ratio)) worst = std::max(worst, j.baseline_ratio);
  }
  const bool killed = !g.metric.empty();
  g.ok = entry.expect_pass ? !killed : killed;
  if (!killed)
    g.message =
        fmt::format("survived: every verdict passed (largest baseline_ratio {:.3g})", worst);
  return g;
}

// Testcases of one job: the reference's accuracy, then every judged implementation.
std::vector<GateCase> run_job(const GateConfig& c, const GateJob& job, const Case& k,
                              const Truth& truth) {
  const auto t0 = std::chrono::steady_clock::now();
  const GateEntry& entry = c.entries[job.entry];
  const std::string profile = to_string(job.cfg.profile);
  const std::vector<ImplId> wanted = wanted_ids(entry, k.cfg);
  const std::vector<Outputs> impls = run_impls(k, wanted);
  // The yardstick of each judged design (conventions §5): correct implementations of it on this
  // case.
  std::map<std::string, Yardstick> yardsticks;  // design -> its samples
  auto truth_of = [&](const std::string& t) {
    const Outputs* o = truth.of(t);
    return o ? &o->tensors.at(t) : nullptr;
  };
  for (const ImplId& id : wanted) {
    const Design d = design_of(id, k.cfg.profile);
    if (!yardsticks.count(to_string(d)))
      yardsticks[to_string(d)] = measure_yardstick(k, std::vector<Design>{d}, truth_of, c.tensors);
  }
  std::vector<ImplId> bounded;  // proven bounds for the cpu.* implementations this entry judges
  for (const ImplId& id : wanted)
    if (id.family == Family::Cpu) bounded.push_back(id);
  const std::map<std::string, Outputs> bounds = run_bounds(k, bounded);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<GateCase> out;
  GateCase refcase{entry.name, "reference." + profile,
                   job.label,  "",
                   profile,    job.cfg.scenario,
                   true,       true,
                   "",         "",
                   seconds};
  if (!truth.ok()) {
    refcase.ok = false;
    refcase.metric = "agreeing_bits";
    refcase.message =
        fmt::format("reference agrees with its check run on {:.1f} bits < {:.0f} required",
                    truth.agreeing_bits, truth.required_bits);
  }
  out.push_back(refcase);
  for (const Outputs& o : impls) {
    if (std::find(wanted.begin(), wanted.end(), o.id) == wanted.end()) continue;
    const auto b = bounds.find(to_string(o.id));
    const std::string design = to_string(design_of(o.id, k.cfg.profile));
    // A run is never part of its own yardstick: a cpu.* row is the forward-order sample of its
    // design and variant, left out (alpha_k_bf16 is the default variant of its own design).
    const ImplId& id = o.id;
    const SampleId self{0, id.variant == Variant::AlphaKBf16 ? Variant::Default : id.variant};
    const bool is_sample = id.family == Family::Cpu;
    std::map<std::string, double> baseline;
    for (const std::string& t : c.tensors) {
      const double y = yardsticks.at(design).rms(0, t, is_sample ? &self : nullptr);
      if (!std::isnan(y)) baseline[t] = y;
    }
    const std::vector<Judged> judged = judge_outputs(c.rule, k, truth, o, c.tensors, baseline,
                                                     b == bounds.end() ? nullptr : &b->second);
    if (o.id.family == Family::Mutant) {  // one testcase per mutant: ok when the gate kills it
      out.push_back(mutant_case(entry, job, o, judged));
      continue;
    }
    for (const Judged& j : judged) {
      GateCase g{entry.name,
                 to_string(o.id),
                 job.label + "/" + j.tensor,
                 "",
                 profile,
                 job.cfg.scenario,
                 entry.expect_pass,
                 true,
                 "",
                 "",
                 o.seconds};
      g.ok = entry.expect_pass ? j.v.pass : !j.v.pass;
      g.metric = j.v.first_metric;
      for (const std::string& f : j.v.failed) g.message += (g.message.empty() ? "" : "; ") + f;
      if (g.message.empty())
        g.message = fmt::format("rel_l2={:.3g} baseline_ratio={:.3g} bound_ratio={:.3g}",
                                j.m.rel_l2, j.baseline_ratio, j.m.bound_ratio);
      out.push_back(g);
    }
  }
  return out;
}

// An entry's pattern that names no implementation on any of its cases (a typo such as
// "cpu.absorbd") would judge nothing and pass: refused before anything runs, in every shard.
void require_patterns_match(const GateConfig& c, const std::vector<GateJob>& all) {
  std::vector<std::vector<char>> found(c.entries.size());  // [entry][pattern]
  for (size_t e = 0; e < c.entries.size(); ++e) found[e].assign(c.entries[e].impls.size(), 0);
  for (const GateJob& job : all) {  // each job's ids once, against every pattern of its entry
    std::vector<ImplId> ids = registered_ids(job.cfg, kGate);
    for (const auto& [id, why] : unavailable_ids(job.cfg, kGate)) ids.push_back(id);
    const std::vector<std::string>& patterns = c.entries[job.entry].impls;
    for (size_t p = 0; p < patterns.size(); ++p)
      for (const ImplId& id : ids) found[job.entry][p] |= id_matches(patterns[p], id);
  }
  for (size_t e = 0; e < c.entries.size(); ++e)
    for (size_t p = 0; p < found[e].size(); ++p)
      if (!found[e][p])
        throw InputError(c.source, fmt::format("entry[{}].impls", e),
                         "'" + c.entries[e].impls[p] +
                             "' matches no implementation the gate runs on this entry's cases "
                             "(e.g. cpu.absorbed*, gpu.model*, mutant.*)");
}

}  // namespace

GateResults run_gate(const GateConfig& c, int shard_k, int shard_n, int threads) {
  std::vector<GateJob> jobs;
  const std::vector<GateJob> all = expand_jobs(c);
  require_patterns_match(c, all);
  for (size_t i = 0; i < all.size(); ++i)
    if (int(i % size_t(shard_n)) == shard_k - 1) jobs.push_back(all[i]);
  std::vector<Case> cases(jobs.size());
  std::vector<const Case*> ptrs;
  std::vector<std::function<void()>> tasks;
  for (size_t i = 0; i < jobs.size(); ++i) {
    tasks.push_back([&, i] { cases[i] = generate_case(jobs[i].cfg); });  // independent draws
    ptrs.push_back(&cases[i]);
  }
  run_parallel(tasks, threads);
  tasks.clear();
  TruthOptions to;
  to.bits = c.ref_bits, to.latent_out = true, to.threads = threads;
  std::vector<Truth> truths = compute_truths(ptrs, to);
  GateResults r;
  std::vector<std::vector<GateCase>> per_job(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i)
    tasks.push_back([&, i] {
      per_job[i] = run_job(c, jobs[i], cases[i], truths[i]);
      cases[i] = Case{}, truths[i] = Truth{};  // free the case early
    });
  run_parallel(tasks, threads);
  for (auto& v : per_job) r.cases.insert(r.cases.end(), v.begin(), v.end());
  // Mutants an entry asked for that no case of it could show: the kill matrix says why.
  for (const GateJob& job : jobs)
    for (const auto& [id, why] : unavailable_ids(job.cfg, kGate)) {
      bool wanted = false;
      for (const std::string& p : c.entries[job.entry].impls) wanted |= id_matches(p, id);
      if (wanted && id.family == Family::Mutant)
        r.not_applicable.push_back({id.name, to_string(job.cfg.profile), why});
    }
  return r;
}

}  // namespace qkmla
