"""The explicit list of commands (one line each): name -> the module and object that define it.

main() imports only the module of the command being run (all of them for the top-level --help or an
unknown name): the converters' modules need no torch, and torch alone costs ~3 s of start-up here."""

from importlib import import_module

ALL = [  # workflow order, as `dsv4-convert --help` lists them
    ("inspect", "dsv4_convert.cli.inspect", "inspect"),
    ("nvfp4-to-marlin", "dsv4_convert.cli.convert_cmds", "nvfp4_to_marlin"),
    ("mxfp4-to-marlin", "dsv4_convert.cli.convert_cmds", "mxfp4_to_marlin"),
    ("validate", "dsv4_convert.cli.validate", "validate"),
    ("plan", "dsv4_convert.cli.plan_cmd", "plan"),
    ("marlin-to-source", "dsv4_convert.cli.reverse_cmd", "marlin_to_source"),
    ("synth", "dsv4_convert.cli.synth", "synth"),
    ("doctor", "dsv4_convert.cli.doctor", "doctor"),
]


def load(name: str | None = None) -> list:
    """The click command `name`, or every command when `name` is None or not a command."""
    wanted = [c for c in ALL if c[0] == name] or ALL
    return [getattr(import_module(module), attr) for _, module, attr in wanted]
