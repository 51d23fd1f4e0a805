"""Group advantages and the zero-std group filter, against hand-computed numbers."""

import math

import pytest
import torch

from open_instruct.advantages import (
    GroupFilterResult,
    filter_zero_std_groups,
    group_advantages,
    zero_std_groups,
)


def test_centered_is_reward_minus_group_mean():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [10.0, 0.0, 0.0, 0.0]])
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [7.5, -2.5, -2.5, -2.5]])
    torch.testing.assert_close(group_advantages(rewards, "centered"), expected)


def test_standard_divides_by_population_std():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [10.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    # Group 1: mean 0.5, population std 0.5. Group 2: mean 2.5, variance (7.5^2 + 3 * 2.5^2) / 4 = 18.75,
    # so 7.5 / sqrt(18.75) = sqrt(3) and -2.5 / sqrt(18.75) = -1 / sqrt(3).
    expected = torch.tensor(
        [[1.0, -1.0, -1.0, 1.0], [math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)]],
        dtype=torch.float64,
    )
    torch.testing.assert_close(group_advantages(rewards, "standard", eps=0.0), expected)
    # eps sits in the denominator: 0.5 / (0.5 + 0.1)
    assert group_advantages(rewards, "standard", eps=0.1)[0, 0].item() == pytest.approx(0.5 / 0.6)


@pytest.mark.parametrize("normalization", ["centered", "standard"])
@pytest.mark.parametrize("value", [3.0, 0.1, 0.0])
def test_all_equal_rewards_give_exact_zero_and_no_nan(normalization, value):
    rewards = torch.full((2, 5), value)
    advantages = group_advantages(rewards, normalization, eps=0.0)  # eps 0: 0/0 would be NaN if not handled
    assert torch.equal(advantages, torch.zeros(2, 5))


def test_single_sample_group_is_zero_for_both_normalizations():
    rewards = torch.tensor([[4.0], [0.0]])
    for normalization in ("centered", "standard"):
        assert torch.equal(group_advantages(rewards, normalization), torch.zeros(2, 1))


def test_integer_rewards_are_accepted():
    advantages = group_advantages(torch.tensor([[1, 0]]), "centered")
    assert advantages.is_floating_point()
    assert advantages.tolist() == [[0.5, -0.5]]


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="normalization"):
        group_advantages(torch.zeros(2, 2), "whitened")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="groups"):
        group_advantages(torch.zeros(4), "centered")


def test_zero_std_groups_and_filter():
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [2.0, 3.0]])
    assert zero_std_groups(rewards).tolist() == [True, False, True, False]
    result = filter_zero_std_groups(rewards)
    assert result == GroupFilterResult(kept_group_indices=[1, 3], num_filtered=2)
    assert result.num_kept == 2
    # The kept indices select the surviving groups' advantages.
    assert group_advantages(rewards)[result.kept_group_indices].tolist() == [[-0.5, 0.5], [-0.5, 0.5]]


def test_filter_disabled_or_nothing_to_filter():
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    assert filter_zero_std_groups(rewards, enabled=False) == GroupFilterResult([0, 1], 0)
    assert filter_zero_std_groups(torch.tensor([[0.0, 1.0]])) == GroupFilterResult([0], 0)
    assert filter_zero_std_groups(torch.ones(3, 4)) == GroupFilterResult([], 3)
