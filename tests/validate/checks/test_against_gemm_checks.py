"""validate/checks/against.py (against.mismatch) and gemm.py (gemm.rel_error) on projections read
from real synthetic checkpoints with the production reader.

against: a copy with the `swapped-nibbles` defect against its clean twin (same seed, so every other
byte is equal). gemm: the source projection against the Marlin tensors the converter's codecs make
of it, and against Marlin tensors of another expert (the wrong weights). No substitutions.
"""

import pytest
import torch

from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin import nvfp4_to_marlin
from dsv4_convert.formats.marlin.scales import nvfp4_global_to_marlin
from dsv4_convert.validate.check import Severity
from dsv4_convert.validate.checks.against import same_as_reference
from dsv4_convert.validate.checks.gemm import gemm_rel_error
from dsv4_convert.validate.emulate import GEMM_REL_ERROR_MAX
from dsv4_convert.validate.inputs import GemmCase, Options
from tests.helpers.checks import loaded, on_disk, run, synth


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    base = tmp_path_factory.mktemp("twins")
    clean, _ = synth(base / "clean")
    bad, (rec,) = synth(base / "bad", defects=["swapped-nibbles"])
    return clean, bad, rec


def _projections(root):
    return {p.key: p for p in on_disk(root).checkpoint.projections}


def test_identical_projections_pass(twins):
    clean, bad, rec = twins
    ref, got = _projections(clean), _projections(bad)
    for key, p in got.items():
        if p.weight.name not in rec["tensors"]:
            assert run(same_as_reference, (loaded(bad, p), loaded(clean, ref[key]))) == []


def test_swapped_nibbles_are_found_and_named(twins):
    clean, bad, rec = twins
    (name,) = rec["tensors"]
    key = name.removesuffix(".weight")
    p = _projections(bad)[key]
    (f,) = run(same_as_reference, (loaded(bad, p), loaded(clean, _projections(clean)[key])))
    assert same_as_reference.severity_of(f) is Severity.ERROR
    assert (f.tensor, f.layer, f.expert) == (name, rec["layer"], rec["expert"])
    assert f.cause.startswith("swapped nibbles") and "Likely cause: swapped nibbles" in f.message


def _case(src, marlin_of, opts: Options) -> GemmCase:
    t = opts.target.for_quant(src.quant)
    q, s = nvfp4_to_marlin(marlin_of.weight, marlin_of.scale, target=t)
    g = nvfp4_global_to_marlin(marlin_of.global_scale.float().reshape(()), fp32_global=t.fp32_global, act_dtype=t.act_dtype)
    return GemmCase(src, q, s, g, t, 1.0, file=src.file)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_gemm_of_the_converted_projection_passes(twins, engine):
    clean = twins[0]
    p = next(iter(_projections(clean).values()))
    src = loaded(clean, p)
    case = _case(src, src, Options(target=MarlinTarget(engine=engine)))
    assert run(gemm_rel_error, case) == [] and case.errors[0] <= GEMM_REL_ERROR_MAX


def test_gemm_with_another_experts_weights_is_an_error_naming_the_tensor(twins):
    clean = twins[0]
    projs = [p for p in _projections(clean).values() if p.role.value == "gate"]
    src, other = loaded(clean, projs[0]), loaded(clean, projs[1])
    assert not torch.equal(src.weight, other.weight)
    (f,) = run(gemm_rel_error, _case(src, other, Options()))
    assert gemm_rel_error.severity_of(f) is Severity.ERROR
    assert (f.tensor, f.layer, f.expert) == (projs[0].weight.name, projs[0].layer, projs[0].expert)
    assert f.value > GEMM_REL_ERROR_MAX and f"threshold {GEMM_REL_ERROR_MAX:g}" in f.message
