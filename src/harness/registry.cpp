#include "harness/registry.hpp"

#include <chrono>
#include <stdexcept>

#include "gpu/qkmla_gpu.hpp"
#include "impl/cpu_impls.hpp"
#include "impl/gpu_impl.hpp"
#include "impl/kernel_level.hpp"

namespace qkmla {

namespace {

ImplId cpu(Form f, Profile p, Variant v = Variant::Default) {
  ImplId id;
  id.family = Family::Cpu, id.form = f, id.profile = p, id.variant = v;
  return id;
}

std::vector<Outputs> named(std::vector<Outputs> outs, const std::vector<ImplId>& ids) {
  for (size_t n = 0; n < outs.size(); ++n) outs[n].id = ids[n];
  return outs;
}

// One family member's outputs, moved into the vector: `named({o}, ids)` would copy them from the
// initializer list, a second [B, T, G] alpha_k at a long context.
std::vector<Outputs> named(Outputs out, const std::vector<ImplId>& ids) {
  std::vector<Outputs> v;
  v.push_back(std::move(out));
  return named(std::move(v), ids);
}

Outputs timed(const std::function<Outputs()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  Outputs o = f();
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return o;
}

std::vector<impl::AbsorbedSpec> specs_of(const std::vector<ImplId>& ids) {
  std::vector<impl::AbsorbedSpec> s;
  for (const ImplId& id : ids)
    s.push_back(id.family == Family::Mutant
                    ? impl::AbsorbedSpec{Variant::Default, mutant_of(id).p, std::nullopt}
                    : impl::AbsorbedSpec{id.variant, {}, std::nullopt});
  return s;
}

gpu::RunOptions gpu_options(Form f) {
  gpu::RunOptions o;
  const int n = gpu::device_sm_count();  // the model splits like the device it stands for
  o.sm_count = n > 0 ? n : o.sm_count;
  o.explicit_form = f == Form::Explicit;
  return o;
}

std::vector<ImplId> gpu_ids(const MlaConfig& c, Family fam) {
  if (!impl::gpu_not_applicable(c).empty() || c.level != Level::Module) return {};
  ImplId a;
  a.family = fam, a.form = Form::Absorbed, a.profile = c.profile;
  std::vector<ImplId> ids = {a};
  if (c.norm == NormMode::Blockwise) {  // the explicit kernel is blockwise only
    a.form = Form::Explicit;
    ids.push_back(a);
  }
  return ids;
}

// The reference's forms for converge: explicit, absorbed and its exact-arithmetic variants.
std::vector<ImplId> ref_ids(const MlaConfig& c) {
  if (c.level != Level::Module) return {};
  ImplId e;
  e.family = Family::Ref, e.form = Form::Explicit;
  std::vector<ImplId> ids = {e};
  for (Variant v : all_variants()) {
    if (v == Variant::AlphaKBf16 || (c.norm == NormMode::None && v != Variant::Default)) continue;
    ImplId a;
    a.family = Family::Ref, a.form = Form::Absorbed, a.variant = v;
    ids.push_back(a);
  }
  return ids;
}

std::vector<Outputs> run_ref(const Case& k, const std::vector<ImplId>& ids, const RunContext& ctx) {
  if (!ctx.dots)
    throw std::logic_error("registry: multiprecision implementations need the exact products");
  std::vector<Outputs> out;
  for (const ImplId& id : ids) {
    if (id.family == Family::Mutant)
      out.push_back(ref::ref_absorbed(k, *ctx.dots, Variant::Default, mutant_of(id).p));
    else if (id.form == Form::Explicit)
      out.push_back(ref::ref_explicit(k, *ctx.dots, false));
    else
      out.push_back(ref::ref_absorbed(k, *ctx.dots, id.variant));
  }
  return named(std::move(out), ids);
}

ImplFamily cpu_explicit_family() {
  ImplFamily f{"cpu.explicit", kReport | kGate | kBaseline, nullptr, nullptr, nullptr, nullptr};
  f.ids = [](const MlaConfig& c) {
    return c.level == Level::Module ? std::vector<ImplId>{cpu(Form::Explicit, c.profile)}
                                    : std::vector<ImplId>{};
  };
  f.run = [](const Case& k, const std::vector<ImplId>& ids, const RunContext&) {
    return named(timed([&] { return impl::cpu_explicit(k); }), ids);
  };
  f.bounds = [](const Case& k, const std::vector<ImplId>& ids) {
    return named(impl::cpu_explicit_bounds(k), ids);
  };
  return f;
}

ImplFamily cpu_kernel_family() {
  ImplFamily f{"cpu.kernel", kBaseline, nullptr, nullptr, nullptr, nullptr};
  f.ids = [](const MlaConfig& c) {
    return c.level == Level::Kernel ? std::vector<ImplId>{cpu(Form::Kernel, c.profile)}
                                    : std::vector<ImplId>{};
  };
  f.run = [](const Case& k, const std::vector<ImplId>& ids, const RunContext&) {
    return named(impl::cpu_kernel(k), ids);
  };
  return f;
}

ImplFamily cpu_absorbed_family() {
  ImplFamily f{"cpu.absorbed", kReport | kGate, nullptr, nullptr, nullptr, nullptr};
  f.ids = [](const MlaConfig& c) {
    std::vector<ImplId> ids;
    if (c.level == Level::Module)
      for (Variant v : impl::variants_for(c.profile, c.norm))
        ids.push_back(cpu(Form::Absorbed, c.profile, v));
    return ids;
  };
  f.run = [](const Case& k, const std::vector<ImplId>& ids, const RunContext&) {
    return named(impl::cpu_absorbed(k, specs_of(ids)), ids);
  };
  f.bounds = [](const Case& k, const std::vector<ImplId>& ids) {
    return named(impl::cpu_absorbed_bounds(k, specs_of(ids)), ids);
  };
  return f;
}

ImplId mutant_id(const impl::Mutant& m, std::optional<Profile> p) {
  ImplId id;
  id.family = Family::Mutant, id.name = m.name, id.profile = p;
  return id;
}

// conventions §7's mutants in the profile arithmetic (the gate's), each the default absorbed
// implementation under its Perturbation.
ImplFamily mutant_family() {
  ImplFamily f{"mutant", kGate, nullptr, nullptr, nullptr, nullptr};
  f.ids = [](const MlaConfig& c) {
    std::vector<ImplId> ids;
    for (const impl::Mutant& m : impl::mutants())
      if (c.level == Level::Module && impl::mutant_not_applicable(m, c).empty())
        ids.push_back(mutant_id(m, c.profile));
    return ids;
  };
  f.run = [](const Case& k, const std::vector<ImplId>& ids, const RunContext&) {
    std::vector<Outputs> out;  // one at a time: each builds its own cache
    for (const ImplId& id : ids) out.push_back(impl::cpu_absorbed(k, specs_of({id}))[0]);
    return named(std::move(out), ids);
  };
  f.unavailable = [](const MlaConfig& c) {
    std::vector<std::pair<ImplId, std::string>> out;
    for (const impl::Mutant& m : impl::mutants())
      if (const std::string why = impl::mutant_not_applicable(m, c); !why.empty())
        out.emplace_back(mutant_id(m, c.profile), why);
    return out;
  };
  return f;
}

ImplFamily gpu_model_family() {
  ImplFamily f{"gpu.model", kReport | kGate, nullptr, nullptr, nullptr, nullptr};
  f.ids = [](const MlaConfig& c) { return gpu_ids(c, Family::GpuModel); };
  f.run = [](const Case& k, const std::vector<ImplId>& ids, const RunContext&) {
    std::vector<Outputs> out;
    for (const ImplId& id : ids) out.push_back(impl::gpu_model(k, gpu_options(id.form)));
    return named(std::move(out), ids);
  };
  f.unavailable = [](const MlaConfig& c) {
    std::vector<std::pair<ImplId, std::string>> out;
    ImplId id;
    id.family = Family::GpuModel, id.profile = c.profile;
    if (const std::string why = impl::gpu_not_applicable(c); !why.empty())
      out.emplace_back(id, why);
    return out;
  };
  return f;
}

// The kernels on a device: registered only where one exists.
ImplFamily gpu_device_family() {
  ImplFamily f{"gpu", kReport, nullptr, nullptr, nullptr, nullptr};
  f.ids = [](const MlaConfig& c) {
    std::string why;
    return gpu::device_available(&why) ? gpu_ids(c, Family::Gpu) : std::vector<ImplId>{};
  };
  f.run = [](const Case& k, const std::vector<ImplId>& ids, const RunContext&) {
    std::vector<Outputs> out;
    for (const ImplId& id : ids) out.push_back(impl::gpu_device(k, gpu_options(id.form)));
    return named(std::move(out), ids);
  };
  return f;
}

// Multiprecision: the reference's forms and the mutants converge lists, for qkmla converge.
ImplFamily ref_family() { return {"ref", kConverge, ref_ids, run_ref, nullptr, nullptr}; }

ImplFamily ref_mutant_family() {
  ImplFamily f{"ref.mutant", kConverge, nullptr, run_ref, nullptr, nullptr};
  f.ids = [](const MlaConfig& c) {
    std::vector<ImplId> ids;
    for (const impl::Mutant& m : impl::mutants())
      if (m.converge && c.level == Level::Module && impl::mutant_not_applicable(m, c).empty())
        ids.push_back(mutant_id(m, {}));
    return ids;
  };
  return f;
}

// Runs `wanted` family by family (one call per family), returning outputs in `wanted` order.
template <class Call>
std::vector<Outputs> by_family(const Case& k, const std::vector<ImplId>& wanted, const Call& call) {
  std::vector<Outputs> out(wanted.size());
  std::vector<bool> done(wanted.size(), false);
  for (size_t n = 0; n < wanted.size(); ++n) {
    if (done[n]) continue;
    const ImplFamily& f = family_of(wanted[n], k.cfg);
    std::vector<ImplId> ids;
    std::vector<size_t> slots;
    for (size_t m = n; m < wanted.size(); ++m)
      if (!done[m] && &family_of(wanted[m], k.cfg) == &f)
        ids.push_back(wanted[m]), slots.push_back(m), done[m] = true;
    std::vector<Outputs> got = call(f, ids);
    for (size_t j = 0; j < got.size() && j < slots.size(); ++j) out[slots[j]] = std::move(got[j]);
  }
  return out;
}

}  // namespace

const ImplFamily& family_of(const ImplId& id, const MlaConfig& c) {
  for (const ImplFamily& f : registry())
    for (const ImplId& x : f.ids(c))
      if (x == id) return f;
  throw ConfigError("impl",
                    "'" + to_string(id) + "' is not a registered implementation for this case");
}

const std::vector<ImplFamily>& registry() {
  static const std::vector<ImplFamily> r = {
      cpu_explicit_family(), cpu_kernel_family(), cpu_absorbed_family(), mutant_family(),
      gpu_model_family(),    gpu_device_family(), ref_family(),          ref_mutant_family()};
  return r;
}

std::vector<ImplId> registered_ids(const MlaConfig& c, unsigned uses) {
  std::vector<ImplId> out;
  for (const ImplFamily& f : registry())
    if (f.uses & uses)
      for (const ImplId& id : f.ids(c)) out.push_back(id);
  return out;
}

std::vector<Outputs> run_impls(const Case& k, const std::vector<ImplId>& wanted,
                               const RunContext& ctx) {
  return by_family(k, wanted, [&](const ImplFamily& f, const std::vector<ImplId>& ids) {
    return f.run(k, ids, ctx);
  });
}

std::map<std::string, Outputs> run_bounds(const Case& k, const std::vector<ImplId>& wanted) {
  // proofs/error_bounds.md has no step for the sink factor: no bound is claimed for sink cases.
  if (k.cfg.attn_sink) return {};
  std::vector<ImplId> with;
  for (const ImplId& id : wanted)
    if (family_of(id, k.cfg).bounds) with.push_back(id);
  std::vector<Outputs> got = by_family(
      k, with,
      [&](const ImplFamily& f, const std::vector<ImplId>& ids) { return f.bounds(k, ids); });
  std::map<std::string, Outputs> out;
  for (Outputs& o : got) out[to_string(o.id)] = std::move(o);
  return out;
}

const impl::Mutant& mutant_of(const ImplId& id) { return impl::find_mutant(id.name); }

std::vector<std::pair<ImplId, std::string>> unavailable_ids(const MlaConfig& c, unsigned uses) {
  std::vector<std::pair<ImplId, std::string>> out;
  for (const ImplFamily& f : registry())
    if ((f.uses & uses) && f.unavailable)
      for (auto& x : f.unavailable(c)) out.push_back(std::move(x));
  return out;
}

}  // namespace qkmla
