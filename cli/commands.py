"""The explicit list of commands (one line each): name -> the module and object that define it, and the
one-line summary the top-level `--help` lists.

main() imports only the module of the command being run, never all of them: the top-level `--help`,
`--version` and a mistyped name are answered from this list alone. Importing a command module can cost
seconds (validate's and doctor's need torch, the converters numba), so this list is what keeps
`dsv4-convert --help` instant. The summaries live here only: load() gives each command its own."""

from importlib import import_module

ALL = [  # workflow order, as `dsv4-convert --help` lists them
    ("inspect", "dsv4_convert.cli.inspect", "inspect",
     "Show what a checkpoint holds (format, layers, experts, bytes)."),
    ("nvfp4-to-marlin", "dsv4_convert.cli.convert_cmds", "nvfp4_to_marlin",
     "Repack NVFP4 experts into Marlin tile order."),
    ("mxfp4-to-marlin", "dsv4_convert.cli.convert_cmds", "mxfp4_to_marlin",
     "Repack MXFP4 experts into Marlin tile order."),
    ("validate", "dsv4_convert.cli.validate", "validate",
     "Check a checkpoint before you launch it."),
    ("plan", "dsv4_convert.cli.plan_cmd", "plan",
     "Which TP/EP splits fit, memory per GPU, the flags to launch with."),
    ("marlin-to-source", "dsv4_convert.cli.reverse_cmd", "marlin_to_source",
     "Rebuild the original checkpoint from a converted one."),
    ("synth", "dsv4_convert.cli.synth", "synth",
     "Write a small but structurally real checkpoint (for tests and demos)."),
    ("doctor", "dsv4_convert.cli.doctor", "doctor",
     "Check the launch machine: GPUs, torch/CUDA, engines, plugins."),
]

NAMES = [name for name, *_ in ALL]
SUMMARIES = [(name, summary) for name, _, _, summary in ALL]


def load(name: str):
    """The click command `name` (its module imported now), or None when there is no such command."""
    for command_name, module, attr, summary in ALL:
        if command_name == name:
            command = getattr(import_module(module), attr)
            command.short_help = summary
            return command
    return None
