"""Under mpirun (no p2plearn-run to tag its peers' lines) each rank writes whole lines tagged with its
rank: issue 44's "mpirun's ranks' lines run together"."""

import io
import shutil
import sys
import threading

import pytest

from launch_helpers import run_peers_under_mpirun
from p2plearn.rank_output import TaggedLines, tag_under_mpirun


class Pieces(io.StringIO):
    """A stream that records each write: what a pipe to mpirun would forward, piece by piece."""

    def __init__(self):
        super().__init__()
        self.pieces = []

    def write(self, text):
        self.pieces.append(text)
        return super().write(text)


def test_lines_are_written_whole_and_tagged_a_piece_at_a_time():
    stream = Pieces()
    tagged = TaggedLines(stream, "[3] ")
    tagged.write("rank 3: test ")
    tagged.write("accuracy 0.5")
    assert stream.pieces == []  # half a line waits for its end
    tagged.write("81\nsecond\nthird")
    tagged.write("\n")
    assert stream.pieces == ["[3] rank 3: test accuracy 0.581\n[3] second\n", "[3] third\n"]
    tagged.write("50%")
    tagged.flush()  # a progress bar's end="" and flush: shown now, tagged once
    tagged.write(" 100%\n")
    assert stream.getvalue().splitlines()[-1] == "[3] 50% 100%"


def test_threads_writing_at_once_never_split_a_line():
    stream = Pieces()
    tagged = TaggedLines(stream, "[0] ")

    def write(word):
        for _ in range(200):
            print(word * 30, file=tagged)

    threads = [threading.Thread(target=write, args=(w,)) for w in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 400 and set(lines) == {"[0] " + "a" * 30, "[0] " + "b" * 30}


def test_only_mpirun_ranks_are_tagged(monkeypatch):
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not tag_under_mpirun({"RANK": "1", "WORLD_SIZE": "2"}, 1)  # torchrun: left alone
    assert tag_under_mpirun({"OMPI_COMM_WORLD_RANK": "1"}, 1)
    assert isinstance(sys.stdout, TaggedLines) and sys.stdout.tag == "[1] " and isinstance(sys.stderr, TaggedLines)
    assert not tag_under_mpirun({"OMPI_COMM_WORLD_RANK": "1"}, 1)  # not twice


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (Open MPI) is not installed")
def test_every_line_of_an_mpirun_job_names_its_rank(tmp_path):
    returncode, out = run_peers_under_mpirun(tmp_path, "mpi-lines")
    assert returncode == 0, out
    for r in range(4):
        assert out.count(f"[{r}] rank {r} of 4 ") == 1, out
