import inspect

from dsv4_convert.validate import checks
from dsv4_convert.validate.check import Check, Severity
from dsv4_convert.validate.checks import ALL_CHECKS


def test_ids_are_unique_and_dotted():
    ids = [c.id for c in ALL_CHECKS]
    assert len(ids) == len(set(ids))
    assert all("." in i and i == i.lower() and " " not in i for i in ids)


def test_every_check_module_member_is_listed():
    listed = {id(c) for c in ALL_CHECKS}
    for mod in (checks.structure, checks.tiles, checks.quant_config, checks.nvfp4_scales, checks.mxfp4_scales,
                checks.globals, checks.numerics, checks.marlin_layout, checks.against, checks.gemm, checks.kernel):
        for name, obj in inspect.getmembers(mod, lambda o: isinstance(o, Check)):
            if obj.fn.__module__ == mod.__name__:
                assert id(obj) in listed, f"{mod.__name__}.{name} is not in ALL_CHECKS"


def test_every_check_says_why_and_how_to_fix():
    for c in ALL_CHECKS:
        assert c.why and c.hint and isinstance(c.severity, Severity), c.id
