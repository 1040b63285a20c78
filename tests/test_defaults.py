"""The defaults are the setting that the stored measurements found soonest to a target.

The candidates are the rows that ``experiments/time_to_accuracy.py`` (4 peers on three testbed
networks) and ``experiments/defaults_sim.py`` (64 peers steady and bursty, 256 steady, in virtual
time) both ran: BSP with SELMCAST p=1 and partitioned rounds, each with no compression, fp16 and int4,
all at period 16. Per network a setting's time is the median over its seeds, a seed that never reached
the target counted as the slowest (the results files' rule), divided by that network's soonest; the
default must have the smallest geometric mean of those ratios and the smallest worst one, on every
network but EXCEPTION, where the README says partitioned int4 was sooner. Re-running either
experiment re-checks the choice and the exception.
"""
import csv
import math
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from p2plearn.options import Options, OptionsError

RESULTS = Path(__file__).resolve().parent.parent / "experiments" / "results"
TESTBED = RESULTS / "time_to_accuracy.csv"
VIRTUAL = [RESULTS / "defaults_sim.csv", RESULTS / "defaults_sim_256.csv"]
TESTBED_TARGET = "tta_0.6"
# BSP rounds with SELMCAST p=1 reached the target (50%) on 1 seed of 3 there, partitioned rounds on all.
EXCEPTION = "256 peers (virtual)"


def measured_times() -> dict[str, dict[tuple[str, str], list[float]]]:
    """network -> (sync, codec) -> time to target per seed (inf: never reached; failed runs left out)."""
    times: dict[str, dict[tuple[str, str], list[float]]] = defaultdict(lambda: defaultdict(list))
    with open(TESTBED) as f:
        for row in csv.DictReader(f):
            if row["system"] != "p2plearn":
                continue
            settings = row["settings"]
            assert settings.startswith(("bsp, selmcast p=1, period 16", "partitioned (full average), period 16"))
            codec = settings.split("compress ")[1] if "compress " in settings else "none"
            sync = "partitioned" if settings.startswith("partitioned") else "bsp"
            if row["ok"] == "True":
                times[row["topology"]][(sync, codec)].append(reached(row[TESTBED_TARGET]))
    for path in VIRTUAL:
        with open(path) as f:
            for row in csv.DictReader(f):
                sync = "partitioned" if row["setting"] == "partitioned" else "bsp"
                network = f"{row['peers']} peers{', bursts' if row['bursts'] == 'True' else ''} (virtual)"
                if row["ok"] == "True":
                    times[network][(sync, row["compress"])].append(reached(row["tta_s"]))
    return times


def reached(text: str) -> float:
    """A stored time to target: nan or empty (the run never reached it) as inf."""
    time = float(text or "nan")
    return math.inf if math.isnan(time) else time


def medians() -> dict[str, dict[tuple[str, str], float]]:
    """network -> (sync, codec) -> median time to target over the seeds."""
    return {network: {s: statistics.median(seeds) for s, seeds in settings.items()}
            for network, settings in measured_times().items()}


def ratios_to_the_soonest() -> dict[tuple[str, str], list[float]]:
    """(sync, codec) -> its median / the soonest median, per network but EXCEPTION."""
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    for network, median in medians().items():
        if network != EXCEPTION:
            for setting, time in median.items():
                ratios[setting].append(time / min(median.values()))
    return ratios


def test_every_candidate_ran_on_all_six_networks():
    ratios = ratios_to_the_soonest()
    assert set(ratios) == {(sync, codec) for sync in ("bsp", "partitioned") for codec in ("none", "fp16", "int4")}
    assert all(len(r) == 5 for r in ratios.values()), ratios
    assert len(medians()) == 6 and all(len(settings) == 6 for settings in medians().values())


def test_the_defaults_are_the_soonest_setting_measured():
    defaults = Options()
    assert (defaults.selection, defaults.fanout, defaults.period) == ("selmcast", 1, 16)  # the rows measured
    ratios = ratios_to_the_soonest()
    by_geomean = min(ratios, key=lambda s: math.prod(ratios[s]) ** (1 / len(ratios[s])))
    by_worst = min(ratios, key=lambda s: max(ratios[s]))
    assert (defaults.sync, defaults.compress) == by_geomean == by_worst, dict(ratios)


def test_at_256_peers_partitioned_int4_was_sooner_and_the_defaults_mostly_missed():
    """The exception the README states: re-measuring 256 peers re-checks it."""
    median = medians()[EXCEPTION]
    assert min(median, key=median.get) == ("partitioned", "int4"), median
    assert median[("bsp", "int4")] == math.inf, median


def test_a_value_filter_defaults_to_uncompressed_messages():
    assert Options(filter="value").compress == "none"
    assert Options().replace(filter="value").compress == "none"
    with pytest.raises(OptionsError, match="--compress: does not apply with --filter value"):
        Options(filter="value", compress="int4")  # given, not defaulted: refused as before
