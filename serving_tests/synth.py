"""Synthetic DeepSeek-V4-style expert tensors (source and converted) shared by the engine tests.

Until `dsv4-convert synth` / `nvfp4-to-marlin` are available, the converted tensors are produced per
projection with the project's own codecs, exactly as docs/FORMAT.md describes the converter output.
Engine-independent: imports torch and dsv4_convert.formats only.
"""

from __future__ import annotations

import torch

from dsv4_convert.core.targets.engines import FORMAT_VERSION, QUANT_METHOD, engine_facts
from dsv4_convert.core.targets.target import MarlinTarget
from dsv4_convert.formats.marlin import mxfp4_to_marlin, nvfp4_to_marlin
from dsv4_convert.formats.marlin.scales import nvfp4_global_to_marlin, vllm_rescale_factor
from dsv4_convert.formats.tiles import GROUP_SIZE, LAYOUT_CANDIDATES

__all__ = ["CONTAINER", "converted_experts", "quant_config", "rescale_factors", "source_experts"]

CONTAINER = "layers.0.ffn.experts"
PROJ = ("w1", "w2", "w3")  # gate, down, up (DeepSeek names)


def _proj_shape(proj: str, hidden: int, inter: int) -> tuple[int, int]:
    return (hidden, inter) if proj == "w2" else (inter, hidden)  # (N, K)


def source_experts(
    fmt: str, *, experts: int, hidden: int, inter: int, seed: int = 0, small_scales_for: tuple[int, ...] = ()
) -> dict[str, torch.Tensor]:
    """Unconverted tensors named as in the checkpoint. MXFP4 uses DeepSeek-V4's own names (`.weight`
    int8, `.scale` E8M0); NVFP4 uses ModelOpt's (`.weight` uint8, `.weight_scale` E4M3,
    `.weight_scale_2`, `.input_scale`). Experts in `small_scales_for` get block scales < 224 so that
    vLLM's bf16 rescale factor depends on which experts a rank holds (the EP case)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for e in range(experts):
        for p in PROJ:
            n, k = _proj_shape(p, hidden, inter)
            name = f"{CONTAINER}.{e}.{p}"
            packed = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
            if fmt == "mxfp4":
                out[f"{name}.weight"] = packed.view(torch.int8)
                out[f"{name}.scale"] = torch.randint(
                    110, 140, (n, k // 32), generator=g, dtype=torch.uint8
                ).view(torch.float8_e8m0fnu)
            else:
                top = 100.0 if e in small_scales_for else 448.0
                s = torch.rand((n, k // 16), generator=g) * top + 2**-5
                out[f"{name}.weight"] = packed
                out[f"{name}.weight_scale"] = s.to(torch.float8_e4m3fn)
                # gate and up share the global (as ModelOpt exports them); down has its own
                gval = 0.01 * (1 + e) if p != "w2" else 0.02 * (1 + e)
                out[f"{name}.weight_scale_2"] = torch.tensor(gval, dtype=torch.float32)
                out[f"{name}.input_scale"] = torch.tensor(0.5, dtype=torch.float32)
    return out


def rescale_factors(src: dict[str, torch.Tensor], target: MarlinTarget, experts: range) -> dict[str, float]:
    """vLLM's factor per stack over the given experts (all of them, as the converter records it)."""
    if target.engine != "vllm" or f"{CONTAINER}.0.w1.weight_scale" not in src:  # MXFP4: no factor
        return {f"{CONTAINER}.w13": 1.0, f"{CONTAINER}.w2": 1.0}
    w13 = [src[f"{CONTAINER}.{e}.{p}.weight_scale"] for e in experts for p in ("w1", "w3")]
    w2 = [src[f"{CONTAINER}.{e}.w2.weight_scale"] for e in experts]
    return {
        f"{CONTAINER}.w13": vllm_rescale_factor(w13, target.act_dtype),
        f"{CONTAINER}.w2": vllm_rescale_factor(w2, target.act_dtype),
    }


def converted_experts(
    src: dict[str, torch.Tensor], fmt: str, target: MarlinTarget, *, experts: int
) -> dict[str, torch.Tensor]:
    """The converter's per-projection output (docs/FORMAT.md) for `src`."""
    out = {}
    sfs = rescale_factors(src, target, range(experts)) if fmt == "nvfp4" else {}
    for e in range(experts):
        for p in PROJ:
            name = f"{CONTAINER}.{e}.{p}"
            if fmt == "mxfp4":
                q, s = mxfp4_to_marlin(src[f"{name}.weight"], src[f"{name}.scale"], target=target)
                out[f"{name}.weight"], out[f"{name}.weight_scale"] = q, s
                continue
            sf = sfs[f"{CONTAINER}.{'w2' if p == 'w2' else 'w13'}"]
            q, s = nvfp4_to_marlin(src[f"{name}.weight"], src[f"{name}.weight_scale"], target=target, sf=sf)
            gm = nvfp4_global_to_marlin(
                src[f"{name}.weight_scale_2"], fp32_global=target.fp32_global, act_dtype=target.act_dtype, sf=sf
            )
            out[f"{name}.weight"], out[f"{name}.weight_scale"] = q, s
            out[f"{name}.weight_global_scale"] = gm.reshape(())
            out[f"{name}.weight_scale_2"] = src[f"{name}.weight_scale_2"]
            out[f"{name}.input_scale"] = src[f"{name}.input_scale"]
    return out


def quant_config(
    fmt: str, target: MarlinTarget, *, rescale: dict[str, float] | None = None, original: dict | None = None
) -> dict:
    """The `quantization_config` block the converter writes (docs/FORMAT.md)."""
    return {
        "quant_method": QUANT_METHOD,
        "format_version": FORMAT_VERSION,
        "producer": {"name": "dsv4-convert", "version": "0.1.0"},
        "marlin_layout": target.layout_tag,
        "target_engine": target.engine,
        "target_engine_version": target.engine_version,
        "act_dtype": target.act_dtype,
        "w4a8": target.w4a8,
        "source_format": f"{fmt}-synthetic",
        "model_type": "deepseek_v4",  # what the converter records from config.json (the engines key on it)
        "weight_format": fmt,
        "group_size": GROUP_SIZE[fmt],
        "layouts": [{"tp": tp, "ep": ep} for tp, ep in LAYOUT_CANDIDATES],
        "experts": {CONTAINER: fmt},
        "packed_modules": [f"{CONTAINER}.*.w1", f"{CONTAINER}.*.w2", f"{CONTAINER}.*.w3"],
        "rescale_factors": rescale or {},
        "original_quantization_config": original or DSV4_FP8,
        "original_hf_quant_config": None,
    }


# DeepSeek-V4's own block (the FP8 parts of the model are served by the engine's method built from it)
DSV4_FP8 = {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128],
}
__all__.append("DSV4_FP8")


# --- real converter output ------------------------------------------------------------------------


class _ConverterProcess:
    """One CLI process for the session (tests/helpers/cli_batch.py --serve: `main(argv)` a command line, as the
    console script runs it): the suites write a hundred replicas, and a fresh interpreter each paid 1-2 s of
    start-up (torch's import) for 0.1 s of work. Started on first use, in this process's environment."""

    def __init__(self):
        self.proc = self.batch = None

    def __call__(self, args: list[str]) -> tuple[int, str]:
        import importlib.util
        import json
        import subprocess
        import sys
        from pathlib import Path

        if self.proc is None or self.proc.poll() is not None:
            # the script, and its answer marker, from its one home (the suites run without the tests package)
            spec = importlib.util.spec_from_file_location(
                "cli_batch", Path(__file__).resolve().parents[1] / "tests" / "helpers" / "cli_batch.py")
            self.batch = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(self.batch)
            self.proc = subprocess.Popen([sys.executable, self.batch.__file__, "--serve"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True)
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(self.batch.RESULT):  # an answer; other lines are not
                answer = json.loads(line[len(self.batch.RESULT):])
                return answer["code"], answer["stderr"] + (answer["crash"] or "")
        raise AssertionError(f"the converter process ended (exit {self.proc.wait()}) on {args}")


_converter_process = _ConverterProcess()


def run_converter(*args) -> None:
    """`dsv4-convert ARGS`, which must succeed: in the session's converter process, or by $DSV4_CONVERT_CLI (another
    checkout's `dsv4-convert`, say) where that is set."""
    import os
    import subprocess

    args = [str(a) for a in args]
    if os.environ.get("DSV4_CONVERT_CLI"):
        proc = subprocess.run([os.environ["DSV4_CONVERT_CLI"], *args], capture_output=True, text=True)
        code, stderr = proc.returncode, proc.stderr
    else:
        code, stderr = _converter_process(args)
    if code != 0:
        raise AssertionError(f"dsv4-convert {' '.join(args)} exited {code}:\n{stderr}")


def make_checkpoints(tmp, fmt: str, *, engine: str, act_dtype: str, experts: int, hidden: int, inter: int,
                     tp: int | None = None, ep: int | None = None, source: str | None = None):
    """`dsv4-convert synth` + `dsv4-convert {fmt}-to-marlin [--tp --ep]` (run_converter).
    `source` is synth's --format (default: the DeepSeek-V4 one of `fmt`). Returns (source dir, converted dir)."""
    from pathlib import Path

    shape = "" if (hidden, inter) == (256, 256) else f"-{hidden}x{inter}"
    split = "" if tp is None else f"-tp{tp}ep{ep or 1}"
    source = source or ("mxfp4-dsv4" if fmt == "mxfp4" else "nvfp4-modelopt-dsv4")
    src, out = Path(tmp, f"src-{source}{shape}"), Path(tmp, f"conv-{source}{shape}-{engine}-{act_dtype}{split}")
    if not src.exists():
        run_converter("synth", src, "--format", source, "--layers", 1, "--experts", experts, "--hidden", hidden,
                      "--intermediate", inter, "--shards", 2)
    if out.exists():
        return str(src), str(out)
    run_converter(f"{fmt}-to-marlin", src, out, "--target", engine, "--act-dtype", act_dtype, "--workers", 1,
                  *([] if tp is None else ["--tp", tp, "--ep", ep or 1]))
    return str(src), str(out)


def load_checkpoint_experts(path: str, container: str = CONTAINER) -> tuple[dict, dict]:
    """(tensors of `container` read from the checkpoint's shards, its config.json quantization_config)."""
    import json
    from pathlib import Path

    from safetensors import safe_open

    tensors = {}
    for shard in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
                if name.startswith(container + "."):
                    tensors[name] = f.get_tensor(name)
    config = json.loads(Path(path, "config.json").read_text())
    return tensors, config.get("quantization_config", {})


# --- padded per-rank layout (`--tp/--ep`, ROUND3 contract / docs/FORMAT.md) -----------------------
# Built with the project's codecs until the converter's `--tp/--ep` is available; `padded_experts` and
# `tp_layout` are the only two functions to switch to the real CLI output.


def tp_layout(fmt: str, engine: str, *, hidden: int, inter: int, tp: int, ep: int, experts: int | None = None):
    """The `tp_layout` record the converter writes for `--tp tp --ep ep`."""
    from dsv4_convert.formats.tiles import moe_rank_tiles

    v = moe_rank_tiles(fmt, engine_facts(engine).padding, hidden=hidden, intermediate=inter, tp=tp, ep=ep, experts=experts)
    assert v.servable, v.reason
    return {"tp": tp, "ep": ep, "containers": {CONTAINER: {
        "hidden": hidden, "intermediate": inter, "i_shard": v.i_shard, "i_pad": v.i_pad, "h_pad": v.h_pad,
        "status": v.status}}}


def padded_experts(src: dict[str, torch.Tensor], fmt: str, target: MarlinTarget, layout: dict, *, experts: int,
                   proj_names=None) -> dict[str, torch.Tensor]:
    """The converter's padded output: per projection, the per-rank blocks (rank r's source slice zero-padded
    to (i_pad, h_pad), then the codec) concatenated in rank order (w1/w3 along Marlin N, w2 along K).
    NVFP4 globals as in `converted_experts` (per-stack sf over all experts; the plugin re-derives per rank)."""
    c = layout["containers"][CONTAINER]
    m = layout["tp"] // layout["ep"]
    i_s, i_pad, h_pad = c["i_shard"], c["i_pad"], c["h_pad"]
    sfs = rescale_factors(src, target, range(experts)) if fmt == "nvfp4" else {}
    scale_key = "scale" if fmt == "mxfp4" else "weight_scale"
    out = {}
    for e in range(experts):
        for p in PROJ:
            name = f"{CONTAINER}.{e}.{p}"
            w, s = src[f"{name}.weight"], src[f"{name}.{scale_key}"]
            g = GROUP_SIZE[fmt]
            blocks = []
            for r in range(m):
                if p == "w2":  # N = H, K = I: rank r's source columns
                    wr, sr = w[:, r * i_s // 2:(r + 1) * i_s // 2], s[:, r * i_s // g:(r + 1) * i_s // g]
                    n_pad, k_pad = h_pad, i_pad
                else:  # N = I, K = H: rank r's source rows
                    wr, sr = w[r * i_s:(r + 1) * i_s], s[r * i_s:(r + 1) * i_s]
                    n_pad, k_pad = i_pad, h_pad
                if fmt == "mxfp4":
                    blocks.append(mxfp4_to_marlin(wr, sr, target=target, n_pad=n_pad, k_pad=k_pad))
                else:
                    sf = sfs[f"{CONTAINER}.{'w2' if p == 'w2' else 'w13'}"]
                    blocks.append(nvfp4_to_marlin(wr, sr, target=target, sf=sf, n_pad=n_pad, k_pad=k_pad))
            dim = 0 if p == "w2" else 1  # Marlin [K/16, 2N] and scales [K/g, N]
            qs = [q for q, _ in blocks]
            if target.w4a8 and dim == 1:  # W4A8: N-tiles are whole only in the [K/32, 4N] view
                out[f"{name}.weight"] = torch.cat([q.reshape(q.shape[0] // 2, -1) for q in qs], 1).reshape(
                    qs[0].shape[0], -1)
            else:
                out[f"{name}.weight"] = torch.cat(qs, dim)
            out[f"{name}.weight_scale"] = torch.cat([sc for _, sc in blocks], dim)
            if fmt == "nvfp4":
                sf = sfs[f"{CONTAINER}.{'w2' if p == 'w2' else 'w13'}"]
                gm = nvfp4_global_to_marlin(src[f"{name}.weight_scale_2"], fp32_global=target.fp32_global,
                                            act_dtype=target.act_dtype, sf=sf)
                out[f"{name}.weight_global_scale"] = gm.reshape(())
                out[f"{name}.weight_scale_2"] = src[f"{name}.weight_scale_2"]
                out[f"{name}.input_scale"] = src[f"{name}.input_scale"]
    return out
