"""dsv4-convert: offline, verified repacking of FP4 MoE checkpoints into Marlin tile order."""

__version__ = "0.1.0"
