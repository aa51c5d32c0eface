import numpy as np
import pytest
from scipy import stats

from sim import (DraftModel, expected_tokens_per_step, speculative_decode,
                 speculative_speedup)


@pytest.mark.parametrize("a,k", [(0.8, 5), (0.5, 3), (0.95, 8), (0.0, 4)])
def test_mean_tokens_per_round_matches_formula(a, k):
    d = DraftModel(a, seed=7)
    n = 20000
    lengths = np.array([len(speculative_decode(d, None, [1, 2], num_speculative=k).tokens)
                        for _ in range(n)])
    assert lengths.min() >= 1 and lengths.max() <= k + 1
    expected = expected_tokens_per_step(a, k)
    assert lengths.mean() == pytest.approx(expected, abs=4 * lengths.std() / np.sqrt(n) + 1e-9)


def test_acceptance_count_is_truncated_geometric():
    d = DraftModel(0.6, seed=3)
    k, n = 4, 20000
    acc = np.array([speculative_decode(d, None, [], k).num_accepted for _ in range(n)])
    probs = [0.6 ** j * 0.4 for j in range(k)] + [0.6 ** k]
    obs = np.bincount(acc, minlength=k + 1)
    assert stats.chisquare(obs, np.array(probs) * n).pvalue > 1e-3


def test_formula_values_and_speedup():
    assert expected_tokens_per_step(0.8, 5) == pytest.approx((1 - 0.8 ** 6) / 0.2)
    assert expected_tokens_per_step(1.0, 5) == 6
    assert speculative_speedup(0.8, 5, 0.05) == pytest.approx(3.6893 / 1.25, rel=1e-4)
    assert speculative_speedup(0.2, 5, 0.3) < 1  # speculation got slower
    with pytest.raises(ValueError, match="acceptance_rate"):
        expected_tokens_per_step(1.2, 3)
    with pytest.raises(ValueError, match="cost_ratio"):
        speculative_speedup(0.5, 3, -1)


def _target(ctx):
    # a context-dependent target distribution over 5 tokens
    base = np.array([0.1, 0.4, 0.2, 0.25, 0.05])
    return np.roll(base, len(ctx) % 5)


def _draft(ctx):
    base = np.array([0.3, 0.1, 0.3, 0.1, 0.2])
    return np.roll(base, (len(ctx) * 2) % 5)


def test_speculative_sampling_output_is_distributed_as_target():
    rng = np.random.default_rng(11)
    n = 30000
    first, second = np.zeros(5), np.zeros(5)
    n_second = 0
    accepted = 0
    for _ in range(n):
        r = speculative_decode(_draft, _target, [0, 0], num_speculative=3, seed=rng)
        assert 1 <= len(r.tokens) <= 4
        accepted += r.num_accepted
        first[r.tokens[0]] += 1
        if len(r.tokens) >= 2:  # conditional on the 1st accepted; context length 3
            second[r.tokens[1]] += 1
            n_second += 1
    assert stats.chisquare(first, _target([0, 0]) * n).pvalue > 1e-3
    assert stats.chisquare(second, _target([0, 0, 0]) * n_second).pvalue > 1e-3
    # some drafts accepted, some rejected: the rule is exercised both ways
    assert 0 < accepted < 3 * n


def test_real_models_all_accepted_when_draft_equals_target():
    r = speculative_decode(_target, _target, [1], num_speculative=4, seed=0)
    assert r.num_accepted == 4 and len(r.tokens) == 5


def test_seed_reproducible_and_bad_inputs():
    a = speculative_decode(DraftModel(0.7, seed=1), None, [], 5)
    b = speculative_decode(DraftModel(0.7, seed=1), None, [], 5)
    assert a == b
    with pytest.raises(ValueError, match="acceptance_rate"):
        DraftModel(1.5)
    with pytest.raises(ValueError, match="num_speculative"):
        speculative_decode(DraftModel(), None, [], 0)
    with pytest.raises(TypeError):
        speculative_decode(object(), None, [])
    with pytest.raises(ValueError, match="summing"):
        speculative_decode(lambda c: np.array([0.5, 0.6]), _target, [], 2, seed=0)
