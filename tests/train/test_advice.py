"""The closing hint: said when a run's rounds took a large share of its time with a codec that sends
more than int4's bytes, and only then."""
from p2plearn.options import Options
from p2plearn.train.advice import COMM_SHARE, closing_hint
from p2plearn.train.stats import TrainingStats


def stats(comm_s: float, compute_s: float, rounds: int = 10) -> TrainingStats:
    return TrainingStats(rounds=rounds, comm_s=comm_s, compute_s=compute_s)


def test_a_communication_bound_uncompressed_run_is_told_of_int4():
    line = closing_hint(Options(compress="none"), stats(comm_s=6.0, compute_s=4.0))
    assert line is not None
    assert "60% of rank 0's time" in line and "--compress none" in line and "--compress int4" in line


def test_fp16_is_told_too_int4_is_not():
    assert closing_hint(Options(compress="fp16"), stats(6.0, 4.0)) is not None
    assert closing_hint(Options(compress="int4"), stats(6.0, 4.0)) is None


def test_nothing_is_said_below_the_share_or_without_rounds():
    below = COMM_SHARE * 0.9
    assert closing_hint(Options(compress="none"), stats(comm_s=below, compute_s=1.0 - below)) is None
    assert closing_hint(Options(compress="none"), stats(comm_s=0.0, compute_s=0.0, rounds=0)) is None
    at = COMM_SHARE
    assert closing_hint(Options(compress="none"), stats(comm_s=at, compute_s=1.0 - at)) is not None


def test_the_value_filter_picks_its_own_values_and_is_left_alone():
    assert closing_hint(Options(filter="value"), stats(6.0, 4.0)) is None
