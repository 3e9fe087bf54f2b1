"""Tensor-name and dtype facts of the expert formats (docs/spec/CHECKPOINT_FORMATS.md §3-§7), shared by
format detection and grouping."""

from __future__ import annotations

import re

from dsv4_convert.core.tensor_model import Role, TensorRef

__all__ = ["DS_NAME", "HF_NAME", "GPTOSS_NAME", "ROLES", "ROLE_ORDER", "PACKED", "E8M0", "logical_k"]

# `layers.3.ffn.experts.17.w1.weight`, `mtp.0.ffn.experts.5.w2.scale`
DS_NAME = re.compile(r"^(?P<prefix>(?:layers\.(?P<layer>\d+)|mtp\.(?P<mtp>\d+))\.ffn\.experts\.(?P<expert>\d+)"
                     r"\.(?P<proj>w[123]))\.(?P<suffix>[A-Za-z0-9_]+)$")
# `model.layers.3.mlp.experts.17.gate_proj.weight`
HF_NAME = re.compile(r"^(?P<prefix>model\.layers\.(?P<layer>\d+)\.mlp\.experts\.(?P<expert>\d+)"
                     r"\.(?P<proj>gate_proj|up_proj|down_proj))\.(?P<suffix>[A-Za-z0-9_]+)$")
# gpt-oss: `model.layers.3.mlp.experts.gate_up_proj_blocks`
GPTOSS_NAME = re.compile(r"^model\.layers\.(?P<layer>\d+)\.mlp\.experts\.(?P<proj>gate_up_proj|down_proj)"
                         r"_(?P<kind>blocks|scales)$")
ROLES = {"w1": Role.GATE, "w3": Role.UP, "w2": Role.DOWN,
         "gate_proj": Role.GATE, "up_proj": Role.UP, "down_proj": Role.DOWN}
ROLE_ORDER = {Role.GATE: 0, Role.UP: 1, Role.DOWN: 2}
PACKED = {"I8", "U8", "F4"}           # packed E2M1 codes
E8M0 = {"F8_E8M0", "U8"}              # E8M0 scale bytes (compressed-tensors stores them as U8)


def logical_k(weight: TensorRef) -> int:
    return weight.shape[-1] if weight.dtype == "F4" else 2 * weight.shape[-1]
