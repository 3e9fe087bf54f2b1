"""The explicit list of commands (one line each)."""

from .convert_cmds import mxfp4_to_marlin, nvfp4_to_marlin
from .inspect import inspect
from .plan import plan
from .reverse_cmd import marlin_to_source
from .synth import synth
from .validate import validate

ALL = [inspect, nvfp4_to_marlin, mxfp4_to_marlin, validate, plan, marlin_to_source, synth]
