// install.consumer: golden case, audit of its own reference outputs (must pass) and of a copy with
// one head's output scaled by 1 + 2^-6 (must fail), through the installed public API only.
#include <cstdio>
#include <qkmla/qkmla.hpp>
#include <stdexcept>

int main() {
  qkmla::api::CaseOptions o;
  o.preset = "tiny";
  o.profile = "bf16";
  o.seqlens = {0, 37, 50};
  o.sq = 2;
  o.seed = 11;
  const qkmla::api::GoldenCase c = qkmla::api::golden(o);
  qkmla::api::Array out = c.tensor("ref.out"), lse = c.tensor("ref.lse");
  out.dtype = "F32", lse.dtype = "F32";  // the fp64 reference values rounded below would not fit
  for (double& v : out.values) v = double(float(v));
  for (double& v : lse.values) v = double(float(v));
  const qkmla::api::Verdict good = qkmla::api::audit(c, {{"out", out}, {"lse", lse}});
  std::printf("reference outputs (fp32): %s\n", good.passed ? "PASS" : "FAIL");
  const int64_t d_v = out.shape.back(), heads = out.shape[2];
  for (size_t i = 0; i < out.values.size(); ++i)
    if ((int64_t(i) / d_v) % heads == 1)
      out.values[i] = double(float(out.values[i] * (1 + 0x1p-6)));
  const qkmla::api::Verdict bad = qkmla::api::audit(c, {{"out", out}, {"lse", lse}});
  std::printf("head 1 scaled by 1 + 2^-6: %s\n", bad.passed ? "PASS" : "FAIL");
  if (!good.passed) std::printf("%s", good.table.c_str());
  bool refused = false;
  try {
    qkmla::api::audit(c, {{"out", {"F32", {1, 2}, {0.0}}}});
  } catch (const std::invalid_argument& e) {
    refused = true;
    std::printf("malformed array refused: %s\n", e.what());
  }
  return good.passed && !bad.passed && refused ? 0 : 1;
}
