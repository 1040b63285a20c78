"""Helpers of the launcher tests (a unique module name: every test folder is on sys.path)."""

import glob
import json
import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER = os.path.join(ROOT, "tests", "launch", "peer.py")


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def peers_seen(out_dir):
    """What each peer wrote to ``out_dir`` (rank -> dict)."""
    seen = {}
    for path in glob.glob(os.path.join(out_dir, "rank-*.json")):
        with open(path) as f:
            info = json.load(f)
        seen[info["rank"]] = info
    return seen


def wait_for(predicate, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


