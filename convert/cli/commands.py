"""The explicit list of commands (one line each)."""

from dsv4_convert.cli.convert_cmds import mxfp4_to_marlin, nvfp4_to_marlin
from dsv4_convert.cli.doctor import doctor
from dsv4_convert.cli.inspect import inspect
from dsv4_convert.cli.plan import plan
from dsv4_convert.cli.reverse_cmd import marlin_to_source
from dsv4_convert.cli.synth import synth
from dsv4_convert.cli.validate import validate

ALL = [inspect, nvfp4_to_marlin, mxfp4_to_marlin, validate, plan, marlin_to_source, synth, doctor]
