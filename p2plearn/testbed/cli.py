"""``p2plearn-testbed``: build, inspect, use and remove emulated networks (root only).

    p2plearn-testbed up TOPOLOGY [--name NAME]
    p2plearn-testbed down NAME... | --all
    p2plearn-testbed status
    p2plearn-testbed exec NAME PEER -- COMMAND...
    p2plearn-testbed measure NAME [--seconds S] [--datagrams N]

Exit codes: 0 ok, 1 a system command failed, 2 refused (not root, a tool missing, name
taken, no such testbed or peer, bad topology).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from p2plearn.testbed import state
from p2plearn.testbed.measure import format_table, measure
from p2plearn.testbed.system import (
    CommandError,
    TestbedError,
    check_can_build,
    namespace_testbeds,
    remove_namespaces,
    testbed_namespaces,
)
from p2plearn.testbed.testbed import Testbed
from p2plearn.topology import TopologyError


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``p2plearn-testbed``; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        return args.handler(args)
    except (TestbedError, TopologyError) as error:
        print(f"p2plearn-testbed: {error}", file=sys.stderr)
        return 2
    except CommandError as error:
        print(f"p2plearn-testbed: command failed: {error}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="p2plearn-testbed", description="Build, inspect, use and remove emulated "
                                     "networks (root only). COMMAND --help gives a command's options. Exit codes: 0 ok, "
                                     "1 a system command failed, 2 refused.")
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser("up", help="build a testbed from a topology file")
    up.add_argument("topology", help="topology file (node-link JSON), e.g. topology/heterogeneous-4.json")
    up.add_argument("--name", help="the testbed's name, [a-z0-9_]{1,16} (default: the first free tbN)")
    up.set_defaults(handler=_up)

    down = commands.add_parser("down", help="remove testbeds, their processes included")
    down.add_argument("names", nargs="*", help="testbeds to remove (see p2plearn-testbed status)")
    down.add_argument("--all", action="store_true", help="every testbed, also crashed ones")
    down.set_defaults(handler=_down)

    status = commands.add_parser("status", help="list testbeds")
    status.set_defaults(handler=_status)

    run = commands.add_parser("exec", help="run a command inside a peer's namespace")
    run.add_argument("name", help="the testbed")
    run.add_argument("peer", help="peer name or index")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command and its arguments")
    run.set_defaults(handler=_exec)

    probe = commands.add_parser("measure", help="measure each peer's rates and loss")
    probe.add_argument("name", help="the testbed")
    probe.add_argument("--seconds", type=float, default=1.0, help="length of each TCP transfer (default: %(default)s)")
    probe.add_argument("--datagrams", type=int, default=2000, help="UDP datagrams per loss probe (default: %(default)s)")
    probe.set_defaults(handler=_measure)
    return parser


def _up(args: argparse.Namespace) -> int:
    testbed = Testbed(args.topology, args.name).up()
    print(f"testbed {testbed.name}: {len(testbed.peers)} peers, switch {testbed.switch_address}")
    for peer in testbed.peers:
        link = testbed.link(peer)
        print(
            f"  {peer:<10} {testbed.namespace(peer):<16} {testbed.interface(peer):<10}"
            f" {testbed.address(peer):<14} up {link['uplink_mbit']:g} / down"
            f" {link['downlink_mbit']:g} Mbit/s, loss {link['loss']:g}"
        )
    return 0


def _down(args: argparse.Namespace) -> int:
    if args.all == bool(args.names):
        raise TestbedError("give testbed names or --all")
    check_can_build()
    names = namespace_testbeds() | state.state_names() if args.all else set(args.names)
    for name in sorted(names):
        if not testbed_namespaces(name) and state.read_state(name) is None:
            raise TestbedError(f"no testbed named {name!r} (see p2plearn-testbed status)")
        remove_namespaces(name)
        state.remove_state(name)
        print(f"removed {name}")
    return 0


def _status(args: argparse.Namespace) -> int:
    names = sorted(namespace_testbeds() | state.state_names())
    if not names:
        print("no testbeds")
    for name in names:
        saved = state.read_state(name)
        namespaces = len(testbed_namespaces(name))
        if saved is None:
            print(f"{name}: {namespaces} namespaces, no state file (crashed? p2plearn-testbed down {name})")
            continue
        age = time.time() - saved["created"]
        peers = len(saved["topology"]["nodes"])
        print(
            f"{name}: {saved['source']}, {peers} peers, 10.77.{saved['subnet_index']}.0/24,"
            f" {namespaces} namespaces, up {age:.0f} s"
        )
    return 0


def _exec(args: argparse.Namespace) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise TestbedError("no command given: p2plearn-testbed exec NAME PEER -- COMMAND...")
    testbed = Testbed.attach(args.name)
    peer = int(args.peer) if args.peer.isdigit() else args.peer
    os.execvp("ip", ["ip", "netns", "exec", testbed.namespace(peer), *argv])


def _measure(args: argparse.Namespace) -> int:
    check_can_build()
    print(format_table(measure(Testbed.attach(args.name), args.seconds, args.datagrams)))
    print("(set): as configured; up/down: TCP goodput to/from the switch; loss: UDP datagrams")
    return 0
