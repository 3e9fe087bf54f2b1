"""The converter, `plan`, validate's structure.tile.tp and the serving plugins' config check give the same
tile verdict for every shape of a grid, and that verdict is the one an independent reading of
docs/spec/MARLIN_FP4.md §2 gives (written out below without formats/tiles.py).

Substitutions: checkpoints are built in memory from headers (TensorRefs, no tensor data): every
caller under test decides from shapes alone, and a grid of 128 real-size checkpoints would be tens
of GB. Real-size end-to-end CLI runs are in tests/convert/test_real_shapes.py.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from dsv4_convert.convert.plan import build_plan
from dsv4_convert.core.checkpoint.tensor_model import Checkpoint, Projection, Quant, Role, TensorRef
from dsv4_convert.core.errors import ContentError
from dsv4_convert.core.sources.source_formats import FORMATS
from dsv4_convert.core.targets.engines import ENGINES
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.tiles import IMPOSSIBLE, LAYOUT_CANDIDATES, OK, PAD, moe_rank_tiles
from dsv4_convert.planner.launch import make_plan, shape_from_checkpoint
from dsv4_convert.serving.config import PluginConfigError, check_rank_shape
from dsv4_convert.validate.check import Severity
from dsv4_convert.validate.checks.tiles import tile_rules_per_rank
from dsv4_convert.validate.inputs import CheckpointInput, Options

SIZES = (256, 512, 1536, 2048, 2304, 2880, 4096, 7168)
EXPERTS = 8


def _up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def reference(fmt: str, engine: str, h: int, i: int, tp: int, ep: int) -> str:
    """docs/spec/MARLIN_FP4.md §2 read independently: the kernel rule for w13 [2I, H] and w2 [H, I] reduces to
    I % 64 == 0, H % 64 == 0 and (H % 128 == 0 or I % 128 == 0); then each engine's create_weights rounding."""
    if tp % ep or EXPERTS % ep or i % (tp // ep):
        return IMPOSSIBLE
    i_s = i // (tp // ep)
    if i_s % (16 if fmt == "nvfp4" else 32):
        return IMPOSSIBLE

    def kernel(a: int, b: int) -> bool:
        return a % 64 == 0 and b % 64 == 0 and (b % 128 == 0 or a % 128 == 0)

    if engine == "sglang" and fmt == "nvfp4":
        return OK if kernel(i_s, h) else IMPOSSIBLE
    if fmt == "mxfp4":
        i_p, h_p = _up(i_s, 128), _up(h, 256)
    else:
        i_p, h_p = _up(i_s, 64 if h % 128 == 0 else 128), h
    if (i_p, h_p) == (i_s, h) and kernel(i_s, h):
        return OK
    return PAD if kernel(i_p, h_p) else IMPOSSIBLE


def _checkpoint(fmt: str, h: int, i: int) -> Checkpoint:
    quant = Quant(fmt)
    g = quant.group_size
    tensors, projections = {}, []
    for e, (role, w) in itertools.product(range(EXPERTS), ((Role.GATE, "w1"), (Role.UP, "w3"), (Role.DOWN, "w2"))):
        n, k = (h, i) if role is Role.DOWN else (i, h)
        key = f"layers.0.ffn.experts.{e}.{w}"
        wt = TensorRef(f"{key}.weight", "model.safetensors", "U8", (n, k // 2), 0, n * k // 2)
        sc = TensorRef(f"{key}.weight_scale", "model.safetensors", "F8_E4M3" if fmt == "nvfp4" else "F8_E8M0",
                       (n, k // g), 0, n * k // g)
        gl = TensorRef(f"{key}.weight_scale_2", "model.safetensors", "F32", (), 0, 4) if fmt == "nvfp4" else None
        for t in (wt, sc, gl):
            if t is not None:
                tensors[t.name] = t
        projections.append(Projection(key, "0", e, role, quant, n, k, wt, sc, global_scale=gl))
    config = {"hidden_size": h, "moe_intermediate_size": i, "n_routed_experts": EXPERTS, "num_hidden_layers": 1}
    fmt_enum = FORMATS["nvfp4-modelopt-dsv4"] if fmt == "nvfp4" else FORMATS["mxfp4-dsv4"]
    return Checkpoint(Path(f"grid-{fmt}-{h}-{i}"), fmt_enum, config, None, tensors, tuple(projections))


def _validate_verdict(ckpt: Checkpoint, engine: str, tp: int, ep: int) -> str:
    c = CheckpointInput(str(ckpt.root), Options(target=MarlinTarget(engine=engine), tp=tp, ep=ep), ckpt, None, None, {}, (),
                        config=ckpt.config)
    findings = list(tile_rules_per_rank(c, c.options))
    if not findings:
        return OK
    return PAD if all(f.severity is Severity.WARNING for f in findings) else IMPOSSIBLE


def _plugin_ok(fmt: str, engine: str, h: int, i: int, tp: int, ep: int) -> bool:
    try:
        check_rank_shape(fmt, engine, intermediate=i, hidden=h, tp_size=tp // ep, ep_size=ep)
    except PluginConfigError:
        return False
    return True


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_every_caller_agrees_on_the_grid(fmt, engine):
    target = MarlinTarget(engine=engine)
    for h, i in itertools.product(SIZES, SIZES):
        ckpt = _checkpoint(fmt, h, i)
        expected = {(tp, ep): reference(fmt, engine, h, i, tp, ep) for tp, ep in LAYOUT_CANDIDATES}
        where = f"{fmt} {engine} H={h} I={i}"
        # the rule itself
        for (tp, ep), want in expected.items():
            assert moe_rank_tiles(fmt, ENGINES[engine].padding, hidden=h, intermediate=i, tp=tp, ep=ep, experts=EXPERTS).status \
                == want, f"{where} TP {tp} EP {ep}"
        # the converter: converts when some layout is unpadded, records exactly those, else refuses
        unpadded = tuple(tp_ep for tp_ep, v in expected.items() if v == OK)
        if unpadded:
            assert build_plan(ckpt, target).layouts == unpadded, where
        else:
            with pytest.raises(ContentError) as e:
                build_plan(ckpt, target)
            assert e.value.error_id == "convert.needs_padding", where
        # plan, validate and the plugin, layout by layout
        plan = make_plan(shape_from_checkpoint(ckpt), gpus=8, gpu_mem_gib=1e6, engine=engine)
        by = {(c.tp, c.ep): c.tiles.status for c in plan.candidates}
        for (tp, ep), want in expected.items():
            at = f"{where} TP {tp} EP {ep}"
            assert by[(tp, ep)] == want, at
            assert _validate_verdict(ckpt, engine, tp, ep) == want, at
            assert _plugin_ok(fmt, engine, h, i, tp, ep) == (want == OK), at


def test_named_cases_from_the_issue():
    # gpt-oss-20b: vLLM pads I 2880 -> 2944 and H -> 3072; nothing works unpadded on either engine
    v = moe_rank_tiles("mxfp4", ENGINES["vllm"].padding, hidden=2880, intermediate=2880)
    assert (v.status, v.i_pad, v.h_pad) == (PAD, 2944, 3072)
    assert reference("mxfp4", "sglang", 2880, 2880, 8, 8) == PAD
    # H=4096, I=1536 MXFP4 at TP 8: 192 per rank is rounded to 256 (plan used to call it valid)
    assert moe_rank_tiles("mxfp4", ENGINES["vllm"].padding, hidden=4096, intermediate=1536, tp=8).status == PAD
    # DeepSeek-V4-Flash: every layout in {1, 2, 4, 8} works unpadded
    assert all(reference(f, e, 4096, 2048, tp, ep) == OK for f in ("nvfp4", "mxfp4") for e in ("vllm", "sglang")
               for tp, ep in LAYOUT_CANDIDATES)
    # DSV4 with I=256 at TP 8: 32 per rank; NVFP4 can be padded by vLLM only, MXFP4 by both
    assert reference("nvfp4", "vllm", 4096, 256, 8, 1) == PAD
    assert reference("nvfp4", "sglang", 4096, 256, 8, 1) == IMPOSSIBLE


def test_every_engine_has_a_padding_rule_for_every_fp4_format():
    """The engine table (core/targets/engines.py) holds the padding numbers and hands them to formats/tiles.py as
    values: a rule (or an explicit None) for every FP4 format, named after its engine."""
    from dsv4_convert.formats.tiles import GROUP_SIZE
    for name, facts in ENGINES.items():
        assert facts.padding.name == name
        assert set(facts.padding.rules) == set(GROUP_SIZE)
