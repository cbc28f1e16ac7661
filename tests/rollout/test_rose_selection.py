"""Which serving instances a job borrows: the least used over the last hour, each lent to at
most one job, given back when the job ends."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom.core.errors import ConfigError
from loom.rollout.rose.selection import Lending, UsageSample


def test_the_least_used_over_the_window_are_lent_first() -> None:
    led = Lending(["a", "b", "c", "d"])
    samples = [
        UsageSample("a", 100.0, 0.9),  # outside the hour before t=4000
        UsageSample("a", 3900.0, 0.1),
        UsageSample("b", 3900.0, 0.5),
        UsageSample("c", 3950.0, 0.3),
        UsageSample("c", 3990.0, 0.5),
    ]
    assert led.mean_usage(samples, now=4000.0) == {"a": 0.1, "b": 0.5, "c": 0.4, "d": 0.0}
    assert led.borrow("job1", 2, samples, now=4000.0) == ["d", "a"]
    assert led.borrow("job2", 5, samples, now=4000.0) == ["c", "b"]  # only what is left
    assert led.jobs() == {"job1": ["a", "d"], "job2": ["b", "c"]}
    assert led.give_back("job1") == ["a", "d"]
    assert led.borrow("job3", 1, samples, now=4000.0) == ["d"]


def test_bad_input_is_refused() -> None:
    led = Lending(["a"])
    with pytest.raises(ConfigError, match="unknown instance"):
        led.borrow("j", 1, [UsageSample("z", 0.0, 0.1)], now=1.0)
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        led.borrow("j", 1, [UsageSample("a", 0.0, 1.5)], now=1.0)
    led.borrow("j", 1, [], now=1.0)
    with pytest.raises(ConfigError, match="already borrows"):
        led.borrow("j", 1, [], now=1.0)
    with pytest.raises(ConfigError, match="unique"):
        Lending(["a", "a"])


@given(st.lists(st.tuples(st.sampled_from("jklm"), st.integers(0, 6), st.booleans()), max_size=20))
def test_an_instance_is_lent_to_at_most_one_job(ops: list[tuple[str, int, bool]]) -> None:
    led = Lending([f"s{i}" for i in range(10)])
    for job, n, back in ops:
        if back:
            led.give_back(job)
        elif job not in led.lent.values():
            got = led.borrow(job, n, [], now=0.0)
            assert len(got) == min(n, 10 - (len(led.lent) - len(got)))
        owners = [i for lst in led.jobs().values() for i in lst]
        assert len(owners) == len(set(owners)) == len(led.lent)
