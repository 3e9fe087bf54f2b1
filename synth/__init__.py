"""`synth`: small but structurally real checkpoints in every source format the table writes, with injectable
defects, the model-family replicas (`--family`) and a real-size MoE layer for benchmarks. The writer is
synth/writer.py; this package exports what the CLI and the tests call."""

from .writer import DEFECT_NAMES, REAL_SIZE, SYNTH_FAMILIES, SYNTH_FORMATS, write_synthetic_checkpoint

__all__ = ["DEFECT_NAMES", "REAL_SIZE", "SYNTH_FAMILIES", "SYNTH_FORMATS", "write_synthetic_checkpoint"]
