"""Optional per-layer picture: findings per (layer, expert) and the GEMM spot-check error."""

from __future__ import annotations

import math

from ..core.checkpoint.index import natural_key
from ..core.errors import OutputError
from ..core.version import install_command
from ..runtime.side_files import write_side_file
from .check import Severity

__all__ = ["plot_report"]


def plot_report(report, path: str) -> str:
    """Write a PNG heat map; returns a one-line note (also when matplotlib is missing)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"note: --plot skipped: matplotlib is not installed ({install_command('plot')})"
    layers = sorted({str(r.finding.layer) for r in report.results if r.finding.layer is not None}
                    | {str(g["layer"]) for g in report.gemm}, key=natural_key)
    if not layers:
        return "note: --plot skipped: no per-layer findings or GEMM cases to draw"
    experts = 1 + max([r.finding.expert or 0 for r in report.results] + [g["expert"] for g in report.gemm])
    row = {layer: i for i, layer in enumerate(layers)}
    grid = [[0.0] * experts for _ in layers]
    for r in report.results:
        f = r.finding
        if f.layer is not None and f.expert is not None and report.severity(r) is not Severity.INFO:
            grid[row[str(f.layer)]][f.expert] += f.count
    gemm = [[float("nan")] * experts for _ in layers]
    for g in report.gemm:
        e = g["rel_error"] if g["rel_error"] is not None else float("inf")
        cur = gemm[row[str(g["layer"])]][g["expert"]]
        gemm[row[str(g["layer"])]][g["expert"]] = e if math.isnan(cur) else max(cur, e)
    fig, axes = plt.subplots(1, 2, figsize=(14, max(3, 0.25 * len(layers) + 2)))
    for ax, data, title in ((axes[0], grid, "findings (count)"), (axes[1], gemm, "GEMM relative error")):
        im = ax.imshow(data, aspect="auto", interpolation="nearest", cmap="magma")
        ax.set_title(title)
        ax.set_xlabel("expert")
        ax.set_ylabel("layer")
        ax.set_yticks(range(len(layers)), layers)
        fig.colorbar(im, ax=ax)
    fig.suptitle(f"dsv4-convert validate {report.path}")
    fig.tight_layout()
    try:  # PNG whatever the name ends with; written like every side file (runtime/side_files.py)
        real = write_side_file(path, "plot", lambda f: fig.savefig(f, format="png", dpi=100))
    except (ValueError, RuntimeError) as e:  # matplotlib's own refusals
        raise OutputError(f"cannot draw the plot {path}: {e}", error_id="plot.not_writable", file=str(path),
                          hint="choose a --plot FILE ending in .png") from None
    finally:
        plt.close(fig)
    return f"wrote {real}"
