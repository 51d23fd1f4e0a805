"""Tests for the `max_length` / `up_to_max_length` length rewards and their target resolution."""

import pytest

from open_instruct.rewards import RewardSettings, VerifierInput
from open_instruct.rewards.length import max_length, target_length, up_to_max_length

SETTINGS = RewardSettings(max_length_target=1000)


def run(verifier, tokens: int, gold) -> float:
    return verifier(VerifierInput("irrelevant text", gold, response_token_count=tokens), SETTINGS).score


def test_max_length_peaks_at_target():
    assert run(max_length, 100, 100) == 1.0
    assert run(max_length, 50, "100") == pytest.approx(0.5)
    assert run(max_length, 150, 100) == pytest.approx(0.5)
    assert run(max_length, 0, 100) == 0.0
    assert run(max_length, 500, 100) == 0.0  # clamped, never negative


def test_up_to_max_length_only_penalises_overshoot():
    assert run(up_to_max_length, 10, 100) == 1.0
    assert run(up_to_max_length, 100, 100) == 1.0
    assert run(up_to_max_length, 125, 100) == pytest.approx(0.75)
    assert run(up_to_max_length, 1000, 100) == 0.0


def test_target_resolution():
    assert target_length("256", SETTINGS) == 256.0
    assert target_length([512], SETTINGS) == 512.0
    assert target_length(None, SETTINGS) == 1000.0
    assert target_length("  ", SETTINGS) == 1000.0
    assert run(max_length, 1000, None) == 1.0  # falls back to the settings target


@pytest.mark.parametrize("bad", ["a reference answer", 0, -5, "inf", True])
def test_invalid_targets_raise(bad):
    with pytest.raises(ValueError, match="length target"):
        target_length(bad, SETTINGS)
