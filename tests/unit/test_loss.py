"""The GRPO loss pieces against hand-computed numbers and autograd."""

import math

import pytest
import torch

from open_instruct.loss import (
    effective_sample_fraction,
    importance_weights,
    kl_per_token,
    mask_truncated,
    masked_mean,
    masked_sum,
    policy_loss,
    step_denominator,
)

F64 = torch.float64


def t(values, dtype=F64, **kwargs) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, **kwargs)


# ----------------------------------------------------------------------------- reductions


def test_masked_sum_and_mean_ignore_masked_nan_and_handle_empty():
    values = t([[1.0, 2.0, float("nan")], [4.0, float("inf"), 6.0]])
    mask = torch.tensor([[True, True, False], [True, False, True]])
    assert masked_sum(values, mask).item() == 13.0
    assert masked_mean(values, mask).item() == 13.0 / 4
    assert masked_mean(values, mask, 10.0).item() == 1.3
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0


def test_step_denominator():
    assert step_denominator(100, world_size=2, accumulation_steps=4) == 12.5
    assert step_denominator(8) == 8.0
    assert step_denominator(0, world_size=2) == 0.5  # empty step: 0 / 0.5 = 0, not NaN
    with pytest.raises(ValueError):
        step_denominator(10, world_size=0)


# ----------------------------------------------------------------------------- KL


@pytest.mark.parametrize("estimator", ["kl1", "kl2", "kl3", "kl4", "0", "1", "2", "3"])
def test_kl_is_zero_when_policies_agree(estimator):
    logprobs = t([[-0.3, -2.0, -7.5]])
    kl = kl_per_token(logprobs, logprobs.clone(), estimator, old_logprobs_BT=logprobs.clone())
    assert torch.equal(kl, torch.zeros_like(kl))


def test_kl_estimators_at_known_d():
    logprobs, ref, old = t([[-1.0, -2.0]]), t([[-1.5, -1.5]]), t([[-1.2, -2.0]])  # d = +0.5, -0.5
    expected = {
        "kl1": [0.5, -0.5],
        "kl2": [0.125, 0.125],
        "kl3": [math.exp(-0.5) - 1 + 0.5, math.exp(0.5) - 1 - 0.5],  # 0.10653, 0.14872
        "kl4": [math.exp(0.2) * 0.5, 1.0 * -0.5],  # ratio exp(new - old) * d
    }
    for name, values in expected.items():
        torch.testing.assert_close(kl_per_token(logprobs, ref, name, old_logprobs_BT=old), t([values]))
    # open-instruct's numeric names map as config.algorithm.AlgorithmConfig.kl_estimator_name does.
    torch.testing.assert_close(kl_per_token(logprobs, ref, "0"), t([expected["kl1"]]))
    torch.testing.assert_close(kl_per_token(logprobs, ref, "2"), t([expected["kl3"]]))


def test_kl_errors_and_clamp():
    logprobs = t([[-1.0]])
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_per_token(logprobs, logprobs, "kl5")
    with pytest.raises(ValueError, match="old_logprobs"):
        kl_per_token(logprobs, logprobs, "kl4")
    # A -inf reference logprob is clamped (d = 40), so kl3 stays finite.
    kl = kl_per_token(logprobs, t([[float("-inf")]]), "kl3")
    assert kl.item() == pytest.approx(math.expm1(-40.0) + 40.0)


def test_kl4_gradient_includes_the_ratio():
    # d/dnew [exp(new - old) * (new - ref)] = ratio * (d + 1); at new == old, ratio 1: d + 1 = 1.5.
    new = t([[-1.0]], requires_grad=True)
    kl_per_token(new, t([[-1.5]]), "kl4", old_logprobs_BT=t([[-1.0]])).sum().backward()
    assert new.grad.item() == pytest.approx(1.5)


# ----------------------------------------------------------------------------- truncated completions


def test_mask_truncated_rows():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    out = mask_truncated(mask, ["stop", "length", "abort"])
    assert out.dtype == torch.bool
    assert out.int().tolist() == [[1, 1, 0], [0, 0, 0], [0, 0, 0]]
    with pytest.raises(ValueError, match="finish reasons"):
        mask_truncated(mask, ["stop"])


def test_mask_truncated_packed_rows():
    mask = torch.tensor([[True, True, True, True, False], [True, True, False, False, False]])
    ids = torch.tensor([[0, 0, 1, 1, -1], [2, 2, -1, -1, -1]])
    out = mask_truncated(mask, ["length", "stop", "stop"], sample_ids_BT=ids)
    assert out.int().tolist() == [[0, 0, 1, 1, 0], [1, 1, 0, 0, 0]]


# ----------------------------------------------------------------------------- importance weights

# log rho = old - behaviour = [0, ln 3, ln 0.25, ln 1.5]; the last token is padding.
OLD = t([[-1.0, -1.0, -1.0, -1.0]])
BEHAVIOUR = OLD - t([[0.0, math.log(3.0), math.log(0.25), math.log(1.5)]])
MASK = torch.tensor([[True, True, True, False]])


def test_truncate_caps_rho_and_reports_stats():
    result = importance_weights(OLD, BEHAVIOUR, MASK, cap=2.0, mode="truncate")
    torch.testing.assert_close(result.weights_BT, t([[1.0, 2.0, 0.25, 0.0]]))
    assert torch.equal(result.mask_BT, MASK)
    stats = {k: v.item() for k, v in result.stats.items()}
    assert stats["rho_mean"] == pytest.approx((1 + 3 + 0.25) / 3)
    assert stats["rho_min"] == pytest.approx(0.25)
    assert stats["rho_max"] == pytest.approx(3.0)
    assert stats["truncated_frac"] == pytest.approx(1 / 3)
    assert stats["masked_frac"] == 0.0
    assert stats["num_tokens"] == 3
    assert stats["rho_sq_mean"] == pytest.approx((1 + 9 + 0.0625) / 3)


def test_the_effective_sample_fraction_is_one_on_policy_and_falls_as_one_weight_dominates():
    assert effective_sample_fraction(1.0, 1.0) == 1.0  # every rho is 1: the engines sampled the learner's policy
    rho = torch.tensor([1.0, 3.0, 0.25])
    kish = float(rho.sum() ** 2 / (len(rho) * rho.square().sum()))  # (sum w)^2 / (n sum w^2)
    assert effective_sample_fraction(float(rho.mean()), float(rho.square().mean())) == pytest.approx(kish)
    dominated = torch.tensor([100.0] + [0.01] * 99)  # one token carries nearly all the weight
    fraction = effective_sample_fraction(float(dominated.mean()), float(dominated.square().mean()))
    assert fraction == pytest.approx(1 / 100, rel=0.03)
    assert effective_sample_fraction(0.0, 0.0) == 1.0  # no token: nothing is off-policy
    # float32 token means of weights that are all ~1 (seen on the real stack): a rounding above 1 is not kept
    assert effective_sample_fraction(1.0000001192092896, 1.0000001192092896) == 1.0


def test_mask_token_drops_tokens_outside_bounds():
    result = importance_weights(OLD, BEHAVIOUR, MASK, cap=2.0, mode="mask_token")
    # rho 3 > 2 and rho 0.25 < 1/2 are dropped; rho 1 stays with weight 1.
    torch.testing.assert_close(result.weights_BT, t([[1.0, 0.0, 0.0, 0.0]]))
    assert result.mask_BT.tolist() == [[True, False, False, False]]
    assert result.stats["masked_frac"].item() == pytest.approx(2 / 3)
    assert result.stats["truncated_frac"].item() == 0.0


def test_mask_sequence_uses_geometric_mean_ratio():
    old = torch.full((3, 3), -1.0, dtype=F64)
    log_rho = t(
        [
            [0.0, math.log(3.0), math.log(0.25)],  # sequence ratio (0.75)^(1/3) = 0.909: kept
            [math.log(3.0), math.log(3.0), 0.0],  # 3 on its two valid tokens: dropped
            [5.0, 5.0, 5.0],  # fully masked row
        ]
    )
    mask = torch.tensor([[True, True, True], [True, True, False], [False, False, False]])
    result = importance_weights(old, old - log_rho, mask, cap=2.0, mode="mask_sequence")
    torch.testing.assert_close(result.weights_BT, t([[1.0, 2.0, 0.25], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    assert result.mask_BT.tolist() == [[True, True, True], [False, False, False], [False, False, False]]
    assert result.stats["masked_frac"].item() == pytest.approx(2 / 5)
    assert result.stats["truncated_frac"].item() == pytest.approx(1 / 5)


def test_mask_sequence_packed_rows():
    old = torch.full((1, 5), -1.0, dtype=F64)
    log_rho = t([[math.log(3.0), math.log(3.0), 0.1, -0.1, 0.0]])
    mask = torch.tensor([[True, True, True, True, False]])
    ids = torch.tensor([[0, 0, 1, 1, -1]])
    result = importance_weights(old, old - log_rho, mask, cap=2.0, mode="mask_sequence", sample_ids_BT=ids)
    assert result.mask_BT.tolist() == [[False, False, True, True, False]]
    torch.testing.assert_close(result.weights_BT, t([[0.0, 0.0, math.exp(0.1), math.exp(-0.1), 0.0]]))


def test_cap_zero_disables_correction_but_reports_rho():
    result = importance_weights(OLD, BEHAVIOUR, MASK, cap=0.0)
    torch.testing.assert_close(result.weights_BT, t([[1.0, 1.0, 1.0, 0.0]]))
    assert torch.equal(result.mask_BT, MASK)
    assert result.stats["rho_max"].item() == pytest.approx(3.0)
    assert result.stats["truncated_frac"].item() == 0.0


def test_importance_fully_masked_and_garbage_padding():
    behaviour = t([[float("-inf"), float("nan")]])
    result = importance_weights(t([[0.0, 0.0]]), behaviour, torch.zeros(1, 2, dtype=torch.bool), cap=2.0)
    assert torch.equal(result.weights_BT, torch.zeros(1, 2, dtype=F64))
    assert {k: v.item() for k, v in result.stats.items()} == {
        "rho_mean": 1.0,
        "rho_min": 1.0,
        "rho_max": 1.0,
        "rho_sq_mean": 1.0,
        "truncated_frac": 0.0,
        "masked_frac": 0.0,
        "num_tokens": 0,
    }


def test_importance_weights_are_constants_and_validate():
    old = OLD.clone().requires_grad_(True)
    assert not importance_weights(old, BEHAVIOUR, MASK, cap=2.0).weights_BT.requires_grad
    with pytest.raises(ValueError, match="empty"):
        importance_weights(OLD, BEHAVIOUR, MASK, cap=0.5, mode="mask_token")
    with pytest.raises(ValueError, match=">= 0"):
        importance_weights(OLD, BEHAVIOUR, MASK, cap=-1.0)
    with pytest.raises(ValueError, match="mode"):
        importance_weights(OLD, BEHAVIOUR, MASK, cap=2.0, mode="clip")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- policy loss

# One token per case, old = 0 and new = ln r; clip_lower 0.2, clip_higher 0.28: bounds [0.8, 1.28].
#   A=+1 r=1.5: max(-1.5, -1.28) = -1.28 clipped, grad 0
#   A=+1 r=0.5: max(-0.5, -0.8)  = -0.5  grad -A r = -0.5
#   A=-1 r=0.5: max(0.5, 0.8)    =  0.8  clipped, grad 0
#   A=-1 r=1.5: max(1.5, 1.28)   =  1.5  grad -A r = 1.5
#   A=+2 r=1.1: inside bounds    = -2.2  grad -2.2
RATIOS = [1.5, 0.5, 0.5, 1.5, 1.1]
ADVANTAGES = t([[1.0, 1.0, -1.0, -1.0, 2.0]])
TERMS = [-1.28, -0.5, 0.8, 1.5, -2.2]
GRADS = [0.0, -0.5, 0.0, 1.5, -2.2]


def _clip_case(denominator=None):
    new = t([[math.log(r) for r in RATIOS]], requires_grad=True)
    out = policy_loss(
        new,
        torch.zeros(1, 5, dtype=F64),
        ADVANTAGES,
        torch.ones(1, 5, dtype=torch.bool),
        clip_lower=0.2,
        clip_higher=0.28,
        loss_denominator=denominator,
    )
    out.loss.backward()
    return out, new.grad


def test_clip_branches_loss_clipfrac_and_gradient():
    out, grad = _clip_case()
    assert out.loss.item() == pytest.approx(sum(TERMS) / 5)  # -0.336
    assert out.policy_loss_avg.item() == pytest.approx(sum(TERMS) / 5)
    assert out.clipfrac.item() == pytest.approx(2 / 5)
    assert out.ratio_avg.item() == pytest.approx(sum(RATIOS) / 5)
    assert out.approx_kl.item() == pytest.approx(sum(0.5 * math.log(r) ** 2 for r in RATIOS) / 5)
    assert out.kl_avg.item() == 0.0
    assert out.num_tokens.item() == 5
    assert not out.policy_loss_avg.requires_grad
    torch.testing.assert_close(grad, t([[g / 5 for g in GRADS]]))
    assert grad[0, 0].item() == 0.0 and grad[0, 2].item() == 0.0  # clipped tokens: exactly no gradient


def test_constant_denominator_divides_the_sum():
    out, grad = _clip_case(denominator=10.0)
    assert out.loss.item() == pytest.approx(sum(TERMS) / 10)  # -0.168
    torch.testing.assert_close(grad, t([[g / 10 for g in GRADS]]))
    assert out.policy_loss_avg.item() == pytest.approx(sum(TERMS) / 5)  # stats stay token means


def test_zero_advantage_never_counts_as_clipped():
    out = policy_loss(
        t([[math.log(3.0)]]),
        t([[0.0]]),
        t([[0.0]]),
        torch.ones(1, 1, dtype=torch.bool),
        clip_lower=0.2,
        clip_higher=0.2,
    )
    assert out.clipfrac.item() == 0.0 and out.loss.item() == 0.0


def test_two_token_gradient_with_kl_and_importance_weights():
    # A = 1, old = 0, new = ln [1.1, 0.9] (inside [0.8, 1.2]), ref = 0 so d = new, kl3, beta 0.1, w = [2, 0.5]:
    #   loss   = (sum_i -w_i r_i + beta * (exp(-d_i) - 1 + d_i)) / 2
    #   dL/dn_i = (-w_i r_i + beta * (1 - exp(-d_i))) / 2
    r, w, beta = [1.1, 0.9], [2.0, 0.5], 0.1
    new = t([[math.log(r[0]), math.log(r[1])]], requires_grad=True)
    kl = kl_per_token(new, torch.zeros(1, 2, dtype=F64), "kl3")
    out = policy_loss(
        new,
        torch.zeros(1, 2, dtype=F64),
        t([1.0]),
        torch.ones(1, 2, dtype=torch.bool),
        clip_lower=0.2,
        clip_higher=0.2,
        importance_weights_BT=t([w]),
        kl_BT=kl,
        beta=beta,
    )
    out.loss.backward()
    kl3 = [1 / r_i - 1 + math.log(r_i) for r_i in r]
    assert out.loss.item() == pytest.approx((-w[0] * r[0] - w[1] * r[1] + beta * (kl3[0] + kl3[1])) / 2)
    expected_grad = [(-w[i] * r[i] + beta * (1 - 1 / r[i])) / 2 for i in range(2)]
    torch.testing.assert_close(new.grad, t([expected_grad]))
    assert out.kl_avg.item() == pytest.approx(sum(kl3) / 2)
    assert out.policy_loss_avg.item() == pytest.approx((-w[0] * r[0] - w[1] * r[1]) / 2)


def test_one_token_responses_with_per_row_advantages():
    new = torch.zeros(2, 1, dtype=F64, requires_grad=True)
    out = policy_loss(
        new,
        torch.zeros(2, 1, dtype=F64),
        t([0.5, -0.5]),
        torch.ones(2, 1, dtype=torch.bool),
        clip_lower=0.2,
        clip_higher=0.2,
    )
    out.loss.backward()
    assert out.loss.item() == 0.0  # (-0.5 + 0.5) / 2
    torch.testing.assert_close(new.grad, t([[-0.25], [0.25]]))  # -A / 2


def test_masked_row_with_garbage_contributes_nothing():
    new = t([[math.log(r) for r in RATIOS], [0.0] * 5], requires_grad=True)
    old = torch.cat([torch.zeros(1, 5, dtype=F64), torch.full((1, 5), float("-inf"), dtype=F64)])
    mask = torch.tensor([[True] * 5, [False] * 5])
    kl = kl_per_token(new, torch.full((2, 5), float("nan"), dtype=F64), "kl3")
    out = policy_loss(
        new,
        old,
        torch.cat([ADVANTAGES, t([[9.0] * 5])]),
        mask,
        clip_lower=0.2,
        clip_higher=0.28,
        kl_BT=torch.where(mask, torch.zeros_like(kl), kl),
        beta=0.1,
    )
    out.loss.backward()
    assert out.loss.item() == pytest.approx(sum(TERMS) / 5)
    assert torch.isfinite(new.grad).all()
    assert torch.equal(new.grad[1], torch.zeros(5, dtype=F64))
    assert out.num_tokens.item() == 5


def test_fully_masked_batch_gives_zero_loss_and_zero_grad():
    new = t([[-1.0, -2.0]], requires_grad=True)
    kl = kl_per_token(new, t([[-3.0, -3.0]]), "kl3")
    out = policy_loss(
        new,
        t([[float("-inf"), 50.0]]),
        t([[1.0, -1.0]]),
        torch.zeros(1, 2, dtype=torch.bool),
        clip_lower=0.2,
        clip_higher=0.2,
        importance_weights_BT=torch.zeros(1, 2),
        kl_BT=kl,
        beta=0.5,
    )
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert torch.equal(new.grad, torch.zeros(1, 2, dtype=F64))
    for value in (
        out.policy_loss_avg,
        out.kl_avg,
        out.clipfrac,
        out.ratio_avg,
        out.approx_kl,
        out.num_tokens,
    ):
        assert value.item() == 0.0


def test_step_denominator_gives_exact_token_mean_across_micro_batches():
    # Micro-batch 1: 3 tokens with per-token loss -A = [-1, -2, -3]; micro-batch 2: 1 token, -4 (ratio 1).
    def micro(advantages):
        n = len(advantages)
        new = torch.zeros(1, n, dtype=F64, requires_grad=True)
        return new, {
            "new_logprobs_BT": new,
            "old_logprobs_BT": torch.zeros(1, n, dtype=F64),
            "advantages": t([advantages]),
            "mask_BT": torch.ones(1, n, dtype=torch.bool),
            "clip_lower": 0.2,
            "clip_higher": 0.2,
        }

    batches = [[1.0, 2.0, 3.0], [4.0]]
    per_mb_mean = sum(policy_loss(**micro(a)[1]).loss.item() for a in batches)
    assert per_mb_mean == pytest.approx(-2.0 + -4.0)  # mean of means (times 2 micro-batches)
    denominator = step_denominator(4, world_size=1, accumulation_steps=1)
    exact = sum(policy_loss(**micro(a)[1], loss_denominator=denominator).loss.item() for a in batches)
    assert exact == pytest.approx(-10.0 / 4)


def test_policy_loss_validates():
    args = (t([[0.0]]), t([[0.0]]), t([[1.0]]), torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="loss_denominator"):
        policy_loss(*args, clip_lower=0.2, clip_higher=0.2, loss_denominator=0.0)
    with pytest.raises(ValueError, match="clip"):
        policy_loss(*args, clip_lower=-0.1, clip_higher=0.2)


def test_bf16_inputs_compute_in_float32():
    new = torch.zeros(1, 2, dtype=torch.bfloat16, requires_grad=True)
    out = policy_loss(
        new,
        torch.zeros(1, 2, dtype=torch.bfloat16),
        torch.ones(1, 2),
        torch.ones(1, 2, dtype=torch.bool),
        clip_lower=0.2,
        clip_higher=0.2,
    )
    out.loss.backward()
    assert out.loss.dtype == torch.float32 and out.loss.item() == -1.0
    assert new.grad.dtype == torch.bfloat16


def test_cispo_matches_a_hand_computation():
    """-A min(sg(r), 1 + hi) log pi, token mean; the gradient flows through log pi even where r is clipped."""
    new = torch.tensor([[-1.0, -0.5, -2.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.2, -1.0, -2.0]], dtype=torch.float64)
    advantages = torch.tensor([[2.0, 2.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True]])
    out = policy_loss(new, old, advantages, mask, clip_lower=0.2, clip_higher=0.25, loss_fn="cispo")
    ratios = [math.exp(0.2), math.exp(0.5), 1.0]
    weights = [min(r, 1.25) for r in ratios]  # the second token is clipped to 1.25
    expected = sum(-a * w * lp for a, w, lp in zip([2.0, 2.0, -1.0], weights, [-1.0, -0.5, -2.0])) / 3
    assert out.loss.item() == pytest.approx(expected)
    out.loss.backward()
    assert new.grad.tolist()[0] == pytest.approx([-a * w / 3 for a, w in zip([2.0, 2.0, -1.0], weights)])
    assert out.clipfrac.item() == pytest.approx(1 / 3)


def test_unknown_loss_fn_is_refused():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="dapo or cispo"):
        policy_loss(x, x, x, torch.ones(1, 2, dtype=torch.bool), clip_lower=0.2, clip_higher=0.2, loss_fn="ppo")


def test_rho_bounds_mask_and_clamp_the_tokens_they_should():
    from open_instruct.loss import RhoBounds

    # rho per token: 0.2, 0.8, 1.0, 1.5, 3.0 (old - behaviour = log rho).
    rhos = [0.2, 0.8, 1.0, 1.5, 3.0]
    old = torch.tensor([[math.log(r) for r in rhos]], dtype=torch.float64)
    behaviour = torch.zeros_like(old)
    mask = torch.ones(1, 5, dtype=torch.bool)
    bounds = RhoBounds(clamp_lower=0.9, mask_lower=0.5, mask_upper=2.0)
    result = importance_weights(old, behaviour, mask, cap=1.2, bounds=bounds)
    assert result.mask_BT.tolist() == [[False, True, True, True, False]]  # 0.2 < 0.5 and 3.0 > 2.0 dropped
    # Kept weights clamped to [0.9, 1.2]; dropped ones are 0.
    assert result.weights_BT.tolist()[0] == pytest.approx([0.0, 0.9, 1.0, 1.2, 0.0])


def test_sequence_level_rho_bounds_use_each_samples_geometric_mean_not_the_packed_rows():
    from open_instruct.loss import RhoBounds

    # One packed row with two samples: sample 0 has rho 4 and 4 (geo-mean 4), sample 1 has 0.5 and 2 (geo-mean 1).
    old = torch.tensor([[math.log(4), math.log(4), math.log(0.5), math.log(2)]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    sample_ids = torch.tensor([[0, 0, 1, 1]])
    bounds = RhoBounds(mask_upper=3.0, sequence_level=True)
    result = importance_weights(old, torch.zeros_like(old), mask, cap=2.0, sample_ids_BT=sample_ids, bounds=bounds)
    assert result.mask_BT.tolist() == [[False, False, True, True]]  # the row's mean (rho 2) would keep both
    assert result.weights_BT.tolist()[0] == pytest.approx([0.0, 0.0, 1.0, 1.0])


def test_rho_bounds_do_nothing_when_the_correction_is_off():
    from open_instruct.loss import RhoBounds

    old = torch.tensor([[math.log(5.0)]], dtype=torch.float64)
    result = importance_weights(
        old, torch.zeros_like(old), torch.ones(1, 1, dtype=torch.bool), 0.0, bounds=RhoBounds(mask_upper=2.0)
    )
    assert result.mask_BT.tolist() == [[True]] and result.weights_BT.tolist() == [[1.0]]


def test_tv_divergence_masking_drops_only_the_tokens_that_push_a_divergent_sample_further():
    from open_instruct.loss import RhoBounds

    # Sample 0: rho 0.25, 1, 4 -> mean |rho - 1| = 1.25 (inside the bound 2): kept.
    # Sample 1: rho 4, 4, 0.25 -> mean |rho - 1| = 2.25 (outside): with A > 0, tokens with log rho > 0
    # push further and are dropped; the rho 0.25 token (log rho < 0) pulls back and stays.
    rhos = [0.25, 1.0, 4.0, 4.0, 4.0, 0.25]
    old = torch.tensor([[math.log(r) for r in rhos]], dtype=torch.float64)
    mask = torch.ones(1, 6, dtype=torch.bool)
    sample_ids = torch.tensor([[0, 0, 0, 1, 1, 1]])
    advantages = torch.ones(1, 6, dtype=torch.float64)
    bounds = RhoBounds(mask_upper=2.0, tv_divergence=True)
    result = importance_weights(
        old, torch.zeros_like(old), mask, 2.0, sample_ids_BT=sample_ids, bounds=bounds, advantages_BT=advantages
    )
    assert result.mask_BT.tolist() == [[True, True, True, False, False, True]]
    assert result.weights_BT.tolist()[0] == pytest.approx([0.25, 1.0, 2.0, 0.0, 0.0, 0.25])  # clamping unchanged
    flipped = importance_weights(
        old, torch.zeros_like(old), mask, 2.0, sample_ids_BT=sample_ids, bounds=bounds, advantages_BT=-advantages
    )
    assert flipped.mask_BT.tolist() == [[True, True, True, True, True, False]]
