"""The SGLang launch command dsv4-convert prints (core/targets/engines.py launch_command: `plan`, SERVING.md and the
plugin's wrong-split message) is parsed by SGLang 0.5.23's own server-argument parser, with abbreviations
turned off so that only the flag names SGLang declares are accepted (a bare `--tp` passes argparse only
as a prefix of `--tp-size`, which a later SGLang flag could make ambiguous).

No substitutions: SGLang's real `ServerArgs.add_cli_args` builds the parser; nothing is launched.
"""

from __future__ import annotations

import argparse
import shlex

import pytest
from sglang.srt.server_args import ServerArgs

from dsv4_convert.core.targets.engines import launch_command


@pytest.mark.parametrize("tp, ep", [(1, 1), (2, 1), (8, 8), (4, 2)])
def test_sglang_accepts_the_printed_launch_command(tp, ep):
    argv = shlex.split(launch_command("sglang", "/ckpt", tp=tp, ep=ep, act_dtype="bfloat16", memory=0.85))
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    parser = argparse.ArgumentParser(allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv[3:])
    assert (args.model_path, args.tp_size, args.ep_size) == ("/ckpt", tp, ep)
    assert args.moe_runner_backend == "marlin" and args.dtype == "bfloat16" and args.mem_fraction_static == 0.85
