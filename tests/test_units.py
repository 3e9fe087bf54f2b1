"""core/units.py: the sizes every command prints. Expected strings are written out by hand from the
definition (binary units, three significant digits), not computed by the code under test."""

import pytest

from dsv4_convert.core.units import human_rate, human_size


@pytest.mark.parametrize("nbytes,text", [
    (0, "0 B"), (1, "1 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (7680, "7.50 KiB"),
    (12.25 * 2**20, "12.2 MiB"), (300 * 2**20, "300 MiB"), (1.5 * 2**30, "1.50 GiB"), (3 * 2**40, "3.00 TiB"),
])
def test_a_size_reads_in_its_own_unit(nbytes, text):
    assert human_size(nbytes) == text


def test_a_small_conversion_never_reads_as_zero_gib():
    assert human_size(200 * 2**10) == "200 KiB"
    assert human_rate(200 * 2**10, 0.5) == "400 KiB/s"


def test_a_run_too_short_to_time_says_so():
    assert human_rate(10, 0.0) == "too fast to time"
