"""The retention equations against seed 002's worked numbers (Appendix B, Table 3, eq. 1-3)."""

from __future__ import annotations

import math

import pytest

from tenure.service.policy.platforms import PLATFORMS, alpha1_from_pool, get_platform
from tenure.service.policy.retention import (
    DEFAULT_PRICE,
    PriceVector,
    alpha2,
    hold_cost,
    host_ttl_seconds,
    lambda_crit,
)
from tenure.service.policy.retention_costs import RetentionModel, branch_costs

C2, W_REF = 425.0, 1800.0


def test_h100_nvl_worked_numbers() -> None:
    """alpha1 = 4 x 3000 / 680,768 = 0.0176; beta3 = 0.479 s x 4 ranks = 1.91; t1, t*."""
    h100 = get_platform("h100-nvl")
    assert h100.price.alpha1 == pytest.approx(0.0176, abs=5e-5)
    assert alpha1_from_pool(ranks=4, suffix_tokens=3000, kv_pool_tokens=680_768) == (
        pytest.approx(0.017627, rel=1e-4)
    )
    assert h100.price.beta3 == pytest.approx(0.479 * 4, abs=0.01)
    assert h100.price.t1 == pytest.approx(1.13, abs=0.01)  # "t1 ~ 1 s"
    assert h100.price.t_star == pytest.approx(109, abs=1)  # 1.91 / 0.017627 = 108.4; printed 109
    # The rounded default the sidecar ships agrees.
    assert DEFAULT_PRICE.t1 == pytest.approx(1.1, abs=0.05)
    assert DEFAULT_PRICE.t_star == pytest.approx(109, abs=1)


@pytest.mark.parametrize(
    ("name", "alpha1", "t1", "t_star"),
    [("h100-nvl", 0.0176, 1.13, 109), ("a100-sxm", 0.0232, 0.86, 112), ("l40s", 0.118, 0.17, 43.5)],
)
def test_table3_presets_derive_the_printed_break_evens(
    name: str, alpha1: float, t1: float, t_star: float
) -> None:
    price = PLATFORMS[name].price
    assert price.alpha1 == pytest.approx(alpha1, rel=0.01)
    assert price.t1 == pytest.approx(t1, abs=0.01)
    assert price.t_star == pytest.approx(t_star, rel=0.01)


def test_unknown_platform_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="a100-sxm, h100-nvl, l40s"):
        get_platform("tpu")


def test_equation_1_and_congestion_price() -> None:
    assert hold_cost(0.0176, 0.0, 60.0) == pytest.approx(1.056)
    assert hold_cost(0.0, 1.91, 1e9) == 1.91  # discarded state holds nothing
    crit = lambda_crit(C2, W_REF)
    assert crit == pytest.approx(425 / 1800)
    assert alpha2(0.5 * crit, C2, W_REF, 1.91) == 0.0
    assert alpha2(2 * crit, C2, W_REF, 1.91) == pytest.approx(crit * 1.91 / C2)


def test_t2_is_infinite_up_to_lambda_crit_then_falls_as_one_over_excess_load() -> None:
    price = PLATFORMS["h100-nvl"].price
    crit = lambda_crit(C2, W_REF)
    assert host_ttl_seconds(crit, price, C2, W_REF) is None
    t2_2 = host_ttl_seconds(2 * crit, price, C2, W_REF)
    t2_3 = host_ttl_seconds(3 * crit, price, C2, W_REF)
    # (beta3 - beta2) / ((lambda - crit) beta3 / C2) = 1.89 x 1800 / 1.91 s at 2 x crit.
    assert t2_2 is not None and t2_2 == pytest.approx(1.89 * 1800 / 1.91)
    assert t2_3 == pytest.approx(t2_2 / 2)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: lambda_crit(0, W_REF), "c2"),
        (lambda: lambda_crit(C2, -1.0), "w_ref_s"),
        (lambda: lambda_crit(C2, math.inf), "w_ref_s"),
        (lambda: host_ttl_seconds(-0.1, DEFAULT_PRICE, C2, W_REF), "lambda"),
        (lambda: host_ttl_seconds(math.nan, DEFAULT_PRICE, C2, W_REF), "lambda"),
        (lambda: PriceVector(alpha1=0.0, beta2=0.02, beta3=1.91), "alpha1"),
        (lambda: PriceVector(alpha1=-1.0, beta2=0.02, beta3=1.91), "alpha1"),
        (lambda: PriceVector(alpha1=0.01, beta2=-0.02, beta3=1.91), "beta2"),
        (lambda: PriceVector(alpha1=0.01, beta2=0.5, beta3=0.1), "beta3"),
        (lambda: RetentionModel(PriceVector(0.01, 0.0, 0.0), C2, W_REF), "beta3"),
        (lambda: RetentionModel(DEFAULT_PRICE, 0.0, W_REF), "c2"),
        (lambda: RetentionModel(DEFAULT_PRICE, 0.5, W_REF), "c2"),
        (lambda: RetentionModel(DEFAULT_PRICE, C2, 0.0), "w_ref_s"),
        (lambda: RetentionModel(DEFAULT_PRICE, C2, W_REF).t2(-1.0), "lambda"),
        (lambda: branch_costs(RetentionModel(DEFAULT_PRICE, C2, W_REF), [], 1.0), "waits_s"),
        (
            lambda: branch_costs(RetentionModel(DEFAULT_PRICE, C2, W_REF), [math.nan], 1.0),
            "waits_s",
        ),
    ],
)
def test_bad_input_names_the_field(call, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        call()
