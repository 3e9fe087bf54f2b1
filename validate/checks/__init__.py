"""Every check, in report order: one explicit tuple (tests assert the ids are unique)."""

from . import (
    against,
    against_tensors,
    coverage,
    gemm,
    globals,
    integrity,
    kernel,
    marlin_layout,
    mxfp4_scales,
    numerics,
    nvfp4_scales,
    quant_config,
    serving,
    structure,
    tiles,
)

__all__ = ["ALL_CHECKS", "BY_ID"]

ALL_CHECKS = (
    # structure: index, headers, experts, shapes, config (headers only)
    structure.shard_headers,
    structure.shard_truncated,
    structure.index_missing_file,
    structure.index_keys,
    structure.index_extra_file,
    structure.reader_refused,
    structure.experts_empty,
    structure.experts_missing,
    structure.experts_extra,
    structure.expert_dims,
    structure.experts_scheme,
    structure.head_present,
    structure.experts_input_scale,
    structure.dtype_shape,
    structure.k_alignment,
    tiles.tile_rules_per_rank,
    quant_config.group_size_matches,
    quant_config.quantized_layers_match,
    quant_config.moe_quant_algo_matches,
    quant_config.experts_method,
    quant_config.exclusions_cover,
    quant_config.mxfp4_act_dtype,
    quant_config.marlin_config,
    quant_config.marlin_dtype_shape,
    serving.stale_quant_block,
    serving.engine_config_keys,
    serving.inner_method_resolves,
    serving.w4a8_releases,
    # numerics, per projection / per expert
    nvfp4_scales.nan_scales,
    nvfp4_scales.negative_scales,
    nvfp4_scales.subnormal_scales,
    nvfp4_scales.zero_scales,
    globals.global_invalid,
    globals.input_scale_invalid,
    globals.global_range,
    globals.gate_up_mismatch,
    mxfp4_scales.nan_scale_bytes,
    mxfp4_scales.overflow_scale_bytes,
    mxfp4_scales.zero_scale_bytes,
    mxfp4_scales.w4a8_scale_range,
    numerics.dequant_nonfinite,
    numerics.all_zero_expert,
    # converted (Marlin) checkpoints
    integrity.manifest_verifies,
    marlin_layout.layout_weight,
    marlin_layout.layout_scale,
    marlin_layout.layout_global,
    marlin_layout.padding_zero,
    against.same_as_reference,
    against_tensors.non_expert_tensors_match,
    # sampled experts
    gemm.gemm_rel_error,
    # the engine's own kernels on this GPU (--kernel)
    kernel.kernel_gemm,
    kernel.kernel_repack,
    kernel.kernel_build,
    # what the run covered (after everything else)
    coverage.experts_checked,
    coverage.against_compared,
)

BY_ID = {c.id: c for c in ALL_CHECKS}
