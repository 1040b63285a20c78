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
    assert [line.split(" | ")[0] for line in lines] == ["p2plearn-run: round 5", "p2plearn-run: round 9"]
    assert all("4/4 alive" in line for line in lines)
