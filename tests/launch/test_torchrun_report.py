"""torchrun's report of ranks that stopped on a p2plearn setup error is that error's line, exit code 2
(p2plearn.rendezvous.errors.shorten_torchrun_report); any other failure keeps torchrun's report."""

import json
import signal

import pytest

from p2plearn.rendezvous import errors

failures_api = pytest.importorskip("torch.distributed.elastic.multiprocessing.errors")
LINE = "p2plearn: error: --sync: must be one of bsp, ssp, partitioned (got 'bogus' from P2PLEARN_SYNC)"


def failure(tmp_path, rank, exitcode, line=None, timestamp=0):
    """A rank's failure as torchrun reads it: its exit code and the error file it wrote (if any)."""
    path = tmp_path / f"error-{rank}.json"
    if line is not None:
        path.write_text(json.dumps({"message": {"message": line, "extraInfo": {"py_callstack": line,
                                                                                "timestamp": str(timestamp)}}}))
    found = failures_api.ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file=str(path))
    found.timestamp = timestamp
    return found


def report(tmp_path, *ranks):
    """torchrun's one line for these (rank, exit code, line, time) failures, or None (its own report)."""
    error = failures_api.ChildFailedError("train.py", {r: failure(tmp_path, r, *rest) for r, *rest in ranks})
    return errors._setup_errors(error)


def test_ranks_stopped_on_one_setup_error_are_one_line(tmp_path):
    assert report(tmp_path, (0, 2, LINE, 1), (1, 2, LINE, 2)) == f"{LINE} [torchrun: ranks 0, 1]"


def test_the_ranks_torchrun_stopped_after_the_first_failure_are_named(tmp_path):
    assert (report(tmp_path, (0, -signal.SIGTERM, None, 2), (1, 2, LINE, 1), (2, -signal.SIGTERM, None, 2))
            == f"{LINE} [torchrun: rank 1; ranks 0, 2 stopped by torchrun]")


def test_distinct_setup_errors_are_a_line_each(tmp_path):
    other = "p2plearn: error: ckpt/step-6/rank-1.pt: saved by a job of 4 ranks, this one has 2"
    expected = f"{LINE} [torchrun: rank 0]\n{other} [torchrun: rank 1]"
    assert report(tmp_path, (0, 2, LINE, 1), (1, 2, other, 2)) == expected


def test_any_other_failure_keeps_torchruns_report(tmp_path):
    assert report(tmp_path, (0, 1, "ValueError: mine", 1), (1, 2, LINE, 2)) is None  # a rank's own exception
    assert report(tmp_path, (0, 2, "not ours", 1)) is None  # exit code 2 from something else
    assert report(tmp_path, (0, -signal.SIGKILL, None, 1), (1, 2, LINE, 2)) is None  # the first failure: a kill
    assert report(tmp_path, (0, -signal.SIGSEGV, None, 2), (1, 2, LINE, 1)) is None  # a crash beside ours
