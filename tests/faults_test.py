"""Fault injection: a reward stage that raises on schedule, a process that signals itself."""
import signal
import threading

import numpy as np
import pytest

from tba_jax import faults
from tba_jax.tasks import RewardBatch
from tba_jax.tasks import Problem


def _batch(*ids):
  rows = [i for i in ids for _ in range(2)]  # prompt-major, 2 samples per prompt
  return RewardBatch(problems=[Problem(i, {"question": f"q{i}"}, 0.0) for i in rows],
                     prompts=[[1]] * len(rows), completions=[np.array([2])] * len(rows),
                     ended_with_eos=np.zeros(len(rows), bool), texts=["x"] * len(rows))


def test_a_failing_reward_raises_at_its_nth_batch_only():
  reward = faults.FailingReward(lambda b: np.ones(len(b), np.float32), at_batch=2, repeat=False)
  assert reward(_batch(1, 2)).tolist() == [1.0] * 4
  with pytest.raises(faults.InjectedFault, match=r"reward batch 2, prompt ids \[3, 4\]"):
    reward(_batch(4, 3))
  assert reward(_batch(4, 3)).tolist() == [1.0] * 4  # the retry goes through


def test_a_repeating_failure_follows_the_first_prompt_of_its_batch():
  reward = faults.FailingReward(lambda b: np.zeros(len(b), np.float32), at_batch=1, repeat=True)
  for ids in ((5, 6), (7, 5), (5,)):
    with pytest.raises(faults.InjectedFault):
      reward(_batch(*ids))
  assert reward(_batch(6, 7)).tolist() == [0.0] * 4  # batches without prompt 5 are scored


def test_a_process_stop_signals_this_process_at_its_step_only(capsys):
  seen = threading.Event()
  previous = signal.signal(signal.SIGTERM, lambda *_: seen.set())
  try:
    stop = faults.ProcessStop(at_step=3, signal_name="SIGTERM")
    stop(2)
    assert not seen.is_set()
    stop(3)
    assert seen.wait(10)
  finally:
    signal.signal(signal.SIGTERM, previous)
  assert "stop_at_step=3: sending this process SIGTERM" in capsys.readouterr().out
  with pytest.raises(ValueError, match="signal_name='SIGSTOP'"):
    faults.ProcessStop(at_step=1, signal_name="SIGSTOP")


def test_a_plan_parses_its_text_and_builds_only_what_it_asks_for():
  plan = faults.Plan.parse("searcher_fail_at=3,searcher_fail_repeats=true,searcher=1,"
                           "stop_at_step=5,stop_signal=SIGTERM,stop_process=1")
  assert plan == faults.Plan(3, True, 1, 5, "SIGTERM", 1)
  assert faults.Plan.parse("") == faults.Plan()
  reward = lambda b: np.zeros(len(b), np.float32)
  assert isinstance(plan.reward(reward, 1), faults.FailingReward)
  assert plan.reward(reward, 0) is reward and faults.Plan().reward(reward, 0) is reward
  assert plan.process_stop(0) is None and faults.Plan().process_stop(0) is None
  assert plan.process_stop(1).at_step == 5
  with pytest.raises(ValueError, match="unknown fault 'stop_at'; the faults are searcher_fail_at"):
    faults.Plan.parse("stop_at=5")
  with pytest.raises(ValueError, match="stop_signal='SIGSTOP': must be one of"):
    faults.Plan.parse("stop_signal=SIGSTOP")
