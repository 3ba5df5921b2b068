// mma_fit FILE: fits gpu/model/mma_model.hpp's parameters to the tiles gpu/probe_mma wrote, per
// instruction kind, and prints the best set, its mismatches and whether it is the only exact one.
#include <cstdio>
#include <exception>

#include "gpu/model/mma_model.hpp"

using namespace qkmla::gpu::mma;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: mma_fit PROBE_FILE\n");
    return 2;
  }
  try {
    const std::vector<Tile> tiles = read_probe(argv[1]);
    const char* names[] = {"mma.sync m16n8k16 bf16", "mma.sync m16n8k16 fp16",
                           "wgmma m64n8k16 bf16"};
    int rc = 0;
    for (int kind = 0; kind < 3; ++kind) {
      std::vector<MmaRecord> recs;
      for (const Tile& t : tiles)
        if (int(t.kind) == kind)
          for (const MmaRecord& r : records(t)) recs.push_back(r);
      if (recs.empty()) {
        std::printf("%s: no tiles\n", names[kind]);
        continue;
      }
      const FitResult f = fit(recs, parameter_grid());
      std::printf("%s: %ld records; best: %s; %ld mismatch(es); %zu exact set(s)%s\n", names[kind],
                  f.records, f.best.str().c_str(), f.mismatches, f.exact.size(),
                  f.exact.size() == 1 ? " (identified)" : "");
      for (const MmaParams& p : f.exact) std::printf("  exact: %s\n", p.str().c_str());
      if (f.mismatches) rc = 1;
    }
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mma_fit: %s\n", e.what());
    return 2;
  }
}
