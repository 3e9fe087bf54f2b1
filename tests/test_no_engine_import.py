"""Importing dsv4_convert (and the plugin entry-point modules) must never import an engine."""

import importlib.util
import subprocess
import sys

ENGINES = ("vllm", "sglang")


def test_import_dsv4_convert_imports_no_engine():
    code = (
        "import sys\n"
        "import dsv4_convert, dsv4_convert.formats.marlin, dsv4_convert.serving, dsv4_convert.serving.config\n"
        "import dsv4_convert.serving.sglang_plugin, dsv4_convert.serving.vllm_plugin\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {ENGINES!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_register_without_engine_does_nothing():
    from dsv4_convert.serving import sglang_plugin, vllm_plugin

    for engine, plugin in (("sglang", sglang_plugin), ("vllm", vllm_plugin)):
        if importlib.util.find_spec(engine) is None:
            assert plugin.register() is False
