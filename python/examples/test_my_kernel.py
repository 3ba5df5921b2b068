"""How a kernel's own pytest suite uses qkmla: a golden case per parameter set, the kernel's outputs
audited, `assert_pass()` so that a failure shows qkmla's whole table. "The kernel" here is the
independent NumPy implementation of tests/thirdparty/mla_numpy.py (it shares no code with qkmla's
C++); `test_a_perturbed_kernel_fails` is the same kernel with a bug (queries rotated one position
off), which must fail with the diagnosis naming it.

Run: pytest python/examples/test_my_kernel.py (with `pip install ./python` done)."""
import os
import sys

import ml_dtypes
import numpy as np
import pytest

import qkmla

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "thirdparty"))
import mla_numpy  # noqa: E402  (the kernel under test)

SHAPES = {  # name -> golden() keyword arguments
    "paper-shape-g8": dict(preset="paper-g8", seqlens=[0, 20]),
    "nope": dict(preset="tiny-nope", seqlens=[0, 12, 30]),
    "one-group": dict(preset="tiny-g1", seqlens=[5, 30]),
    "plain-mla": dict(preset="tiny", norm="none", seqlens=[3, 25]),
}


def my_kernel(case, tmp_path, bug=""):
    """Runs the kernel on the case's inputs; returns its outputs (numpy arrays)."""
    path = tmp_path / "case.safetensors"
    case.save(path)
    return mla_numpy.Run(str(path), "stored_out", bug).run()


@pytest.mark.parametrize("profile", ["fp32", "bf16", "fp16", "fp8"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_my_kernel_matches_the_reference(profile, shape, tmp_path):
    case = qkmla.golden(profile=profile, sq=2, seed=7, **SHAPES[shape])
    res = my_kernel(case, tmp_path)
    verdict = qkmla.audit(case, out=res["out"], lse=res["lse"], label=f"numpy_{shape}")
    verdict.assert_pass()
    assert {r["tensor"] for r in verdict.rows} == {"out", "lse"}


def test_a_perturbed_kernel_fails(tmp_path):
    case = qkmla.golden(preset="tiny", profile="bf16", seqlens=[0, 37, 50], sq=2, seed=3)
    res = my_kernel(case, tmp_path, bug="rope_pos_plus1")
    verdict = qkmla.audit(case, out=res["out"], lse=res["lse"], label="numpy_buggy")
    assert not verdict.passed
    assert "rope_pos=+1" in verdict.diagnosis
    with pytest.raises(AssertionError) as failure:
        verdict.assert_pass()
    print(failure.value)  # what pytest would show: the CLI's table, verdict and diagnosis
    assert "verdict: FAIL" in str(failure.value)


def test_inputs_of_my_own(tmp_path):
    """The user's own tensors (here: a generated case's, with the gains replaced) as a case."""
    base = qkmla.golden(preset="tiny", profile="fp32", seqlens=[9], sq=1, seed=5)
    inputs = dict(base.inputs)
    inputs["gamma_cq"] = (inputs["gamma_cq"] * 2).astype(inputs["gamma_cq"].dtype)
    case = qkmla.golden(inputs=inputs)
    assert case.config["profile"] == "fp32"
    assert not (case.ref["out"] == base.ref["out"]).all()
    res = my_kernel(case, tmp_path)
    qkmla.audit(case, out=res["out"], lse=res["lse"]).assert_pass()


def test_bad_arrays_are_refused():
    case = qkmla.golden(preset="tiny", profile="bf16", seqlens=[9])
    with pytest.raises(qkmla.QkmlaError, match="shape"):
        qkmla.audit(case, out=case.ref["out"][..., :3].astype("float32"))
    # An integer output has no rounding format to judge it by: refused, naming the tensor (it
    # had surfaced an internal "format_of" message).
    with pytest.raises(qkmla.QkmlaError, match="out: dtype I32"):
        qkmla.audit(case, out=case.ref["out"].astype("int32"))
    # A declared chunk length (a chunked prefill's KV chunks) is a positive number of tokens.
    with pytest.raises(qkmla.QkmlaError, match="kv-chunk"):
        qkmla.audit(case, out=case.ref["out"].astype("float32"), kv_chunk=-1)
    # A wrong argument is a QkmlaError naming it (it had been pybind11's "Unable to cast").
    with pytest.raises(qkmla.QkmlaError, match="seed=-1"):
        qkmla.golden(preset="tiny", seed=-1)
    # Bad inputs name the caller's arrays (<inputs>), the tensor and the index.
    bad = {k: np.array(v) for k, v in case.inputs.items()}
    bad["w_uk"][0, 0] = np.nan
    with pytest.raises(qkmla.QkmlaError, match="<inputs>: w_uk: non-finite value at flat index 0"):
        qkmla.golden(inputs=bad)


def test_inputs_from_several_threads_at_once():
    # golden() releases the GIL: concurrent calls must not share a temporary file.
    from concurrent.futures import ThreadPoolExecutor
    base = qkmla.golden(preset="tiny", profile="fp32", seqlens=[9])
    variants = []
    for s in range(4):
        x = {k: np.array(v) for k, v in base.inputs.items()}
        x["q_nope"] = (x["q_nope"] * (1 + s / 4)).astype(x["q_nope"].dtype)
        variants.append(x)
    with ThreadPoolExecutor(4) as pool:
        cases = list(pool.map(lambda x: qkmla.golden(inputs=x), variants))
    alone = [qkmla.golden(inputs=x) for x in variants]
    for got, want in zip(cases, alone):
        assert (got.ref["out"] == want.ref["out"]).all()
    assert not (cases[0].ref["out"] == cases[3].ref["out"]).all()


def test_a_flashmla_style_kernel_through_its_own_interface():
    c = qkmla.golden(preset="tiny", profile="bf16", seqlens=[5, 0, 70], sq=2, layout="flashmla",
                     page_size=16)
    args = c.kernel_args("flashmla")  # q, k_cache, block_table, cache_seqlens, alpha_*, softmax_scale
    assert tuple(args["block_table"].shape) == (3, 5) and "int32" in str(args["block_table"].dtype)
    # A stand-in for flash_mla_with_kvcache(**args): the reference, in FlashMLA's output layout.
    out = c.ref["latent_out"].astype(np.float32).astype(ml_dtypes.bfloat16)
    lse = np.ascontiguousarray(np.transpose(c.ref["lse"], (0, 2, 1)).astype(np.float32))
    lse[np.isneginf(lse)] = np.inf  # FlashMLA: +inf for a row that sees no token
    qkmla.audit(c, out=out, softmax_lse=lse, layout="flashmla").assert_pass()
    # softmax_lse written in qkmla's [B, S_q, H] order: FAIL, and the diagnosis says so.
    wrong = np.ascontiguousarray(np.transpose(lse, (0, 2, 1))).reshape(lse.shape)
    v = qkmla.audit(c, out=out, softmax_lse=wrong, layout="flashmla")
    assert not v.passed and "softmax_lse_order=[B,S_q,H]" in v.diagnosis


def test_sparse_topk_sinks_and_fp8_block128_through_flashmla_args():
    c = qkmla.golden(preset="paper-g8", profile="fp8-block128", seqlens=[40, 0, 9], sq=2,
                     layout="flashmla", page_size=16, topk=12, attn_sink=True)
    args = c.kernel_args("flashmla")
    assert tuple(args["indices"].shape) == (3, 2, 12) and "int32" in str(args["indices"].dtype)
    assert tuple(args["attn_sink"].shape) == (16,)
    # FlashMLA's packed fp8 cache: 512 e4m3 codes, 4 fp32 scales, 64 bf16 rope values per slot.
    assert tuple(args["k_cache"].shape)[-1] == 656 and "uint8" in str(args["k_cache"].dtype)
    out = c.ref["latent_out"].astype(np.float32).astype(ml_dtypes.bfloat16)
    lse = np.ascontiguousarray(np.transpose(c.ref["lse"], (0, 2, 1)).astype(np.float32))
    lse[np.isneginf(lse)] = np.inf
    qkmla.audit(c, out=out, softmax_lse=lse, layout="flashmla").assert_pass()
    # The sink also folded into lse (log(exp(lse) + exp(s_h))): FAIL.
    s = c.inputs["attn_sink"].astype(np.float64)
    finite = np.isfinite(lse)
    folded = np.where(finite, np.logaddexp(lse, s[None, :, None]), lse).astype(np.float32)
    assert not qkmla.audit(c, out=out, softmax_lse=folded, layout="flashmla").passed
