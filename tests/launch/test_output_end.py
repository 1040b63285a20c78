"""p2plearn-run's closing progress line is how the job ended: the last round and every rank gone."""


def test_the_closing_line_has_the_last_round_after_every_rank_left(launch):
    proc = launch("-np", "4", peer_args=["--rounds", "14"])
    assert proc.returncode == 0, proc.stderr_text
    progress = [line for line in proc.stdout_text.splitlines() if line.startswith("p2plearn-run: round")]
    assert progress, proc.stdout_text
    # peer.py reports rounds 1..14 with loss 1/round, then clock 15 (no loss) to meet before leaving
    assert progress[-1] == "p2plearn-run: round 15 | loss 0.0714 | all ranks left", progress
