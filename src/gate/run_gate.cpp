#include "gate/run_gate.hpp"

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/generator.hpp"
#include "core/parallel.hpp"
#include "gate/evaluate.hpp"
#include "impl/mutants.hpp"
#include "io/safetensors.hpp"

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

// Testcases of one evaluated job.
std::vector<GateCase> judge_job(const GateConfig& c, const GateJob& job, const Evaluated& e,
                                const std::vector<Outputs>& impls, const std::map<std::string, Outputs>& bounds, double seconds) {
  const GateEntry& entry = c.entries[job.entry];
  const std::string profile = to_string(job.cfg.profile);
  std::vector<GateCase> out;
  GateCase refcase{entry.name, "reference." + profile, job.label, "", profile, job.cfg.scenario, true, true, "", "", seconds};
  if (!(e.agreeing_bits >= e.required_bits)) {
    refcase.ok = false;
    refcase.metric = "agreeing_bits";
    refcase.message = fmt::format("reference agrees with its 2P run on {:.1f} bits < {:.0f} required", e.agreeing_bits, e.required_bits);
  }
  out.push_back(refcase);
  for (const Outputs& o : impls) {
    const bool is_mutant = o.impl.rfind("mutant.", 0) == 0;
    bool wanted = false;
    for (const std::string& p : entry.impls) wanted |= id_matches(with_profile(p, job.cfg.profile), o.impl) || id_matches(p, o.impl);
    if (!wanted) continue;
    const auto b = bounds.find(o.impl);
    const std::vector<Judged> judged = judge_outputs(c.rule, e, o, c.tensors, b == bounds.end() ? nullptr : &b->second);
    if (is_mutant) {  // one testcase per mutant: ok when the gate kills it
      GateCase g{entry.name, o.impl, job.label, o.impl.substr(7, o.impl.rfind('.') - 7), profile, job.cfg.scenario,
                 entry.expect_pass, false, "", "", o.seconds};
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
      if (!killed) g.message = fmt::format("survived: every verdict passed (largest baseline_ratio {:.3g})", worst);
      out.push_back(g);
      continue;
    }
    for (const Judged& j : judged) {
      GateCase g{entry.name, o.impl, job.label + "/" + j.tensor, "", profile, job.cfg.scenario, entry.expect_pass, true, "", "", o.seconds};
      g.ok = entry.expect_pass ? j.v.pass : !j.v.pass;
      g.metric = j.v.first_metric;
      for (const std::string& f : j.v.failed) g.message += (g.message.empty() ? "" : "; ") + f;
      if (g.message.empty())
        g.message = fmt::format("rel_l2={:.3g} baseline_ratio={:.3g} bound_ratio={:.3g}", j.m.rel_l2, j.baseline_ratio, j.m.bound_ratio);
      out.push_back(g);
    }
  }
  return out;
}

}  // namespace

GateResults run_gate(const GateConfig& c, int shard_k, int shard_n, int threads) {
  std::vector<GateJob> jobs;
  const std::vector<GateJob> all = expand_jobs(c);
  for (size_t i = 0; i < all.size(); ++i)
    if (int(i % size_t(shard_n)) == shard_k - 1) jobs.push_back(all[i]);
  std::vector<Evaluated> cases(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) cases[i].k = generate_case(jobs[i].cfg);
  evaluate_references(cases, c.ref_bits, threads);
  GateResults r;
  std::vector<std::vector<GateCase>> per_job(jobs.size());
  std::vector<std::function<void()>> tasks;
  for (size_t i = 0; i < jobs.size(); ++i)
    tasks.push_back([&, i] {
      const auto t0 = std::chrono::steady_clock::now();
      Evaluated& e = cases[i];
      std::vector<Outputs> impls = run_impls(e.k, c.entries[jobs[i].entry].impls);
      for (const std::string& t : c.tensors)
        if (impls[0].tensors.count(t))
          e.baseline[t] = compare(impls[0].tensors.at(t), e.truth.tensors.at(t), impls[0].tensors.at(t).dtype,
                                  valid_mask(e.k, t), nullptr, &e.truth.lo.at(t)).rel_l2;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<Outputs> wanted;  // bounds only for the cpu.* implementations this entry judges
      for (const Outputs& o : impls)
        for (const std::string& p : c.entries[jobs[i].entry].impls)
          if (o.impl.rfind("cpu.", 0) == 0 && (id_matches(with_profile(p, jobs[i].cfg.profile), o.impl) || id_matches(p, o.impl))) {
            wanted.push_back(o);
            break;
          }
      const std::map<std::string, Outputs> bounds = bounds_for(e.k, wanted);
      per_job[i] = judge_job(c, jobs[i], e, impls, bounds, s);
      e = Evaluated{};  // free the case early
    });
  run_parallel(tasks, threads);
  for (auto& v : per_job) r.cases.insert(r.cases.end(), v.begin(), v.end());
  // Mutants an entry asked for that no case of it could show: the kill matrix says why.
  for (size_t i = 0; i < jobs.size(); ++i)
    for (impl::Mutant m : impl::all_mutants()) {
      const std::string id = "mutant." + impl::mutant_name(m);
      bool wanted = false;
      for (const std::string& p : c.entries[jobs[i].entry].impls) wanted |= id_matches(p, id);
      const std::string why = impl::mutant_not_applicable(m, jobs[i].cfg);
      if (wanted && !why.empty()) r.not_applicable.push_back({impl::mutant_name(m), to_string(jobs[i].cfg.profile), why});
    }
  return r;
}

namespace {
std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default: o += ch;
    }
  }
  return o;
}
}  // namespace

std::string junit_xml(const GateResults& r) {
  const std::vector<GateCase> all = r.testcases();
  std::map<std::string, std::vector<const GateCase*>> suites;
  for (const GateCase& c : all) suites[c.suite].push_back(&c);
  std::string s = fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"qkmla.gate\" tests=\"{}\" failures=\"{}\">\n",
                              all.size(), r.failed());
  for (const auto& [name, cases] : suites) {
    int failures = 0;
    double time = 0;
    for (const GateCase* c : cases) {
      failures += !c->ok;
      time += c->seconds;
    }
    s += fmt::format("  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" time=\"{:.3f}\">\n", xml_escape(name), cases.size(), failures, time);
    for (const GateCase* c : cases) {
      s += fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3f}\"", xml_escape(c->classname), xml_escape(c->name), c->seconds);
      if (c->ok) {
        s += "/>\n";
      } else {
        s += fmt::format(">\n      <failure message=\"{}\">{}</failure>\n    </testcase>\n", xml_escape(c->metric.empty() ? "survived" : c->metric),
                         xml_escape(c->message));
      }
    }
    s += "  </testsuite>\n";
  }
  return s + "</testsuites>\n";
}

std::string gate_markdown(const GateResults& r, const std::string& how) {
  std::string s = "# qkmla gate\n\n" + how + "\n\n";
  const std::vector<GateCase> all = r.testcases();
  std::map<std::string, std::pair<int, int>> by_class;  // classname -> (passed, failed)
  for (const GateCase& c : all) (c.ok ? by_class[c.classname].first : by_class[c.classname].second)++;
  s += "| implementation | passed | failed |\n|---|---|---|\n";
  for (const auto& [cls, pf] : by_class) s += fmt::format("| `{}` | {} | {} |\n", cls, pf.first, pf.second);
  if (r.failed()) {
    s += "\n## Failures\n\n| implementation | case | why |\n|---|---|---|\n";
    for (const GateCase& c : all)
      if (!c.ok) s += fmt::format("| `{}` | {} | {} |\n", c.classname, c.name, c.message);
  }
  return s + fmt::format("\n{} passed, {} failed\n", r.passed(), r.failed());
}

std::string results_json(const GateResults& r) {
  nlohmann::ordered_json j;
  j["cases"] = nlohmann::json::array();
  for (const GateCase& c : r.cases)
    j["cases"].push_back({{"suite", c.suite}, {"classname", c.classname}, {"name", c.name}, {"mutant", c.mutant},
                          {"profile", c.profile}, {"scenario", c.scenario}, {"expect_pass", c.expect_pass}, {"ok", c.ok},
                          {"metric", c.metric}, {"message", c.message}, {"seconds", c.seconds}});
  j["not_applicable"] = nlohmann::json::array();
  for (const NotApplicable& n : r.not_applicable)
    j["not_applicable"].push_back({{"mutant", n.mutant}, {"profile", n.profile}, {"reason", n.reason}});
  j["passed"] = r.passed();
  j["failed"] = r.failed();
  return j.dump(1) + "\n";
}

GateResults results_from_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path, "file", "cannot be opened");
  GateResults r;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& c : j.at("cases"))
      r.cases.push_back({c.at("suite"), c.at("classname"), c.at("name"), c.at("mutant"), c.at("profile"), c.at("scenario"),
                         c.at("expect_pass"), c.at("ok"), c.at("metric"), c.at("message"), c.at("seconds")});
    for (const auto& n : j.at("not_applicable")) r.not_applicable.push_back({n.at("mutant"), n.at("profile"), n.at("reason")});
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path, "gate results", std::string("not a qkmla gate --format json file: ") + e.what());
  }
  return r;
}

void merge_into(GateResults& into, const GateResults& part) {
  into.cases.insert(into.cases.end(), part.cases.begin(), part.cases.end());
  into.not_applicable.insert(into.not_applicable.end(), part.not_applicable.begin(), part.not_applicable.end());
}

}  // namespace qkmla
