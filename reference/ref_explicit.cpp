// ref.explicit: conventions §1.1 evaluated stage by stage (proofs/reference.md, steps E.1-E.7, U.1)
// by shares of query rows (reference/explicit_rows.hpp), alone or as a P run and a check run that
// take turns on each block of exact products (S.4).
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "core/parallel.hpp"
#include "reference/explicit_rows.hpp"
#include "reference/reference.hpp"

namespace qkmla::ref {

namespace {

using Clock = std::chrono::steady_clock;

Outputs begin_outputs(const Case& k, bool with_latent_out) {
  Outputs o;
  o.id = ref_id(Form::Explicit);
  init_outputs(o, k, {"out", "lse", "alpha_q", "alpha_k"});
  if (with_latent_out) init_outputs(o, k, {"latent_out"});
  return o;
}

void end_outputs(const Case& k, Outputs& o) {
  if (k.cfg.norm == NormMode::None) {  // plain MLA reports no statistics
    o.tensors.erase("alpha_q"), o.lo.erase("alpha_q");
    o.tensors.erase("alpha_k"), o.lo.erase("alpha_k");
  }
}

int share_count(const Case& k, int threads) {
  return deep_capture() ? 1 : std::max(1, std::min(threads, k.cfg.heads));
}

// One run of sequence b at the current precision: its query rows (E.2-E.4) and its shares.
struct SequenceRun {
  std::vector<QueryRow> rows;  // [S_q * H]
  std::vector<std::unique_ptr<ExplicitRows>> shares;

  // links.keep: null, or the runs' alpha_k for sequence b, formed here at the run's precision;
  // links.give, links.take: S.6's key sums of sequence b, handed to the check run or taken
  SequenceRun(const Case& k, const Dots& d, int b, bool with_latent_out, int n_shares, Outputs& o,
              const ExplicitLinks& links = {}) {
    const MlaConfig& c = k.cfg;
    const Mp eps = c.eps;
    for (int i = 0; i < c.s_q; ++i)
      for (int h = 0; h < c.heads; ++h) {
        rows.push_back(query_row(k, b, i, h, eps));
        store(o, "alpha_q", o.tensors.at("alpha_q").index({b, i, h}), rows.back().alpha_q);
      }
    for (int s = 0; s < n_shares; ++s)  // by heads: whole groups when the split falls between them
      shares.push_back(std::make_unique<ExplicitRows>(k, d, b, rows, c.heads * s / n_shares,
                                                      c.heads * (s + 1) / n_shares, with_latent_out,
                                                      s == 0, o));
    if (links.keep) {
      PackedMpVec& into = links.keep->per_sequence.emplace_back();
      into.resize(size_t(c.seqlens[size_t(b)] * c.groups));
      for (auto& s : shares) s->keep_alpha_k(&into);
    }
    if (KeySums* g = links.give) {
      g->per_sequence.resize(size_t(c.batch));
      for (auto& s : shares) s->give_sums(&g->per_sequence[size_t(b)], g->bits);
    }
    if (KeySums* t = links.take) {
      if (t->bits != PrecisionScope::current_bits())
        throw std::logic_error("S.6: key sums handed at " + std::to_string(t->bits) +
                               " bits to a run at " +
                               std::to_string(PrecisionScope::current_bits()));
      for (auto& s : shares) s->take_sums(&t->per_sequence.at(size_t(b)));
    }
  }
  SequenceRun(const SequenceRun&) = delete;  // the shares hold a reference to rows

  // Runs f on every share, each on its own thread. `ahead` (may be null): a block read later,
  // formed in the same phases: share i first runs its pieces first + i, first + i + stride, ...
  // so that the threads share that work evenly (a helper thread would compete with them).
  void each(const std::function<void(ExplicitRows&)>& f, Dots::Pending* ahead = nullptr,
            int first = 0, int stride = 1) {
    std::vector<std::function<void()>> tasks;
    for (size_t i = 0; i < shares.size(); ++i)
      tasks.push_back([&f, &s = shares[i], ahead, p0 = first + int(i), stride] {
        if (ahead)
          for (int p = p0; p < ahead->pieces(); p += stride) ahead->run(p);
        f(*s);
      });
    run_parallel(tasks, int(tasks.size()));
  }
};

// Runs f under the precision `bits` and adds its wall time to `seconds`.
void timed(int bits, double& seconds, const std::function<void()>& f) {
  const PrecisionScope scope(bits);
  const auto start = Clock::now();
  f();
  seconds += std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

void AlphaKByTokenFree::operator()(AlphaKByToken* a) const { delete a; }

KeptAlphaK new_kept_alpha_k() { return KeptAlphaK(new AlphaKByToken); }

void KeySumsFree::operator()(KeySums* s) const { delete s; }

KeptKeySums new_key_sums(int check_bits) {
  KeptKeySums s(new KeySums);
  s->bits = PrecisionScope::effective_bits(check_bits);
  return s;
}

Outputs ref_explicit(const Case& k, const Dots& d, bool with_latent_out, int threads,
                     const ExplicitLinks& links) {
  const auto start = Clock::now();
  Outputs o = begin_outputs(k, with_latent_out);
  const int shares = share_count(k, threads);
  if (links.keep) links.keep->per_sequence.clear();
  for (int b = 0; b < k.cfg.batch; ++b) {
    const int64_t T = k.cfg.seqlens[size_t(b)];
    SequenceRun run(k, d, b, with_latent_out, shares, o, links);
    if (links.give) links.give->begin_phase(k, b, 0, T);  // one phase: the whole sequence
    run.each([T](ExplicitRows& r) {
      r.keys(0, T);
      r.softmax();
      r.values(0, T);
      r.finish();
    });
    if (links.take) links.take->per_sequence[size_t(b)] = {};  // taken: its memory goes
  }
  end_outputs(k, o);
  o.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return o;
}

std::pair<Outputs, Outputs> ref_explicit_pair(const Case& k, const Dots& d, bool with_latent_out,
                                              int bits, int check_bits, int threads,
                                              AlphaKByToken* keep) {
  Outputs p = begin_outputs(k, with_latent_out), check = begin_outputs(k, false);
  if (keep) keep->per_sequence.clear();
  const KeptKeySums sums = new_key_sums(check_bits);  // S.6, a block at a time
  const int shares = share_count(k, threads);
  const Dots::NoAhead no_ahead(d);  // the phases form the next block themselves
  const int stride = 2 * shares;    // share tasks per block: the P run's, then the check's
  for (int b = 0; b < k.cfg.batch; ++b) {
    const int64_t T = k.cfg.seqlens[size_t(b)];
    const int64_t block = d.streaming() ? d.block_tokens() : std::max<int64_t>(T, 1);
    std::unique_ptr<SequenceRun> rp, rc;
    timed(bits, p.seconds, [&] {
      rp = std::make_unique<SequenceRun>(k, d, b, with_latent_out, shares, p,
                                         ExplicitLinks{keep, sums.get(), nullptr});
    });
    timed(check_bits, check.seconds, [&] {
      rc = std::make_unique<SequenceRun>(k, d, b, false, shares, check,
                                         ExplicitLinks{nullptr, nullptr, sums.get()});
    });
    // The two runs read each block one after the other, so it is formed once for both (S.4); the
    // block after it is formed in the same two phases, by their share tasks.
    if (auto first = d.prefetch(k, b, 0)) {
      std::vector<std::function<void()>> pieces;
      for (int i = 0; i < first->pieces(); ++i) pieces.push_back([&first, i] { first->run(i); });
      run_parallel(pieces, shares);
    }
    for (int64_t t0 = 0; t0 < T; t0 += block) {
      const int64_t t1 = std::min(T, t0 + block);
      const auto ahead = d.prefetch(k, b, t1);  // null after the last block
      sums->begin_phase(k, b, t0, t1);          // the check has taken the last block's
      timed(bits, p.seconds,
            [&] { rp->each([&](ExplicitRows& r) { r.keys(t0, t1); }, ahead.get(), 0, stride); });
      timed(check_bits, check.seconds, [&] {
        rc->each([&](ExplicitRows& r) { r.keys(t0, t1); }, ahead.get(), shares, stride);
      });
    }
    timed(bits, p.seconds, [&] { rp->each([](ExplicitRows& r) { r.softmax(); }); });
    timed(check_bits, check.seconds, [&] { rc->each([](ExplicitRows& r) { r.softmax(); }); });
    // The values read no product (X.8): one phase per run, forming the next sequence's first block.
    const auto ahead = b + 1 < k.cfg.batch ? d.prefetch(k, b + 1, 0) : nullptr;
    timed(bits, p.seconds,
          [&] { rp->each([&](ExplicitRows& r) { r.values(0, T); }, ahead.get(), 0, stride); });
    timed(check_bits, check.seconds,
          [&] { rc->each([&](ExplicitRows& r) { r.values(0, T); }, ahead.get(), shares, stride); });
    timed(bits, p.seconds, [&] {
      rp->each([](ExplicitRows& r) { r.finish(); });
      rp.reset();
    });
    timed(check_bits, check.seconds, [&] {
      rc->each([](ExplicitRows& r) { r.finish(); });
      rc.reset();
    });
  }
  end_outputs(k, p);
  end_outputs(k, check);
  return {std::move(p), std::move(check)};
}

}  // namespace qkmla::ref
