"""SGLang 0.5.23 fuses the shared expert of DeepSeek-V3 / R1 and GLM-5.x into the routed FusedMoE (one more expert)
by default where the release has 256 routed experts and one shared expert, on sm_80 and newer
(deepseek_v2.py DeepseekV2ForCausalLM.shared_experts_fusion_disable_reason). A conversion holds only the routed
experts in Marlin order, so the plugin's config must make SGLang keep the shared expert apart, as the differential
proofs (whose replicas have 8 experts: no fusion) built it. SGLang's own gate is asked with the plugin's own config
and a real config of the releases' sizes; its first question is the quantisation's, before any device check.

No substitutions: SGLang's classes and transformers' config classes are the real ones; the plugin's config is
built by its real from_config (serving_tests/synth.py's block)."""

from __future__ import annotations

import pytest
from common import installed_engine

import synth
from dsv4_convert.core.targets.target import MarlinTarget

if installed_engine() != "sglang":
    pytest.skip("SGLang only", allow_module_level=True)

QUANT_REASON = "Quantization keeps shared experts at a higher precision than the routed experts"


@pytest.mark.parametrize("arch", ["DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM"])
def test_sglang_keeps_the_shared_expert_out_of_the_marlin_experts(arch):
    from sglang.srt.layers.quantization import get_quantization_config
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM
    from sglang.srt.models.glm4_moe import GlmMoeDsaForCausalLM
    from transformers import DeepseekV3Config

    from dsv4_convert.serving import sglang_plugin

    sglang_plugin.register()
    cfg = get_quantization_config("marlin_fp4").from_config(synth.quant_config("nvfp4", MarlinTarget(engine="sglang")))
    model = {"DeepseekV3ForCausalLM": DeepseekV3ForCausalLM, "GlmMoeDsaForCausalLM": GlmMoeDsaForCausalLM}[arch]
    hf_config = DeepseekV3Config(n_routed_experts=256, n_shared_experts=1, architectures=[arch])
    reason = model.shared_experts_fusion_disable_reason(hf_config, cfg)
    assert reason is not None and reason.startswith(QUANT_REASON), reason
