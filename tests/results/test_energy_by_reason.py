"""scripts/energy_by_reason.py: rows, the excess against a fixed clock, bad flags."""

from __future__ import annotations

from collections import Counter

import pytest

from scripts.energy_by_reason import Spent, main, merge, row_of, table


def test_low_clock_epochs_share_one_row_and_warm_up_is_kept_apart() -> None:
    assert row_of("hold", 825, 1000) == "≤ 1000 MHz"
    assert row_of("warmup-context", 975, 1000) == "≤ 1000 MHz (warm-up)"
    assert row_of("context-high", 1785, 1000) == "context-high"
    assert row_of("", None, 1000) == "(none)"


def test_excess_is_the_energy_beyond_the_fixed_clocks_cost_per_token() -> None:
    """At the fixed clock's 2 J/token, 1 MJ for 100k tokens costs 0.8 MJ more and
    0.1 MJ for 100k tokens 0.1 MJ less; the largest excess comes first."""
    fixed = Spent(Counter({"fixed": 2e6}), Counter({"fixed": 1_000_000}), 5e6)
    policy = Spent(
        Counter({"low": 0.1e6, "context-high": 1e6}),
        Counter({"low": 100_000, "context-high": 100_000}),
        5.5e6,
    )
    rows = table(policy, fixed, "fixed:900")
    assert rows[2].startswith("| context-high |") and rows[2].endswith("| +0.800 |")
    assert rows[3].startswith("| low |") and rows[3].endswith("| -0.100 |")
    assert rows[-1].endswith("| +0.500 |")


def test_merge_sums_runs() -> None:
    a = Spent(Counter({"x": 1.0}), Counter({"x": 2}), 3.0)
    b = Spent(Counter({"x": 4.0, "y": 1.0}), Counter({"x": 1}), 5.0)
    assert merge([a, b]) == Spent(Counter({"x": 5.0, "y": 1.0}), Counter({"x": 3}), 8.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--against", "kairos"], "fixed clock"),
        (["--policy", "kairos[no_such=1]"], "no_such"),
        (["--seeds", "0"], "--seeds"),
        (["--think-cap-s", "0"], "--think-cap-s"),
    ],
)
def test_bad_flags_exit_2_naming_the_problem(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
