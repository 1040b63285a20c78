"""The launcher's progress line: a rate that reads what the job does, and its last lines in order."""

from p2plearn.control import Progress
from p2plearn.launch.output import Output
from p2plearn.launch.rate import RoundRate


def test_the_rate_spans_rounds_slower_than_the_refresh():
    rate = RoundRate(window=10.0)
    assert rate.update(0.0, 0) is None  # no round yet: unknown, not 0.00
    readings = []
    for tick in range(1, 41):  # refreshed every 0.1 s, one round every 2 s
        readings.append(rate.update(tick * 0.1 + 2.0, 1 + tick // 20))
    assert all(r is not None and r > 0 for r in readings)
    for tick in range(41, 400):
        last = rate.update(tick * 0.1 + 2.0, 1 + tick // 20)
    assert abs(last - 0.5) < 0.12  # the window's rate, not the start-up's


def test_the_last_progress_lines_come_in_order(capsys):
    output = Output(live=False, plain_every=0.0)
    try:
        output.progress(Progress(5, 5, 4, 0.5, 2), 1.0, 4)
        output.progress(Progress(9, 9, 4, 0.25, 1), 1.0, 4)
        output.progress(Progress(10, 10, 0, 0.2, None), 1.0, 4)  # peers left; their processes still exit
        output.progress(Progress(10, 10, 0, 0.2, None), None, 4, final=True)
    finally:
        output.close()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["p2plearn-run: round 5", "p2plearn-run: round 9",
                                                       "p2plearn-run: round 10"]
    assert all("4/4 alive" in line for line in lines[:-1])  # the lines while the job ran
    assert lines[-1] == "p2plearn-run: round 10 | loss 0.2000 | all ranks left"  # and how it ended


def test_the_closing_line_is_the_end_not_the_last_line_shown(capsys):
    """Issue 44: `round 3..4` after 14 rounds, and `2/4 alive` after a normal end."""
    output = Output(live=False, plain_every=3600.0)
    try:
        output.progress(Progress(3, 4, 4, 0.9, 1), 1.0, 4)  # shown; the next ones come before the next plain line
        output.progress(Progress(12, 13, 4, 0.5, 0), 1.0, 4)
        output.progress(Progress(13, 14, 2, 0.4, 0), 1.0, 4)
        output.progress(Progress(13, 14, 0, 0.4, None), None, 4, final=True)
    finally:
        output.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("p2plearn-run: round 3..4 |")
    assert lines[1:] == ["p2plearn-run: round 14 | loss 0.4000 | all ranks left"]


def test_a_closing_line_with_members_that_never_left_says_so(capsys):
    output = Output(live=False)
    try:
        output.progress(Progress(7, 8, 1, None, 3), None, 4, final=True)  # a killed rank, not yet declared dead
        output.progress(Progress(0, 0, 0, None, None), None, 4, final=True)  # no round ever ran: nothing to say
    finally:
        output.close()
    assert capsys.readouterr().out.splitlines() == [
        "p2plearn-run: round 8 | loss - | 1 of 4 ranks stopped without leaving the job"]
