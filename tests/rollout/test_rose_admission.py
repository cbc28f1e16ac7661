"""ROSE's dual-SLO admission: Eq. 1 and Eq. 2, which SLO binds each role under each variant of
Fig. 9, and the stall watch."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom.core.errors import ConfigError, UnknownPolicyError
from loom.rollout.rose import (
    ADMISSION_POLICIES,
    AdmissionKind,
    Role,
    ServingSlo,
    StallWatch,
    admits,
    slack_s,
    tpot_slack_s,
    ttft_slack_s,
)

SLO = ServingSlo(ttft_s=0.5, tpot_s=0.15)  # §6: Qwen2.5-7B


def test_ttft_slack_is_eq1_at_its_minimum_over_the_queued_prefills() -> None:
    prefill = lambda tokens: tokens * 1e-4  # noqa: E731  (0.1 s per 1,000 tokens)
    queued = [(10.0, 1000), (10.2, 3000)]
    # 10.0 + 0.5 - 10.3 - 0.1 = 0.1 ; 10.2 + 0.5 - 10.3 - 0.3 = 0.1 ; both 0.1
    assert ttft_slack_s(queued, 10.3, SLO, prefill) == pytest.approx(0.1)
    assert ttft_slack_s([(10.0, 4000)], 10.3, SLO, prefill) == pytest.approx(-0.2)
    assert ttft_slack_s([], 10.3, SLO, prefill) == math.inf


def test_tpot_slack_is_eq2_at_the_current_batch() -> None:
    decode = lambda b: 0.01 + 0.001 * b  # noqa: E731
    # batch 3: step 0.013 s; the oldest last token binds
    assert tpot_slack_s([5.00, 5.05, 5.10], 5.1, SLO, decode) == pytest.approx(
        5.00 + 0.15 - 5.1 - 0.013
    )
    assert tpot_slack_s([], 5.1, SLO, decode) == math.inf


@pytest.mark.parametrize(
    ("role", "kind", "binds"),
    [
        (Role.PREFILL, AdmissionKind.DUAL_SLO, "ttft"),
        (Role.DECODE, AdmissionKind.DUAL_SLO, "tpot"),
        (Role.COLOCATED, AdmissionKind.DUAL_SLO, "both"),
        (Role.PREFILL, AdmissionKind.TTFT_ONLY, "ttft"),
        (Role.DECODE, AdmissionKind.TTFT_ONLY, "none"),  # decoders run rollouts unchecked
        (Role.PREFILL, AdmissionKind.TPOT_ONLY, "none"),  # prefillers run rollouts unchecked
        (Role.DECODE, AdmissionKind.TPOT_ONLY, "tpot"),
        (Role.COLOCATED, AdmissionKind.NONE, "none"),
    ],
)
def test_each_variant_enforces_the_slos_of_fig9(
    role: Role, kind: AdmissionKind, binds: str
) -> None:
    ttft, tpot = 0.2, 0.05
    expect = {"ttft": ttft, "tpot": tpot, "both": min(ttft, tpot), "none": math.inf}[binds]
    assert slack_s(role, kind, ttft, tpot) == expect


@given(
    role=st.sampled_from(list(Role)),
    kind=st.sampled_from(list(AdmissionKind)),
    ttft=st.floats(-1.0, 1.0),
    tpot=st.floats(-1.0, 1.0),
    it=st.floats(0.0, 1.0),
)
def test_dual_slo_admits_only_what_every_variant_would(
    role: Role, kind: AdmissionKind, ttft: float, tpot: float, it: float
) -> None:
    """Dual-SLO is the strictest: an iteration it admits fits the slack under any variant."""
    if admits(slack_s(role, AdmissionKind.DUAL_SLO, ttft, tpot), it):
        assert admits(slack_s(role, kind, ttft, tpot), it)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ConfigError, match="SLOs must be > 0"):
        ServingSlo(ttft_s=0.0, tpot_s=0.1)
    with pytest.raises(ConfigError, match="iteration time"):
        admits(1.0, -0.1)
    with pytest.raises(UnknownPolicyError, match="dual_slo"):
        ADMISSION_POLICIES.get("fastest")
    with pytest.raises(ConfigError, match="stall timeout"):
        StallWatch(0.0)


def test_a_request_without_progress_for_two_seconds_is_stalled() -> None:
    watch = StallWatch()
    watch.progress(1, 0.0)
    watch.progress(2, 0.5)
    assert watch.next_deadline() == 2.0
    assert watch.stalled(1.99) == []
    watch.progress(1, 1.5)  # it advanced: the clock restarts
    assert watch.stalled(2.5) == [2]
    assert 2 not in watch and 1 in watch
    assert watch.stalled(3.5) == [1]
    assert watch.next_deadline() is None and len(watch) == 0
