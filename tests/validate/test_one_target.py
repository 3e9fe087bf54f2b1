"""Issue 38 item 2: validate carries the converter's one target object (core/targets/target.py MarlinTarget),
never the engine, activation dtype and W4A8 as loose fields rebuilt per projection. Read from the dataclasses
themselves; the last test shows the walk failing on a made-up dataclass. No substitutions."""

from __future__ import annotations

import dataclasses
import types

from dsv4_convert.core.checkpoint.tensor_model import Quant
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.validate import inputs

LOOSE = {"engine", "act_dtype", "w4a8"}  # MarlinTarget's own fields


def loose_fields(module) -> dict[str, set[str]]:
    """dataclass name -> the target fields it carries loose (beside or instead of a MarlinTarget), over the
    dataclasses `module` defines (not those it imports: RankTiles' `engine` is the padding's owner)."""
    return {name: found for name, obj in vars(module).items()
            if dataclasses.is_dataclass(obj) and isinstance(obj, type) and obj.__module__ == module.__name__
            and (found := LOOSE & {f.name for f in dataclasses.fields(obj)})}


def test_validates_inputs_carry_one_target_object():
    assert loose_fields(inputs) == {}
    for cls in (inputs.Options, inputs.MarlinTensors, inputs.GemmCase):
        assert {f.name: f.type for f in dataclasses.fields(cls)}["target"] in (MarlinTarget, "MarlinTarget")


def test_the_target_as_it_applies_to_a_projection():
    w4a8 = MarlinTarget("vllm", "bfloat16", True)
    assert w4a8.for_quant(Quant.MXFP4) is w4a8  # the common case builds nothing
    assert w4a8.for_quant(Quant.NVFP4) == MarlinTarget("vllm", "bfloat16", False)  # no W4A8 NVFP4 Marlin
    plain = MarlinTarget("sglang", "float16")
    assert plain.for_quant(Quant.NVFP4) is plain


def test_the_walk_finds_a_made_up_loose_field():
    made_up = types.ModuleType("made_up")
    made_up.Case = dataclasses.make_dataclass("Case", [("engine", str), ("target", MarlinTarget)])
    made_up.Case.__module__ = "made_up"
    assert loose_fields(made_up) == {"Case": {"engine"}}
