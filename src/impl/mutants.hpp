// The deliberately wrong implementations of conventions §7: plausible bugs the gate must catch.
// Each is a named Perturbation (core/perturbation.hpp) of the default absorbed implementation; the
// gate runs it through cpu_absorbed, certify refutes the same object, converge evaluates it in
// MPFR.
#pragma once
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/perturbation.hpp"

namespace qkmla::impl {

struct Mutant {
  std::string name;  // "no_gamma_k", ... (ids: mutant.<name>.<profile>)
  std::string bug;   // one line: what is wrong
  Perturbation p;
  std::string exposed_by;  // a scenario where its effect is far above rounding ("" = any)
  bool converge = false;   // a series of qkmla converge (evaluated in MPFR at every precision)
};

const std::vector<Mutant>& mutants();                // conventions §7's table, in its order
const Mutant& find_mutant(const std::string& name);  // throws ConfigError("mutant", ...)
// Why the mutant cannot differ from the correct implementation on this config ("" if it can).
std::string mutant_not_applicable(const Mutant& m, const MlaConfig& c);

}  // namespace qkmla::impl
