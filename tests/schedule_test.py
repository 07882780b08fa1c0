"""The one periodic predicate and the searchers' schedule."""
import pytest

from tba_jax.schedule import Schedule, due


def test_due_fires_every_period_and_at_the_last_step_and_never_for_period_zero():
  assert [d for d in range(1, 11) if due(d, 3)] == [3, 6, 9]
  assert [d for d in range(1, 11) if due(d, 3, total=10)] == [3, 6, 9, 10]
  assert not any(due(d, 0) for d in range(1, 11))
  assert [d for d in range(1, 11) if due(d, 0, total=10)] == [10]


def test_a_window_round_searches_k_x_b_x_m_prompts_and_never_fewer_than_b():
  assert Schedule.of("alternate", 4, 2, 0.5).window_prompts == 4
  assert Schedule.of("alternate", 3, 2, 0.1).window_prompts == 2  # ceil(0.6) < B
  assert Schedule.of("alternate", 1, 2, 1.0) == Schedule("alternate", 1, 2, 2)


def test_a_mode_other_than_async_or_alternate_is_refused():
  with pytest.raises(ValueError, match="mode='asynch'"):
    Schedule("asynch")
