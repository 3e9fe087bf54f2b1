"""Serving plugins for SGLang and vLLM that load a dsv4-convert Marlin checkpoint without repacking.

Importing this package imports no engine. The engine-specific modules (`sglang_plugin`,
`vllm_plugin`) are loaded by the engines themselves through their plugin entry points.
"""

__all__: list[str] = []
