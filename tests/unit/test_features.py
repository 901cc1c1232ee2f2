"""Choice of the delay mechanism: auto follows the kernel; a forced netem without netem is refused."""

import pytest

from testbed.errors import FeatureError
from testbed.net.features import resolve_delay_mechanism


@pytest.mark.parametrize(
    "requested, netem_ok, chosen",
    [
        ("auto", True, "netem"),
        ("auto", False, "nfqueue"),
        ("netem", True, "netem"),
        ("nfqueue", True, "nfqueue"),
        ("nfqueue", False, "nfqueue"),
    ],
)
def test_resolve(requested, netem_ok, chosen):
    assert resolve_delay_mechanism(requested, netem_ok) == chosen


def test_forced_netem_without_netem_names_the_fix():
    with pytest.raises(FeatureError) as e:
        resolve_delay_mechanism("netem", netem_ok=False)
    assert "--delay-mechanism nfqueue" in str(e.value)


def test_unknown_mechanism():
    with pytest.raises(FeatureError) as e:
        resolve_delay_mechanism("tbf", netem_ok=True)
    assert "'tbf'" in str(e.value) and "nfqueue" in str(e.value)
