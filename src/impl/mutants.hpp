// The deliberately wrong implementations of SPEC §7: plausible bugs the gate must catch. Each is
// the default absorbed implementation with one change; ids are mutant.<name>.<profile>.
#pragma once
#include <string>
#include <vector>

#include "core/config.hpp"

namespace qkmla::impl {

enum class Mutant {
  None,
  NoGammaK,             // gamma_ck not absorbed into q_latent
  GammaKTwice,          // gamma_ck applied twice
  EpsOutsideSqrt,       // 1 / (sqrt(mean z^2) + eps)
  NoEps,                // eps dropped
  AlphaKFromLatent,     // RMS over c[t] instead of the key
  AlphaKLowp,           // key RMS accumulated in bf16
  JointNormInBlockwise, // unified statistic in a blockwise config
  AlphaKOffByOne,       // token t scaled by alpha_k[t-1]
  GroupMapMod,          // g(h) = h % G
  ScaleDcOnly,          // sigma = 1/sqrt(d_c)
  NoAlphaQ,             // alpha_q dropped
  ScoreLowpAccum,       // q_latent . c accumulated in bf16
  CausalOffByOne,       // query i also sees pos(i) + 1
  RopeOrderSwapped,     // the other rope order
  LseBase2,             // lse in base 2
};

const std::vector<Mutant>& all_mutants();
std::string mutant_name(Mutant m);                 // "no_gamma_k", ...
Mutant parse_mutant(const std::string& name);      // throws ConfigError("mutant", ...)
// Why the mutant cannot differ from the correct implementation on this config ("" if it can).
std::string mutant_not_applicable(Mutant m, const MlaConfig& c);

}  // namespace qkmla::impl
