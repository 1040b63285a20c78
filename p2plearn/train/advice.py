"""The closing hint: rank 0 says, once at the end, when a run's own figures show that the setting the
measurements favour would likely have reached its target sooner.

The rule reads what a run measures about itself: the share of its time spent in rounds (``comm_s``
against ``compute_s``) and the codec it sent. `--compress int4` reached the target soonest of the
codecs on every network measured, with either round kind (README, "Choosing settings"): where a run's
rounds took at least ``COMM_SHARE`` of its time with another codec, fewer bytes per round would
likely shorten it. Below that share rounds are the cheap part, a codec changes little, and nothing
is said; `--filter value` picks its own values and is left alone. Tune ``COMM_SHARE`` from the
rounds' share in ``opt.stats()`` of runs where int4 did and did not pay.
"""
from __future__ import annotations

from p2plearn.options import Options
from p2plearn.train.stats import TrainingStats

COMM_SHARE = 0.25
FAVOURED_CODEC = "int4"


def closing_hint(options: Options, stats: TrainingStats) -> str | None:
    """One line for a run whose rounds took a large share of its time with a codec that sends more
    bytes than the favoured one, or None."""
    busy = stats.comm_s + stats.compute_s
    if stats.rounds == 0 or busy <= 0 or stats.comm_s / busy < COMM_SHARE:
        return None
    if options.compress == FAVOURED_CODEC or options.filter != "none":
        return None
    return (f"p2plearn: rounds took {stats.comm_s / busy:.0%} of rank 0's time (comm {stats.comm_s:.1f} s / "
            f"compute {stats.compute_s:.1f} s) with --compress {options.compress}: --compress {FAVOURED_CODEC} (a "
            f"seventh of the bytes) would likely reach a target sooner (README: Choosing settings)")
