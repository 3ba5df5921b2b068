#include "harness/truth.hpp"

#include <algorithm>
#include <exception>
#include <thread>
#include <tuple>

#include "core/parallel.hpp"
#include "metrics/compare.hpp"
#include "reference/exact_dot.hpp"
#include "reference/mp.hpp"

namespace qkmla {

const Outputs* Truth::of(const std::string& tensor) const {
  if (explicit_p.tensors.count(tensor)) return &explicit_p;
  if (absorbed_p.tensors.count(tensor)) return &absorbed_p;
  return nullptr;
}

namespace {

// `links`: the P run keeps its alpha_k for ref.absorbed and its key sums for the check run, which
// takes them (module level only).
Outputs reference_run(const Case& k, const ref::Dots& d, bool latent_out, int threads,
                      const ref::ExplicitLinks& links = {}) {
  return k.cfg.level == Level::Kernel ? ref::ref_kernel(k)
                                      : ref::ref_explicit(k, d, latent_out, threads, links);
}

// ref.absorbed at the current precision P, taking ref.explicit's alpha_k (null: its own).
Outputs absorbed_run(const Case& k, const ref::Dots& d, int threads,
                     const ref::AlphaKByToken* alpha_k) {
  return ref::ref_absorbed(k, d, Variant::Default, {}, threads, alpha_k);
}

// Threads for each of `runs` runs of one precision that run side by side: spare threads go to
// ref.explicit, which shares its query rows among them.
int threads_per_run(const TruthOptions& o, size_t runs) {
  return runs == 0 ? 1 : std::max(1, o.threads / int(runs));
}

// The tensors both runs carry (and that carry meaning): what the agreement is measured on.
std::vector<std::string> agreement_tensors(const Outputs& check) {
  std::vector<std::string> names;
  for (const char* n : {"out", "lse", "alpha_q", "alpha_k", "latent_out"})
    if (check.tensors.count(n)) names.push_back(n);
  return names;
}

// Whether a case's products stream: its P and check runs then take turns (ref_explicit_pair).
bool streams(const Case& k, const Truth& t) {
  return k.cfg.level == Level::Module && t.dots.streaming();
}

// The fillers a phase may take: only where the phase has a task for every thread. A phase with
// fewer (one long case whose run shares the threads itself, or one short task) would hand a whole
// filler to a thread and then wait for it: at 65,536 tokens one core idled 4.5 and 2.5 s of 52 s
// that way. Such fillers run in run_rest instead, on every thread.
Fillers* filling(const std::vector<std::function<void()>>& tasks, const TruthOptions& o,
                 Fillers& fillers) {
  return int(tasks.size()) >= o.threads ? &fillers : nullptr;
}

// The products, the P runs and the check runs of the cases `wave` (indices into cases), one phase
// after another; cases whose products stream are left for ref_explicit_pair (and their
// ref.absorbed, which takes the pair's alpha_k, for after it). At P, ref.explicit runs first and
// keeps its alpha_k in `kept`, then ref.absorbed takes them instead of forming the keys again; the
// check runs take the P runs' key sums (S.6).
void run_wave(const std::vector<const Case*>& cases, const std::vector<size_t>& wave,
              const TruthOptions& o, std::vector<Truth>& truths, std::vector<ref::KeptAlphaK>& kept,
              Fillers& fillers) {
  std::vector<std::function<void()>> tasks;
  size_t modules = 0;
  for (size_t i : wave) modules += cases[i]->cfg.level == Level::Module ? 1 : 0;
  const int per_case = threads_per_run(o, modules);  // a lone case forms k0c's tiles side by side
  for (size_t i : wave)
    if (cases[i]->cfg.level == Level::Module)
      tasks.push_back([&, i, per_case] {
        truths[i].dots =
            o.dots && cases.size() == 1 ? *o.dots : ref::exact_dots(*cases[i], -1, per_case);
      });
  run_parallel(tasks, o.threads, filling(tasks, o, fillers));
  auto paired = [&](size_t i) { return streams(*cases[i], truths[i]); };
  const int check_bits = o.check_bits ? o.check_bits : o.bits + 64;
  std::vector<ref::KeptKeySums> sums(cases.size());  // S.6: the P runs' key sums, for the checks
  {
    ref::PrecisionScope scope(o.bits);
    auto absorbs = [&](size_t i) { return o.absorbed && cases[i]->cfg.level == Level::Module; };
    tasks.clear();
    size_t runs = 0;
    for (size_t i : wave) runs += paired(i) ? 0 : 1;
    int share = threads_per_run(o, runs);
    for (size_t i : wave) {
      truths[i].bits = ref::PrecisionScope::current_bits();
      if (absorbs(i)) kept[i] = ref::new_kept_alpha_k();
      if (paired(i)) continue;
      if (cases[i]->cfg.level == Level::Module) sums[i] = ref::new_key_sums(check_bits);
      tasks.push_back([&, i, share] {
        truths[i].explicit_p = reference_run(*cases[i], truths[i].dots, o.latent_out, share,
                                             {kept[i].get(), sums[i].get(), nullptr});
      });
    }
    run_parallel(tasks, o.threads, filling(tasks, o, fillers));
    tasks.clear();
    runs = 0;
    for (size_t i : wave) runs += absorbs(i) && !paired(i) ? 1 : 0;
    share = threads_per_run(o, runs);
    for (size_t i : wave)
      if (absorbs(i) && !paired(i))
        tasks.push_back([&, i, share] {
          truths[i].absorbed_p = absorbed_run(*cases[i], truths[i].dots, share, kept[i].get());
          kept[i].reset();
        });
    run_parallel(tasks, o.threads, filling(tasks, o, fillers));
  }
  ref::PrecisionScope scope(check_bits);
  tasks.clear();
  size_t runs = 0;
  for (size_t i : wave) runs += paired(i) ? 0 : 1;
  const int share = threads_per_run(o, runs);
  for (size_t i : wave) {
    truths[i].check_bits = ref::PrecisionScope::current_bits();
    if (!paired(i))
      tasks.push_back([&, i, share] {
        truths[i].check = reference_run(*cases[i], truths[i].dots, false, share,
                                        {nullptr, nullptr, sums[i].get()});
        sums[i].reset();
      });
  }
  run_parallel(tasks, o.threads, filling(tasks, o, fillers));
  // Done with: the next wave's products take over these arrays (their pages already touched).
  for (size_t i : wave)
    if (!paired(i) && !(o.dots && cases.size() == 1)) truths[i].dots.release();
}

}  // namespace

std::vector<std::vector<size_t>> plan_waves(const std::vector<int64_t>& product_bytes, int threads,
                                            int64_t wave_bytes) {
  std::vector<std::vector<size_t>> waves;
  int64_t bytes = 0;
  for (size_t i = 0; i < product_bytes.size(); ++i) {
    if (waves.empty() ||
        (int(waves.back().size()) >= threads && bytes + product_bytes[i] > wave_bytes))
      waves.emplace_back(), bytes = 0;
    waves.back().push_back(i), bytes += product_bytes[i];
  }
  return waves;
}

std::vector<Truth> compute_truths(const std::vector<const Case*>& cases, const TruthOptions& o,
                                  const std::vector<std::function<void()>>& extra) {
  const auto owned = ref::own_precision();  // its phases set the process-wide precision
  std::vector<Truth> truths(cases.size());
  std::vector<ref::KeptAlphaK> kept(cases.size());  // ref.explicit's alpha_k, until ref.absorbed
  Fillers fillers(extra);  // the caller's work, on threads a phase would leave idle
  // Cases in waves (TruthOptions::wave_bytes), in order. The default report held all five
  // profiles' products at once (2.1 GB); waves of two cost the gate 13 % of its time.
  std::vector<int64_t> bytes;
  for (const Case* k : cases)
    bytes.push_back(k->cfg.level == Level::Module ? ref::whole_product_bytes(*k) : 0);
  for (const std::vector<size_t>& wave : plan_waves(bytes, o.threads, o.wave_bytes))
    run_wave(cases, wave, o, truths, kept, fillers);
  ref::drain_term_pool();
  // Streamed products: ref.explicit and its check take turns on each block, which is then formed
  // once for both (ref_explicit_pair). The fillers left run beside them on one more thread (their
  // last one, alone on run_rest's threads, idled a core 5 s of a 65,536-token report's 50).
  const int check_bits = o.check_bits ? o.check_bits : o.bits + 64;
  std::vector<size_t> streamed;
  for (size_t i = 0; i < cases.size(); ++i)
    if (streams(*cases[i], truths[i])) streamed.push_back(i);
  auto pairs = [&] {  // each pair, then its ref.absorbed with the pair's alpha_k
    for (size_t i : streamed) {
      std::tie(truths[i].explicit_p, truths[i].check) = ref::ref_explicit_pair(
          *cases[i], truths[i].dots, o.latent_out, o.bits, check_bits, o.threads, kept[i].get());
      if (!kept[i]) continue;
      const ref::PrecisionScope scope(o.bits);
      truths[i].absorbed_p = absorbed_run(*cases[i], truths[i].dots, o.threads, kept[i].get());
      kept[i].reset();
    }
  };
  if (streamed.empty() || o.threads < 2) {
    fillers.run_rest(o.threads);
    pairs();
  } else {
    std::exception_ptr side_error;
    std::thread side([&] {
      try {
        fillers.run_rest(1);
      } catch (...) {
        side_error = std::current_exception();
      }
    });
    try {
      pairs();
    } catch (...) {
      side.join();
      throw;
    }
    side.join();
    if (side_error) std::rethrow_exception(side_error);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    Truth& t = truths[i];
    t.agreeing_bits = agreeing_bits(*cases[i], t.explicit_p, t.check, agreement_tensors(t.check));
    t.required_bits = format_of(stored_dtype(cases[i]->cfg.profile)).precision + 20;
  }
  return truths;
}

Truth compute_truth(const Case& k, const TruthOptions& o,
                    const std::vector<std::function<void()>>& extra) {
  std::vector<Truth> t = compute_truths({&k}, o, extra);
  return std::move(t[0]);
}

}  // namespace qkmla
