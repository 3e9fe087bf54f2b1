"""expert_parser (one regular expression for a list of schemes, core/sources/naming.py) reads every name as a loop over
the schemes' own patterns does: the first scheme, in the list's order, whose pattern matches wins. Names: the
fuzz vocabulary of tests/core/test_name_fuzz.py (real-looking and malformed spellings), every combination with
a few indices; scheme lists: the whole table, each layout, each scheme alone, the table reversed.
No substitutions."""

from __future__ import annotations

import itertools

import pytest

from dsv4_convert.core.sources.naming import PER_EXPERT, SCHEMES, STACKED, ExpertName, expert_parser, parse_expert_name
from tests.core.test_name_fuzz import LEAVES, MIDDLES, MODULES, NUMBERS, PREFIXES, REAL, SUFFIXES


def _loop(name: str, schemes) -> ExpertName | None:
    """The reference: each scheme's own anchored pattern, in order."""
    for s in schemes:
        m = s.pattern.match(name)
        if m is None:
            continue
        layer = f"mtp.{m['layer']}" if m["lp"] == "mtp" else m["layer"]
        if s.layout == PER_EXPERT:
            return ExpertName(s, m["prefix"], layer, int(m["expert"]), m["proj"], m["part"])
        return ExpertName(s, m["prefix"], layer, None, m["proj"], s.tails[m["part"] or ""])
    return None


def _names() -> list[str]:
    out = list(REAL)
    for i, parts in enumerate(itertools.product(PREFIXES, MIDDLES, MODULES, LEAVES, SUFFIXES)):
        n, e = (("3", "7"), ("0", "007"), ("x", "1"), ("3", NUMBERS[3]))[i % 4]
        out.append("".join(parts).replace("{n}", n).replace("{e}", e))
    for sch in SCHEMES:  # every scheme's own spellings, and each one with a part cut or added
        for lp, role in itertools.product(sch.layer_prefixes, sch.roles):
            base = f"{lp}.4.{sch.module}" + (f".12.{role}." if sch.layout == PER_EXPERT else f".{role}")
            for part in (*sch.tails, "weight", "weight_scale_2", ""):
                out += [base + part, base + part + "_x", base[:-1] + part]
    return out[::3]


NAMES = _names()
LISTS = {"table": SCHEMES, "per-expert": tuple(s for s in SCHEMES if s.layout == PER_EXPERT),
         "stacked": tuple(s for s in SCHEMES if s.layout == STACKED), "reversed": SCHEMES[::-1],
         "deepseek": SCHEMES[:1], "llama4-stacked": SCHEMES[-1:]}


@pytest.mark.parametrize("which", list(LISTS))
def test_one_expression_reads_names_as_the_loop_over_schemes(which):
    schemes = LISTS[which]
    parse = expert_parser(schemes)
    parsed = 0
    for name in NAMES:
        want = _loop(name, schemes)
        assert parse(name) == want, name
        assert parse_expert_name(name, iter(schemes)) == want, name
        parsed += want is not None
    assert parsed  # the test cannot pass by reading nothing
    if which == "table":
        assert {p.scheme.name for n in NAMES if (p := _loop(n, schemes))} == {s.name for s in SCHEMES}


def test_a_scheme_from_outside_the_table_is_read_too():
    from dataclasses import replace
    other = replace(SCHEMES[0], name="other", layer_prefixes=("blocks",))
    assert parse_expert_name("blocks.2.ffn.experts.5.w3.weight", [other]).scheme is other
    assert parse_expert_name("blocks.2.ffn.experts.5.w3.weight") is None


def test_where_two_schemes_spell_a_name_the_first_in_the_list_wins():
    """The table's schemes spell disjoint names; schemes that overlap must still read as the loop does."""
    from dataclasses import replace
    a = replace(SCHEMES[0], name="a")
    b = replace(SCHEMES[0], name="b", layer_prefixes=("mtp", "layers"))
    for name in ("layers.1.ffn.experts.2.w1.weight", "mtp.0.ffn.experts.2.w3.scale"):
        assert expert_parser((a, b))(name).scheme is a and expert_parser((b, a))(name).scheme is b
        assert expert_parser((a, b))(name) == _loop(name, (a, b)) and expert_parser((b, a))(name) == _loop(name, (b, a))
