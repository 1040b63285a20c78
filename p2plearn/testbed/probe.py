"""Traffic probes: TCP and UDP sources and sinks that run inside testbed namespaces.

Inside a namespace (what the helpers below start)::

    python -m p2plearn.testbed.probe tcp-sink [--port P]
    python -m p2plearn.testbed.probe tcp-source HOST [--port P] --seconds S
    python -m p2plearn.testbed.probe udp-sink [--port P] [--group G]
    python -m p2plearn.testbed.probe udp-source HOST [--port P] --count N --rate PPS [--size B]

A sink prints ``ready`` once it listens, then one JSON line with what it received. The
helpers ``tcp_transfer`` and ``udp_delivery`` pair a source with sinks; ``measure`` and the
tests use them. A "spawn" is a callable like ``functools.partial(testbed.run, peer)``.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

import numpy

from p2plearn.testbed.system import CommandError, python_module

Spawn = Callable[..., subprocess.Popen]

TCP_PORT = 45001
UDP_PORT = 45002
CHUNK_BYTES = 64 * 1024
SOCKET_BUFFER_BYTES = 4 << 20
SAMPLE_EVERY_S = 0.01
RATE_WINDOW_S = 0.1
# A UDP sink stops this long after the last datagram: far beyond any queueing delay here.
UDP_IDLE_S = 0.5
# Nothing arrives for this long: the sink gives up (the source failed).
GIVE_UP_S = 10.0


def tcp_transfer(source: Spawn, sink: Spawn, sink_address: str, seconds: float) -> dict[str, Any]:
    """Send over TCP for ``seconds``; returns the sink's ``bytes``, ``mbit`` and ``samples``.

    ``mbit`` is the median rate over RATE_WINDOW_S windows after the first 10% of the
    transfer (slow start), so that a moment in which a process waits for a core (2 shared
    cores here) does not count as the link's rate. ``samples`` are (time.monotonic(), bytes so far)
    pairs every SAMPLE_EVERY_S, for rates over time.
    """
    receiver = _start_sink(sink, "tcp-sink")
    sender = _start(source, "tcp-source", sink_address, "--seconds", str(seconds))
    _finish(sender, seconds + GIVE_UP_S)
    result = _finish(receiver, GIVE_UP_S)
    samples = result["samples"]
    if samples[-1][0] - samples[0][0] < 2 * RATE_WINDOW_S:
        raise CommandError(f"TCP transfer to {sink_address} carried too little to measure")
    after_slow_start = samples[0][0] + 0.1 * (samples[-1][0] - samples[0][0])
    result["mbit"] = median_rate(samples, after_slow_start, samples[-1][0])
    return result


def median_rate(samples: list[tuple[float, int]], start: float, end: float) -> float:
    """Median Mbit/s over the RATE_WINDOW_S windows that fit in [start, end]."""
    count = max(1, int((end - start) / RATE_WINDOW_S))
    width = (end - start) / count
    return statistics.median(
        rate_between(samples, start + i * width, start + (i + 1) * width) for i in range(count)
    )


def rate_between(samples: list[tuple[float, int]], start: float, end: float) -> float:
    """Mbit/s from ``start`` to ``end``, from (time, bytes so far) samples, interpolated."""
    times, received = zip(*samples)
    delivered = numpy.interp(end, times, received) - numpy.interp(start, times, received)
    return float(delivered) * 8 / 1e6 / (end - start)


def udp_delivery(
    source: Spawn,
    sinks: Sequence[Spawn],
    address: str,
    count: int,
    rate_pps: float,
    size: int = 200,
) -> list[float]:
    """Send ``count`` datagrams at ``rate_pps``; returns the fraction each sink received.

    address: a sink's address, or a multicast group (e.g. 239.1.1.1) that every sink joins.
    rate_pps and size: keep rate_pps x size well under the slowest link on the way, so that
    only random loss (not queue overflow) drops datagrams.
    """
    group = ["--group", address] if socket.inet_aton(address)[0] in range(224, 240) else []
    receivers = [_start_sink(sink, "udp-sink", *group) for sink in sinks]
    sender = _start(source, "udp-source", address, "--count", str(count),
                    "--rate", str(rate_pps), "--size", str(size))
    _finish(sender, count / rate_pps + GIVE_UP_S)
    return [_finish(receiver, GIVE_UP_S)["datagrams"] / count for receiver in receivers]


def _start(spawn: Spawn, *args: str) -> subprocess.Popen:
    argv, env = python_module("p2plearn.testbed.probe", *args)
    return spawn(argv, env=env, stdout=subprocess.PIPE, text=True)


def _start_sink(spawn: Spawn, *args: str) -> subprocess.Popen:
    process = _start(spawn, *args)
    if process.stdout.readline().strip() != "ready":
        process.kill()
        process.wait()
        raise CommandError(f"probe {' '.join(args)} did not start (exit {process.returncode})")
    return process


def _finish(process: subprocess.Popen, timeout_s: float) -> dict[str, Any]:
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise CommandError(f"probe {process.args[-1]!r} did not finish in {timeout_s:g} s") from None
    if process.returncode != 0:
        raise CommandError(f"probe failed (exit {process.returncode}): {process.args}")
    return json.loads(output.splitlines()[-1])


# --- what runs inside the namespaces ---------------------------------------------------


def _tcp_sink(port: int) -> dict[str, Any]:
    with socket.create_server(("0.0.0.0", port)) as server:
        print("ready", flush=True)
        server.settimeout(GIVE_UP_S)
        connection, _ = server.accept()
    received, samples = 0, []
    with connection:
        while chunk := connection.recv(1 << 20):
            received += len(chunk)
            now = time.monotonic()
            if not samples or now - samples[-1][0] >= SAMPLE_EVERY_S:
                samples.append((now, received))
        samples.append((time.monotonic(), received))
    return {"bytes": received, "samples": samples}


def _tcp_source(host: str, port: int, seconds: float) -> dict[str, Any]:
    payload, sent = bytes(CHUNK_BYTES), 0
    with socket.create_connection((host, port), timeout=GIVE_UP_S) as connection:
        # A deep send buffer keeps the link busy while this process waits for a core.
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            connection.sendall(payload)
            sent += len(payload)
    return {"bytes": sent}


def _udp_sink(port: int, group: str | None) -> dict[str, Any]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
        sock.bind(("0.0.0.0", port))
        if group:
            membership = socket.inet_aton(group) + socket.inet_aton("0.0.0.0")
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
        print("ready", flush=True)
        datagrams = received = 0
        sock.settimeout(GIVE_UP_S)
        try:
            while True:
                received += len(sock.recv(65536))
                datagrams += 1
                sock.settimeout(UDP_IDLE_S)
        except TimeoutError:
            pass
    return {"datagrams": datagrams, "bytes": received}


def _udp_source(host: str, port: int, count: int, rate_pps: float, size: int) -> dict[str, Any]:
    payload = bytes(size)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
        start = time.monotonic()
        for index in range(count):
            ahead = start + index / rate_pps - time.monotonic()
            if ahead > 0.001:  # sleep in steps of at least 1 ms: finer sleeps overshoot
                time.sleep(ahead)
            sock.sendto(payload, (host, port))
    return {"datagrams": count}


def main(argv: list[str] | None = None) -> int:
    """Run one probe; prints its JSON result."""
    parser = argparse.ArgumentParser(prog="python -m p2plearn.testbed.probe")
    probes = parser.add_subparsers(dest="probe", required=True)
    tcp_sink = probes.add_parser("tcp-sink")
    tcp_sink.add_argument("--port", type=int, default=TCP_PORT)
    tcp_source = probes.add_parser("tcp-source")
    tcp_source.add_argument("host")
    tcp_source.add_argument("--port", type=int, default=TCP_PORT)
    tcp_source.add_argument("--seconds", type=float, required=True)
    udp_sink = probes.add_parser("udp-sink")
    udp_sink.add_argument("--port", type=int, default=UDP_PORT)
    udp_sink.add_argument("--group")
    udp_source = probes.add_parser("udp-source")
    udp_source.add_argument("host")
    udp_source.add_argument("--port", type=int, default=UDP_PORT)
    udp_source.add_argument("--count", type=int, required=True)
    udp_source.add_argument("--rate", type=float, required=True, help="datagrams per second")
    udp_source.add_argument("--size", type=int, default=200, help="payload bytes")
    args = parser.parse_args(argv)

    if args.probe == "tcp-sink":
        result = _tcp_sink(args.port)
    elif args.probe == "tcp-source":
        result = _tcp_source(args.host, args.port, args.seconds)
    elif args.probe == "udp-sink":
        result = _udp_sink(args.port, args.group)
    else:
        result = _udp_source(args.host, args.port, args.count, args.rate, args.size)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
