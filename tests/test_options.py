"""p2plearn.options: every option refuses the values that do not work, with one line naming the
flag, the value and where it came from (flag, environment or code)."""
from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

import p2plearn
from p2plearn.options import MAX_RANKS, Options, OptionsError, add_arguments

BIN = Path(sys.executable).parent

# (option, a value it cannot take, what the error says). Each was once taken and crashed a job
# (--fanout 1000000000000: OverflowError in both ranks' planners), or would have: inf passes a
# lower bound, nan every comparison.
REFUSED = [
    ("fanout", "1000000000000", "must be in 1..65535"),
    ("fanout", "0", "must be in 1..65535"),
    ("max_fanout", "65536", "must be in 0..65535"),
    ("max_fanin", "-1", "must be in 0..65535"),
    ("staleness", "101", "must be in 0..100"),
    ("staleness", "-1", "must be in 0..100"),
    ("period", "0", "must be >= 1"),
    ("loss_bound", "1", "must be in [0, 1)"),
    ("loss_bound", "nan", "must be a finite number"),
    ("deadline_ms", "0", "must be in (0, 86400000]"),
    ("deadline_ms", "1e10", "must be in (0, 86400000]"),
    ("outer_lr", "inf", "must be a finite number"),
    ("outer_lr", "2.5", "must be in (0, 2]"),
    ("outer_lr", "0", "must be in (0, 2]"),
    ("outer_momentum", "1", "must be in [0, 1)"),
    ("mixing_slack", "11", "must be in [0, 10]"),
    ("mcast_port", "70000", "must be in 1..65535"),
    ("mcast_ttl", "256", "must be in 1..255"),
    ("mcast_groups", "10.0.0.0/8", "must be a multicast range such as 239.77.0.0/16"),
    ("mcast_groups", "ff02::/16", "must be a multicast range such as 239.77.0.0/16"),
    ("filter_init_scale", "inf", "must be a finite number"),
    ("filter_period", "0", "must be >= 1"),
    ("heartbeat", "0", "must be in [0.01, 60]"),
    ("heartbeat", "1000", "must be in [0.01, 60]"),
    ("phi_threshold", "300", "must be in (0, 300)"),
    ("staleness", "1.5", "not a valid int"),
    ("overlap_steps", "-1", "must be in 0..1000000"),
    ("overlap_alpha", "0", "must be in (0, 1]"),
    ("overlap_alpha", "1.5", "must be in (0, 1]"),
]


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.mark.parametrize("name, raw, why", REFUSED)
def test_a_value_that_does_not_work_is_refused_from_the_environment(name, raw, why):
    variable = "P2PLEARN_" + name.upper()
    with pytest.raises(OptionsError) as error:
        Options.from_env({variable: raw})
    assert str(error.value) == f"{flag(name)}: {why} (got {raw!r} from {variable})"


@pytest.mark.parametrize("name, raw, why", REFUSED)
def test_a_value_that_does_not_work_is_refused_as_a_flag(name, raw, why, capsys):
    parser = add_arguments(argparse.ArgumentParser(prog="train.py"))
    with pytest.raises(SystemExit) as done:
        parser.parse_args([flag(name), raw])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"train.py: error: argument {flag(name)}: {why} (got {raw!r})"


def test_a_value_that_does_not_work_is_refused_from_code():
    for changes, message in [({"fanout": 1.5}, "--fanout: must be an integer (got 1.5)"),
                             ({"fanout": True}, "--fanout: must be an integer (got True)"),
                             ({"heartbeat": float("nan")}, "--heartbeat: must be a finite number (got nan)"),
                             ({"emulate": 1}, "--emulate: must be true or false (got 1)"),
                             ({"sync": "async"}, "--sync: must be one of bsp, ssp, partitioned (got 'async')"),
                             ({"fanout": MAX_RANKS}, "--fanout: must be in 1..65535 (got 65536)"),
                             ({"compress": "fp16", "filter": "value"}, "--compress: does not apply with --filter"),
                             ({"period": 8, "fragments": 2, "overlap_steps": 5},
                              "--overlap-steps: a round must land before the next one starts: at most "
                              "period/fragments = 4 (got 5)"),
                             ({"overlap_alpha": 0.5}, "--overlap-alpha: applies to overlapped rounds")]:
        with pytest.raises(OptionsError) as error:
            Options(**changes)
        assert str(error.value).startswith(message)


def test_overlap_steps_implies_overlap_and_survives_the_environment():
    options = Options(period=4, overlap_steps=2, overlap_alpha=0.5)
    assert options.overlap and Options.from_env(options.to_env()) == options
    assert Options(period=4, overlap_steps=4).overlap_steps == 4 and not Options().overlap


def test_the_ends_of_each_range_are_taken():
    ends = Options(fanout=MAX_RANKS - 1, max_fanout=MAX_RANKS - 1, max_fanin=0, staleness=100, period=1,
                   loss_bound=0.999, deadline_ms=86_400_000, outer_lr=2.0, outer_momentum=0.0, mixing_slack=10.0,
                   mcast_port=65535, mcast_ttl=255, mcast_groups="239.0.0.0/8", heartbeat=0.01, phi_threshold=299.9)
    assert Options.from_env(ends.to_env()) == ends
    assert Options(heartbeat=60, outer_lr=1e-9, mcast_port=1, mcast_ttl=1).heartbeat == 60


def test_every_number_has_a_range():
    """A new option is not left unchecked: each numeric option states the values that work."""
    for f in dataclasses.fields(Options):
        if f.type.replace(" | None", "") in ("int", "float"):
            assert f.metadata["valid"], f"{f.name}: no range"


def test_init_refuses_an_option_from_the_launchers_environment_before_connecting():
    # what an mpirun user's `-x P2PLEARN_FANOUT=...` gives every rank: refused before any socket opens
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "P2PLEARN_FANOUT": "1000000000000"}
    with pytest.raises(OptionsError, match=r"^--fanout: must be in 1\.\.65535 \(got '1000000000000' from "
                                           r"P2PLEARN_FANOUT\)$"):
        p2plearn.init(environ=env, timeout=1)


def test_the_launcher_refuses_it_in_one_line_before_starting_anything():
    env = {k: v for k, v in os.environ.items() if not k.startswith("P2PLEARN_")}
    done = subprocess.run([BIN / "p2plearn-run", "-np", "2", "--fanout", "1000000000000", "--", sys.executable, "-c",
                           "raise SystemExit(9)"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["p2plearn-run: error: argument --fanout: must be in 1..65535 "
                                        "(got '1000000000000')"]


def test_a_flag_given_wins_over_a_bad_variable():
    args = add_arguments(argparse.ArgumentParser()).parse_args(["--fanout", "2"])
    assert Options.from_args(args, environ={"P2PLEARN_FANOUT": "1000000000000"}).fanout == 2
    with pytest.raises(OptionsError, match="from P2PLEARN_STALENESS"):
        Options.from_args(args, environ={"P2PLEARN_STALENESS": "-1"})
