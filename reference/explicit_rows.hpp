// ref.explicit's stages (conventions §1.1; proofs/reference.md, steps E.1-E.7, U.1): the query
// rows, and one share of a sequence's query rows run in phases over token blocks, so that the P run
// and the check run can take turns on each block of exact products (ref_explicit_pair, S.4).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/case.hpp"
#include "core/outputs.hpp"
#include "reference/dots.hpp"
#include "reference/exact_sum.hpp"
#include "reference/ref_common.hpp"

namespace qkmla::ref {

struct AlphaKByToken {
  std::vector<PackedMpVec> per_sequence;  // [B][T_b * G], t * G + g
};

// S.6: the exact sums of a ref.explicit run at P that do not depend on the run's precision, rounded
// once more at its check run's, which takes them instead of summing again: each key's sum of
// squares (E.2: the exact key's own) and, for plain MLA only, each visible row's content sum (E.5:
// the raw q_nope times the exact key; a normalized query is rounded at each run's precision). Per
// sequence, for the tokens of one keys phase at a time (the whole sequence, or one block of
// ref_explicit_pair's).
struct KeySums {
  struct Sequence {
    int64_t t0 = 0;                    // the phase's first token
    PackedMpVec sum_sq;                // [phase tokens * G]: (t - t0) * G + g, set by g's owner
    std::vector<PackedMpVec> content;  // [S_q * H][visible tokens of the phase], by row id
    std::vector<size_t> read;          // [S_q * H]: content values the check run has taken
  };
  int bits = 0;                        // the check run's precision
  std::vector<Sequence> per_sequence;  // [B]
  // Before the P run's keys phase on tokens [t0, t1) of sequence b: the last phase's sums go.
  void begin_phase(const Case& k, int b, int64_t t0, int64_t t1);
};

struct QueryRow {
  MpVec qc, qr;  // qc^ [d_c], qr^ [d_r]
  Mp alpha_q;    // 1 / S^q
};

// E.2-E.4 on one query row (b, i, h).
QueryRow query_row(const Case& k, int b, int i, int h, const Mp& eps);

// The query rows of heads [h0, h1) of sequence b (row = i * H + h, every i), E.1-E.7. Rows are
// independent, so shares of them run on separate threads; a share by heads forms the keys of its
// heads' groups only (a group's rows stay together for any S_q), and alpha_k[t, g] is stored by
// the share holding g's first head. Every call runs at the precision the share was made at (its
// MPFR values keep it; temporaries take the default). `counts`: this share's cursor counts
// towards Dots::blocks_read (one share per run does).
class ExplicitRows {
 public:
  ExplicitRows(const Case& k, const Dots& d, int b, const std::vector<QueryRow>& rows, int h0,
               int h1, bool with_latent_out, bool counts, Outputs& o);
  void keys(int64_t t0, int64_t t1);    // E.1-E.5 on tokens [t0, t1), blocks in token order
  void softmax();                       // E.6: lse of every row (after every keys() call)
  void values(int64_t t0, int64_t t1);  // E.7 on tokens [t0, t1), blocks in token order
  void finish();                        // stores out and latent_out (after every values() call)
  void keep_alpha_k(PackedMpVec* into) { keep_ = into; }  // [T * G], sized by the caller
  // S.6: this run (at P) rounds its key sums into `give` at give's precision too; or this run
  // (the check) takes them from `take`, each phase after the P run's.
  void give_sums(KeySums::Sequence* give, int bits);
  void take_sums(KeySums::Sequence* take) { take_ = take; }

 private:
  bool visible(size_t x, int64_t t) const;  // share row x sees token t
  void token_rope(int64_t t, size_t slot);
  void group_key(int g, int64_t t, size_t slot);

  const Case& k_;
  const MlaConfig& c_;
  int b_;
  std::vector<int> ids_;                       // [rows of this share]: row index i * H + h
  std::vector<std::vector<size_t>> by_group_;  // [G][its rows]: share rows x of each group
  int64_t T_;
  const std::vector<QueryRow>& rows_;
  PackedMpVec* keep_ = nullptr;  // the owned groups' alpha_k also go here (may be null)
  KeySums::Sequence *give_ = nullptr, *take_ = nullptr;  // S.6 (null: neither)
  Mp handed_;                                            // at give's precision
  bool latent_;
  Outputs& o_;
  Mp eps_, scale_;
  std::vector<char> needed_, owned_;  // [G]: groups the rows read; groups whose alpha_k we store
  Dots::Cursor k0c_;
  std::vector<PackedMpVec> logits_;  // [rows][visible t]: the only per-token state kept (E.5)
  MpVec lse_;                        // [rows]
  std::vector<ExactSum> lat_;        // [rows * r]: E.7's sums sum_t p c[t], exact (X.6, X.8)
  std::vector<size_t> seen_;         // [rows]: logits read back by values()
  MpVec gain_r_;                     // the rope key gain (exact) [d_r]
  // [rows][d_c]: qc^ ⊙ gamma_k, exact (E.5: the content key's gain moved onto the query, the
  // key's own values never rounded); plain MLA: qc^ itself.
  std::vector<MpVec> qg_;
  // keys(): per token of the chunk in hand, the rope part of its key [chunk][d_r] (unified: the
  // gained and rotated rope part without 1/S, U.1) and (unified) the raw part's sum of squares
  // [chunk]; each row's rope logit term [rows][chunk] (blockwise, none)
  std::vector<MpVec> rope_;
  MpVec rope_ss_;
  std::vector<MpVec> rope_dot_;
  // The exact key k0c[t, g] [d_c] in hand, as expansions (X.7). The cursor holds a token's block
  // until it moves to another token, so they stay valid for it.
  std::vector<std::span<const double>> key_;
};

}  // namespace qkmla::ref
