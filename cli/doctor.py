"""`dsv4-convert doctor [PATH]`: can this machine serve the checkpoint? (docs/DOCTOR.md)

Reports the GPUs, torch and CUDA, each engine package installed (the engine table's `packages`) against
the layout the checkpoint was converted for and the versions the plugin was verified with, the installed
release's Marlin kernels as the table says it ships them (cli/doctor_kernels.py): a prebuilt extension's
machine code (SASS) for this GPU or only PTX (vLLM #40923: PTX-only Marlin MoE kernels gave silently wrong
output on sm_120), or a JIT's toolkit, tools and target (SGLang 0.5.23), and the MoE backend flag to force.
Imports no engine: versions come from package metadata, code from the libraries' fatbinaries; for a
converted checkpoint, each installed engine is asked (in a subprocess, serving/probe.py) to build its
quantisation config from the checkpoint, without loading weights.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import click

from ..core.targets.engines import ENGINES, LAYOUTS, EngineError, engine_inner_method, release_for, w4a8_problem
from ..runtime.settings import MARLIN_MODULE_ENV, settings
from .doctor_kernels import check_library, engine_kernels
from .report import emit, report_options

__all__ = ["doctor"]

@dataclass
class Doctor:
    gpus: list[dict] = field(default_factory=list)
    torch: dict = field(default_factory=dict)
    engines: dict = field(default_factory=dict)
    # engine -> what the installed version serves, from the engine table: {"release", "w4a8"} or {"error"}
    releases: dict = field(default_factory=dict)
    extensions: list[dict] = field(default_factory=list)
    jit: list[dict] = field(default_factory=list)  # an engine that compiles its Marlin kernels on first use
    checkpoint: dict | None = None
    recommended: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0


def _gpus(d: Doctor) -> None:
    import torch
    d.torch = {"version": torch.__version__, "cuda": torch.version.cuda,
               "cuda_available": bool(torch.cuda.is_available()), "threads": torch.get_num_threads()}
    if not torch.cuda.is_available():
        d.findings.append("no CUDA GPU is usable here (" + ("this torch has no CUDA" if torch.version.cuda is None
                                                            else "none visible") + "): this machine cannot serve")
        return
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        d.gpus.append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}", "sm": 10 * p.major + p.minor,
                       "memory_gib": round(p.total_memory / 2**30, 1)})


def _engines(d: Doctor, extra_module: str | None) -> None:
    """Each package of each engine (the engine table's `packages`: distribution, import name, extensions)."""
    for facts, pkg in ((f, p) for f in ENGINES.values() for p in f.packages):
        name = pkg.module
        try:
            v = version(pkg.dist)
        except PackageNotFoundError:
            d.engines[name] = None
            continue
        d.engines[name] = v
        if pkg is facts.packages[0]:
            try:
                rel = release_for(facts.name, v)
                d.releases[facts.name] = {"release": rel.key, "verified": rel.verified, "w4a8": rel.w4a8,
                                          "kernels": rel.kernels.build, "kernel_dist": rel.kernels.dist}
            except EngineError as e:
                d.releases[facts.name] = {"error": e.message}
                continue
            engine_kernels(d, f"{facts.display} {v}", pkg.module, rel.kernels)
    if extra_module:
        check_library(d, "module", Path(extra_module))


def _checkpoint(d: Doctor, path: str) -> None:
    from ..core.checkpoint.reader import open_checkpoint
    from ..core.checkpoint.source_location import resolve_source
    from ..core.record.converted_config import ConvertedConfigError, converted_record
    ckpt = open_checkpoint(resolve_source(path))
    info = {"path": path, "format": ckpt.format.value}
    engines, record = list(LAYOUTS), None
    if ckpt.format.converted:
        try:
            record = converted_record(ckpt.config)
        except ConvertedConfigError as e:
            record = None
            d.findings.append(f"{path}: {e.message}")
        info.update(layout=record and record.marlin_layout, act_dtype=record and record.act_dtype)
        engines = [record.marlin_layout] if record else []
    d.checkpoint = info
    _engine_config(d, path, ckpt, engines)
    served, installed = [], []
    for tag in engines:
        facts = LAYOUTS[tag]
        engine = facts.name
        v = d.engines.get(facts.packages[0].module)
        d.recommended.append(f"{engine}: {facts.moe_backend_flag}")
        if v is None:
            continue
        installed.append(engine)
        try:
            rel = release_for(engine, v)
        except EngineError as e:  # no release of the table covers it: the plugin was never checked there
            d.findings.append(f"{e.message}; {e.hint}")
            continue
        served.append(engine)
        info.setdefault("releases", {})[engine] = rel.key
        if record is not None and record.w4a8 and (why := w4a8_problem(engine, v)):
            d.findings.append(f"{engine} {v}: {why}")
        elif v != rel.verified:
            d.findings.append(f"{engine} {v} is installed; release {rel.key} was verified byte for byte on "
                              f"{rel.verified}: run `dsv4-convert validate {path} --kernel` before serving")
    if not installed:
        want = " or ".join(LAYOUTS[t].name for t in engines) or "an engine"
        d.findings.append(f"{path} needs {want}, which is not installed here")
    if ckpt.format.converted:
        for engine in served:
            if record is not None:
                _ask_engine(d, path, engine, record, ckpt.config)


def _engine_config(d: Doctor, path: str, ckpt, layouts: list) -> None:
    """A config.json the engine cannot build the model from (core/targets/engine_config.py) fails the source and any
    conversion of it alike: said here, whether or not the engine is installed."""
    from ..core.targets.engine_config import fix_hint, source_load_refusal

    for engine in dict.fromkeys(LAYOUTS[t].name for t in layouts):
        if why := source_load_refusal(ckpt.config, engine, ckpt.tensors):
            d.findings.append(f"{path}: {engine} cannot build or load this model: {why}; "
                              f"{fix_hint(ckpt.config, engine, ckpt.tensors)}")


def _ask_engine(d: Doctor, path: str, engine: str, spec, config: dict) -> None:
    """The installed engine builds the plugin's config from config.json, and inside it its own config for
    the non-expert layers (serving/probe.py, in a subprocess: doctor imports no engine). It must succeed
    and agree with validate's pre-flight (marlin.serving_methods)."""
    import json
    import subprocess

    from ..core.record.converted_config import serving_block
    from ..core.targets.served import engine_key, refusal

    proc = subprocess.run([sys.executable, "-m", "dsv4_convert.serving.probe", path, engine],
                          capture_output=True, text=True)
    try:
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        answer = {"engine": engine, "error": (proc.stderr.strip().splitlines() or ["no answer"])[-1]}
    d.checkpoint.setdefault("engine_probe", []).append(answer)
    if "error" in answer:
        d.findings.append(f"{engine} cannot build this checkpoint's quantisation config: {answer['error']}")
        return
    predicted = engine_inner_method(engine, serving_block(spec), spec.source_model_type)
    why = answer["inner_method"] and refusal(config, spec.source_format or "unknown",
                                              engine_key(engine, answer["version"]), serving_block(spec),
                                              method=answer["inner_method"])
    if why:
        d.findings.append(f"{engine} {answer['version']} serves the non-expert layers of this {spec.source_model_type} "
                          f"checkpoint with {answer['inner_method']!r}, and the plugin is not proven there: {why} "
                          "(`dsv4-convert validate` names the cause: marlin.serving_methods)")
    elif answer["inner_method"] != predicted:
        d.findings.append(f"{engine} {answer['version']} resolves the source's block to {answer['inner_method']!r}; "
                          f"validate's pre-flight expects {predicted!r} (this version's engine facts): serving is "
                          "not proven for this engine version")


def _render(d: Doctor) -> str:
    t = d.torch
    lines = [f"torch       {t.get('version')} (CUDA {t.get('cuda') or 'none'})"]
    lines += [f"GPU {g['index']}       {g['name']}, sm_{g['sm']}, {g['memory_gib']} GiB" for g in d.gpus] or \
             ["GPU         none"]
    for name, v in d.engines.items():
        r = d.releases.get(name) or {}
        what = (f" (release {r['release']}: W4A16{', W4A8' if r['w4a8'] else ', no W4A8'})" if "release" in r else
                f" ({r['error']})" if "error" in r else "")
        lines.append(f"{name:<11} {v or 'not installed'}{what}")
    for j in d.jit:
        tk = j["toolkit"]
        lines.append(f"  {j['engine']}: Marlin kernels JIT-compiled on first use; nvcc "
                     f"{tk['nvcc_version'] or 'not found'} at {tk['cuda_home']} ({tk['found_by']}); "
                     + ", ".join(f"{k} {'yes' if ok else 'MISSING'}" for k, ok in j["needs"].items()))
        lines.append("  targets: " + ", ".join(f"sm_{t['sm']} -> {t['target']}" + ("" if t["gpu"] is not None
                                                                                   else " (no GPU here)")
                                               for t in j["targets"]))
        lines.append(f"  built in {j['cache']}: {len(j['built'])}" + ("" if j["built"] else
                                                                     " (the first server start compiles them)"))
    for x in d.extensions:
        code = x.get("error") or f"SASS {x['sass']}, PTX {x['ptx']}; " + ", ".join(x.get("verdict") or ["no GPU"])
        lines.append(f"  {Path(x['library']).name}: {code}")
    if d.checkpoint:
        c = d.checkpoint
        lines.append(f"checkpoint  {c['path']}: {c['format']}" + (f", layout {c['layout']}, {c['act_dtype']}"
                                                                  if c.get("layout") else ""))
        for a in c.get("engine_probe", []):
            lines.append(f"  {a['engine']} builds: " + (a["error"] if "error" in a else
                                                       f"{a['config']} with {a['inner']} ({a['inner_method']})"))
    for r in d.recommended:
        lines.append(f"flag        {r}")
    lines.append("")
    lines += [f"finding: {f}" for f in d.findings] or ["ready: nothing found"]
    return "\n".join(lines)


@click.command(help="Check the launch machine: GPUs, torch/CUDA, installed engines and their versions against the "
                    "checkpoint's layout, and whether the engines' Marlin kernels have machine code (SASS) for "
                    "this GPU or only PTX (see docs/DOCTOR.md).\n\n\b\nExamples:\n  dsv4-convert doctor\n"
                    "  dsv4-convert doctor ./dsv4-marlin --json\n\n\b\nExit codes: 0 ready, 1 findings (no CUDA GPU "
                    "is one), 2 doctor cannot run (bad arguments, unreadable PATH).")
@click.argument("path", required=False)
@click.option("--kernel-module", metavar="PATH", default=None,
              help=f"also read this Marlin extension's fatbinary [default: ${MARLIN_MODULE_ENV} if set]")
@report_options
def doctor(path, kernel_module, as_json, report_file, quiet):
    if path is not None and not os.path.exists(path):
        raise click.BadParameter(f"{path} does not exist", param_hint="PATH")
    d = Doctor()
    _gpus(d)
    _engines(d, kernel_module or settings().marlin_module)
    if path is not None:
        _checkpoint(d, path)  # an unreadable PATH: main() answers (exit 2 for doctor, its JSON object)
    emit(asdict(d), _render(d), as_json=as_json, report_file=report_file, quiet=False, exit_code=d.exit_code)
    sys.exit(d.exit_code)
