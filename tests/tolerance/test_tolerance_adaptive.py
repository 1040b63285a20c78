"""Early Close: the bound and the deadline follow scripted network histories."""
import pytest

from p2plearn.tolerance import AdaptivePolicy, Layer, NetworkState, RoundRecord, RoundTimer, TrainingState

LAYERS = [Layer("w", 1000, 4000, 0), Layer("b", 10, 40, 0, "bias")]
CLEAN_S = 1.0


def clean(r, elapsed=CLEAN_S, **kw):
    return RoundRecord(round=r, elapsed_s=elapsed, delivered=1.0, loss_rate=0.0, **kw)


def run(policy, records, network=None):
    """Feed the records one round at a time, as the synchronizer does; the decisions per round."""
    network = network or NetworkState()
    out = []
    for rec in records:
        network.history.append(rec)
        out.append(policy.bounds(rec.round + 1, LAYERS, network, TrainingState()))
    return out


def test_clean_network_is_exact_with_a_deadline_from_the_clean_time():
    policy = AdaptivePolicy()
    bounds, deadline = run(policy, [clean(r) for r in range(5)])[-1]
    assert bounds == [0.0, 0.0]
    assert deadline == pytest.approx(policy.timer.slack * CLEAN_S)


def test_loss_burst_raises_the_bound_and_shortens_the_deadline_then_clean_rounds_tighten_to_zero():
    policy = AdaptivePolicy(max_bound=0.1, step=0.02, relax=0.01)
    burst = [RoundRecord(r, 1.0, 0.95, 0.05) for r in range(5, 8)]
    decisions = run(policy, [clean(r) for r in range(5)] + burst)
    clean_deadline = decisions[4][1]
    bound, deadline = decisions[-1][0][0], decisions[-1][1]
    assert bound >= 0.05                                  # at least the measured loss
    assert [d[0][0] for d in decisions[5:]] == sorted(d[0][0] for d in decisions[5:])
    assert deadline < clean_deadline                      # close at the quorum, not the whole message
    assert deadline == pytest.approx(policy.timer.slack * (1 - bound) * CLEAN_S)
    # a long burst saturates at max_bound
    assert run(policy, [RoundRecord(r, 1.0, 0.9, 0.2) for r in range(8, 20)])[-1][0] == [0.1, 0.1]
    # the network is clean again: back to exact delivery, in steps of relax
    after = run(policy, [clean(r) for r in range(20, 40)])
    bounds = [d[0][0] for d in after]
    assert all(a >= b for a, b in zip(bounds, bounds[1:]))
    assert bounds[-1] == 0.0


def test_straggler_raises_the_bound_but_the_deadline_stays_on_the_clean_estimate():
    policy = AdaptivePolicy()
    decisions = run(policy, [clean(r, 1.0 + 0.01 * (r % 3)) for r in range(10)] + [clean(10, elapsed=10.0)])
    before, after = decisions[-2], decisions[-1]
    assert before[0][0] == 0.0 and after[0][0] > 0.0
    assert after[1] <= before[1]                          # the straggler did not stretch the deadline
    assert after[1] < 2 * CLEAN_S


def test_slow_receiver_rate_counts_as_straggling():
    policy = AdaptivePolicy()
    rates = [[1e6, 2e6]] * 6 + [[0.2e6, 2e6]]
    decisions = run(policy, [clean(r, delivery_rates=rate) for r, rate in enumerate(rates)])
    assert decisions[-2][0][0] == 0.0 and decisions[-1][0][0] > 0.0


def test_deadline_hit_counts_as_bad_and_bounds_are_idempotent_per_round():
    policy = AdaptivePolicy(step=0.02)
    network = NetworkState()
    run(policy, [clean(0), RoundRecord(1, 1.0, 0.9, 0.0, deadline_hit=True)], network)
    first = policy.bounds(2, LAYERS, network, TrainingState())
    again = policy.bounds(2, LAYERS, network, TrainingState())   # same history: no second step
    assert first == again and first[0][0] == pytest.approx(0.02)


def test_deadline_before_history_uses_the_plan_then_the_cap():
    timer = RoundTimer(slack=2.0, max_deadline_s=5.0)
    policy = AdaptivePolicy(timer=timer)
    assert policy.bounds(0, LAYERS, NetworkState(planned_time_s=0.5), TrainingState())[1] == pytest.approx(1.0)
    assert policy.bounds(0, LAYERS, NetworkState(), TrainingState())[1] == 5.0
    assert AdaptivePolicy(timer=RoundTimer(max_deadline_s=None)).bounds(
        0, LAYERS, NetworkState(), TrainingState())[1] is None
    # the measured estimate is capped too
    assert run(AdaptivePolicy(timer=timer), [clean(r, elapsed=100.0) for r in range(4)])[-1][1] == 5.0


def test_deadline_extrapolates_partial_rounds_and_scales_with_message_size():
    timer = RoundTimer(slack=1.0)
    # delivered half in 1 s -> the whole message takes 2 s; next message is twice as large -> 4 s
    history = [RoundRecord(r, 1.0, 0.5, 0.0, message_bytes=1000) for r in range(3)]
    network = NetworkState(history=history, expected_bytes=2000)
    assert timer.clean_time(network) == pytest.approx(4.0)
    assert timer.deadline(network, 0.25) == pytest.approx(3.0)


@pytest.mark.parametrize("kwargs", [dict(max_bound=1.0), dict(step=0), dict(relax=-1), dict(loss_threshold=1.5)])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        AdaptivePolicy(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(slack=0.5), dict(k=0), dict(straggler_ratio=1.0), dict(window=1),
                                    dict(min_history=30), dict(min_deadline_s=0), dict(max_deadline_s=0.001)])
def test_bad_timer_arguments(kwargs):
    with pytest.raises(ValueError):
        RoundTimer(**kwargs)
