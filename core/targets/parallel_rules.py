"""The divisibility rules an engine applies to a model's config.json at a tensor-parallel size, beside the
engine table (core/targets/engines.py): a split that breaks one is refused at launch, so `plan`, SERVING.md's
launch line and `--tp/--ep` never offer it. The experts' own rule is the tile rule (formats/tiles.py,
`moe_rank_tiles`, which also asks that EP divide the expert count); these are the rest of the model.

Where each rule lives in the engines (vLLM 0.34.0, SGLang 0.5.23; the same rules in both unless noted):
  attention heads   vLLM config/model.py `verify_with_parallel_config`: "Total number of attention heads (...)
                    must be divisible by tensor parallel size"; SGLang asserts `total_num_heads % attn_tp_size
                    == 0` in each model (qwen3_moe.py, deepseek_v2.py, llama.py, ...)
  KV heads          QKVParallelLinear (vLLM layers/linear.py, SGLang layers/linear.py): `divide(tp, kv)` when
                    TP >= the KV heads, else `divide(kv, tp)`: one must divide the other. MLA models (a
                    `kv_lora_rank`) have no QKV projection: their latent KV is replicated
  linear attention  Qwen3-Next / Qwen3.5 gated delta-net: the key and value heads are split over TP (vLLM
                    qwen_gdn_linear_attn.py `divide(self.num_v_heads, self.tp_size)`, column-parallel key
                    heads; SGLang qwen3_next.py `num_k_heads // attn_tp_size`)
  KDA heads         GLM-5.3-Flash's KDA linear attention: `assert self.num_heads % self.tp_size == 0` (vLLM
                    models/glm5next/common/kda.py; SGLang glm5_next.py `assert self.num_heads % head_shard_size == 0`)
  Mamba-2 heads     Nemotron-H: `assert num_heads % self.tp_size == 0` (vLLM mamba_mixer2.py, SGLang
                    layers/attention/mamba/mamba.py)
  Mamba-2 groups    `assert (n_groups % self.tp_size) == 0 or n_groups == 1` (the same two files); SGLang's
                    config reads `mamba_n_groups` (default 8), vLLM `n_groups`
"""

from __future__ import annotations

from dataclasses import dataclass

from .engines import ENGINES, engine_facts

__all__ = ["SPLIT_RULES", "SplitRule", "split_dims", "split_refusals"]


@dataclass(frozen=True, slots=True)
class SplitRule:
    what: str  # what the engine splits, for messages
    keys: tuple[str, ...]  # the config.json keys every engine reads (first present wins)
    check: str  # "divides": value % TP == 0; "either": value % TP == 0 or TP % value == 0;
    #             "divides_or_one": value % TP == 0 or value == 1
    default: int | None = None  # the engine's default when no key is present (None: the rule does not apply)
    unless: str | None = None  # a config key whose presence switches the rule off (MLA: kv_lora_rank)
    engine_key: str | None = None  # an EngineFacts field naming the key instead, where the engines differ

    def keys_of(self, engine: str) -> tuple[str, ...]:
        return (getattr(engine_facts(engine), self.engine_key),) if self.engine_key else self.keys

    def value(self, config: dict, engine: str) -> int | None:
        for c in (config.get("text_config") or {}, config):  # a multimodal config's text model wins
            if not isinstance(c, dict) or (self.unless and c.get(self.unless) is not None):
                continue
            for k in self.keys_of(engine):
                v = c.get(k)
                if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    return v
        every = {k for e in ENGINES for k in self.keys_of(e)}  # the model has the part when some engine's key is there
        return self.default if _has_any(config, every) else None

    def holds(self, value: int, tp: int) -> bool:
        if self.check == "either":
            return value % tp == 0 or tp % value == 0
        if self.check == "divides_or_one":
            return value % tp == 0 or value == 1
        return value % tp == 0


def _has_any(config: dict, keys: set[str]) -> bool:
    return any(isinstance(c, dict) and keys & set(c) for c in (config.get("text_config"), config))


SPLIT_RULES = (
    SplitRule("attention heads", ("num_attention_heads", "n_heads"), "divides"),
    SplitRule("KV heads", ("num_key_value_heads",), "either", unless="kv_lora_rank"),
    SplitRule("linear-attention key heads", ("linear_num_key_heads",), "divides"),
    SplitRule("linear-attention value heads", ("linear_num_value_heads",), "divides"),
    SplitRule("KDA heads", ("linear_num_heads",), "divides"),
    SplitRule("Mamba-2 heads", ("mamba_num_heads",), "divides"),
    SplitRule("Mamba-2 groups", (), "divides_or_one", default=8, engine_key="mamba_groups_key"),
)


def split_dims(config: dict, engine: str) -> dict[str, int]:
    """What each rule reads from this config for `engine`: {"attention heads": 4, "KV heads": 1, ...}."""
    out = {}
    for rule in SPLIT_RULES:
        v = rule.value(config, engine) if isinstance(config, dict) else None
        if v is not None:
            out[rule.what] = v
    return out


def split_refusals(dims: dict[str, int], tp: int) -> list[str]:
    """Why the engine refuses TP `tp` for a model of these `split_dims` (empty: it accepts it)."""
    out = []
    for rule in SPLIT_RULES:
        v = dims.get(rule.what)
        if v is not None and not rule.holds(v, tp):
            need = {"divides": "TP must divide them", "either": "TP and their count must divide one another",
                    "divides_or_one": "TP must divide them (or there must be 1)"}[rule.check]
            out.append(f"{v} {rule.what}: {need}")
    return out
