"""Options (flags <-> environment), rank detection (p2plearn.rendezvous), and rank 0 hosting the coordinator."""

import argparse
import socket

import pytest

from p2plearn import runtime
from p2plearn.options import Options, OptionsError, add_arguments
from p2plearn.rendezvous import detect_rank


def test_options_round_trip_through_the_environment():
    opts = Options(sync="ssp", staleness=4, selection="ring", fanout=3, loss_bound=0.1, tolerance="phase",
                   filter="value", deadline_ms=250.0, topology="/t.json", emulate=True)
    env = opts.to_env()
    assert env["P2PLEARN_SYNC"] == "ssp" and env["P2PLEARN_LOSS_BOUND"] == "0.1" and env["P2PLEARN_EMULATE"] == "1"
    assert Options.from_env(env) == opts
    assert Options.from_env({}) == Options()


@pytest.mark.parametrize("env, message", [
    ({"P2PLEARN_SYNC": "async"}, "--sync: must be one of bsp, ssp, partitioned (got 'async' from P2PLEARN_SYNC)"),
    ({"P2PLEARN_STALENESS": "two"}, "--staleness: not a valid int (got 'two' from P2PLEARN_STALENESS)"),
    ({"P2PLEARN_LOSS_BOUND": "1.5"}, "--loss-bound: must be in [0, 1)"),
    ({"P2PLEARN_EMULATE": "1"}, "--emulate: needs --topology"),
    ({"P2PLEARN_MAX_FANOUT": "-1"}, "--max-fanout: must be in 0..65535"),
    ({"P2PLEARN_MAX_FANIN": "-1"}, "--max-fanin: must be in 0..65535"),
    ({"P2PLEARN_MIXING_SLACK": "-0.5"}, "--mixing-slack: must be in [0, 10]"),
    ({"P2PLEARN_TRANSPORT_MODE": "broadcast"}, "--transport-mode: must be one of unicast, multicast, auto"),
    ({"P2PLEARN_MCAST_GROUPS": "10.0.0.0/16"}, "--mcast-groups: must be a multicast range"),
    ({"P2PLEARN_MCAST_GROUPS": "239.77.0.1/16"}, "--mcast-groups: must be a multicast range"),
    ({"P2PLEARN_MCAST_TTL": "0"}, "--mcast-ttl: must be in 1..255"),
])
def test_bad_options_name_the_culprit(env, message):
    with pytest.raises(OptionsError) as err:
        Options.from_env(env)
    assert message in str(err.value)


def test_flags_override_the_environment():
    parser = add_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--sync", "ssp", "--fanout", "5"])
    opts = Options.from_args(args, environ={"P2PLEARN_FANOUT": "3", "P2PLEARN_STALENESS": "7"})
    assert (opts.sync, opts.fanout, opts.staleness) == ("ssp", 5, 7)
    with pytest.raises(SystemExit):
        parser.parse_args(["--fanout", "x"])


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
      "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, (3, 8, 1, 4)),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, (2, 4, 0, 2)),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, (1, 2, 1, 2)),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "2", "SLURM_TASKS_PER_NODE": "3(x2)"}, (5, 6, 2, 3)),
    ({}, (0, 1, 0, 1)),
])
def test_rank_detection_order(env, expected):
    assert detect_rank(env) == expected


def test_bad_rank_variables_are_clear():
    with pytest.raises(ValueError, match="RANK=4 is not in"):
        detect_rank({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(ValueError, match="not an integer"):
        detect_rank({"PMI_RANK": "x", "PMI_SIZE": "2"})


def test_rank0_hosts_the_coordinator_without_a_launcher():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port - 1),
           "P2PLEARN_JOB_ID": "solo", "P2PLEARN_JOB_KEY": "ab" * 32, "P2PLEARN_SYNC": "ssp"}
    with runtime.init(engine_address=("127.0.0.1", 4000), environ=env, timeout=10, staleness=5) as rt:
        assert rt.coordinator is not None and rt.coordinator.address.endswith(f":{port}")
        assert (rt.rank, rt.world_size, rt.options.sync, rt.options.staleness) == (0, 1, "ssp", 5)
        assert rt.client.members[0].engine == ("127.0.0.1", 4000)
        rt.register(("127.0.0.1", 4001))
        assert rt.client.fetch_view().alive.tolist() == [True]
