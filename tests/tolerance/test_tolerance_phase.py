"""Phase tracking (forward only), per-phase bounds, the critical-regime guard and the adaptive deadline."""
import pytest

from p2plearn.tolerance import (CriticalRegimeGuard, Layer, NetworkState, PhasePolicy, RoundRecord,
                                RoundTimer, TrainingState)

LAYERS = [Layer("w", 1000, 4000, 0), Layer("b", 10, 40, 0, "bias")]
BOUNDS = dict(beginning_bound=0.01, middle_bound=0.1, final_bound=0.02)


def bound(policy, round, training, network=None):
    return policy.bounds(round, LAYERS, network or NetworkState(), training)[0][0]


def test_accuracy_phases_move_forward_only_and_pick_the_configured_bound():
    policy = PhasePolicy(**BOUNDS)
    training = TrainingState()
    seen = []
    for acc in [0.1, 0.3, 0.45, 0.55, 0.6, 0.63, 0.64, 0.75, 0.76]:
        training.accuracies.append(acc)
        seen.append((policy.phase, bound(policy, len(seen), training)))
    assert seen[0] == ("beginning", 0.01)
    assert ("middle", 0.1) in seen                      # 0.55 -> 0.6: A > 0.5, 0.03 <= D <= 0.07
    assert seen[-1] == ("final", 0.02)                  # 0.63 -> 0.64: D < 0.03
    # 0.64 -> 0.75 is a jump (D > 0.07) but phases never move back
    assert [p for p, _ in seen] == sorted((p for p, _ in seen), key=("beginning", "middle", "final").index)


def test_accuracy_below_min_accuracy_stays_in_the_beginning():
    policy = PhasePolicy(**BOUNDS)
    assert bound(policy, 0, TrainingState(accuracies=[0.1, 0.11, 0.12, 0.12])) == 0.01
    assert policy.phase == "beginning"


def test_loss_trend_drives_the_phase_without_accuracy():
    policy = PhasePolicy(loss_window=10, smoothing=0.0, **BOUNDS)
    training = TrainingState()
    phases = []
    # fast drop (30% per window), then slow (5%), then flat
    for r in range(60):
        window = r // 10
        training.losses.append(0.7 ** r / 10 if window < 2 else
                               training.losses[-1] * (0.95 ** 0.1 if window < 4 else 1.0))
        bound(policy, r, training)
        phases.append(policy.phase)
    assert phases[15] == "beginning"
    assert "middle" in phases[20:45]
    assert phases[-1] == "final"


def test_loss_history_trimmed_by_the_synchronizer_gives_the_same_phases():
    full, trimmed = PhasePolicy(loss_window=20), PhasePolicy(loss_window=20)
    a, b = TrainingState(), TrainingState()
    for r in range(200):
        loss = 0.9 ** min(r, 40) * (1 - 0.0005 * r)
        a.losses.append(loss)
        b.losses.append(loss)
        b.losses_reported += 1
        del b.losses[:-7]
        bound(full, r, a)
        bound(trimmed, r, b)
        assert full.phase == trimmed.phase
    assert full.phase == "final"


def test_flat_loss_goes_through_the_middle_before_the_final_phase():
    policy = PhasePolicy(loss_window=5, smoothing=0.0)
    training = TrainingState(losses=[1.0] * 6)
    bound(policy, 0, training)
    assert policy.phase == "middle"
    training.losses += [1.0] * 5
    bound(policy, 1, training)
    assert policy.phase == "final"


def test_norm_jump_forces_exact_delivery_for_k_rounds_then_releases():
    policy = PhasePolicy(middle_bound=0.1, guard=CriticalRegimeGuard(k=5, eta=0.5))
    policy.phase = "middle"
    training = TrainingState()
    decided = []
    for r in range(40):
        training.update_norms.append(1.0 if r < 12 else 3.0)   # the norm jumps at round 12
        decided.append(bound(policy, r, training))
    assert decided[:14] == [0.1] * 14
    exact = [r for r, b in enumerate(decided) if b == 0.0]
    assert exact == list(range(exact[0], exact[0] + 5))         # k rounds, once: the new level is steady
    assert 12 <= exact[0] <= 15
    assert decided[-1] == 0.1


def test_guard_is_checked_once_per_k_rounds():
    guard = CriticalRegimeGuard(k=3, eta=0.5)
    norms = [1.0] * 3 + [2.0] * 3
    assert guard.active(6, norms) and guard.active(8, norms) and not guard.active(9, norms + [2.0] * 3)


def test_deadline_is_the_adaptive_one_within_each_phase():
    timer = RoundTimer(slack=2.0)
    policy = PhasePolicy(timer=timer, **BOUNDS)
    network = NetworkState(history=[RoundRecord(r, 1.0, 1.0, 0.0) for r in range(5)] + [RoundRecord(5, 30.0, 1.0, 0.0)])
    bounds, deadline = policy.bounds(6, LAYERS, network, TrainingState())
    assert deadline == pytest.approx(2.0 * (1 - 0.01) * 1.0)  # the burst round does not stretch it
    assert deadline == timer.deadline(network, bounds[0])


@pytest.mark.parametrize("kwargs", [dict(middle_bound=1.0), dict(final_change=0.1, begin_change=0.05),
                                    dict(loss_window=0), dict(smoothing=1.0)])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        PhasePolicy(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(k=0), dict(eta=0)])
def test_bad_guard_arguments(kwargs):
    with pytest.raises(ValueError):
        CriticalRegimeGuard(**kwargs)
