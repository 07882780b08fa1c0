"""Stop requests: the first Ctrl-C or SIGTERM is recorded, a second Ctrl-C aborts at once."""
import os
import signal
import threading

import pytest

from tba_jax import interrupts


def _signal(signum):
  os.kill(os.getpid(), signum)  # the handler runs in this (main) thread before kill returns


@pytest.fixture
def stop():
  request = interrupts.StopRequest("/runs/x/checkpoints").install()
  yield request
  request.restore()


def test_a_first_ctrl_c_is_recorded_not_raised_and_said_on_its_own_line(stop, capsys):
  _signal(signal.SIGINT)
  assert stop.signum == signal.SIGINT
  assert capsys.readouterr().err == ("Ctrl-C: stopping after this step, with a checkpoint "
                                     "(Ctrl-C again stops at once, without saving)\n")
  _signal(signal.SIGTERM)  # a later SIGTERM: still the first request, nothing raised
  assert stop.signum == signal.SIGINT


def test_a_second_ctrl_c_raises_at_once_saying_nothing_more_is_saved():
  before = signal.getsignal(signal.SIGINT)  # Python's own in a plain run
  stop = interrupts.StopRequest("/runs/x/checkpoints").install()
  try:
    _signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt, match=r"^Ctrl-C again: stopped at once, without "
                       r"saving; the checkpoints in /runs/x/checkpoints are kept"):
      _signal(signal.SIGINT)
    # The handler from before is back: a third Ctrl-C (were cleanup to hang) interrupts plainly.
    assert signal.getsignal(signal.SIGINT) is before
  finally:
    stop.restore()


def test_repeated_sigterms_only_repeat_the_request(stop, capsys):
  for _ in range(3):
    _signal(signal.SIGTERM)
  assert stop.signum == signal.SIGTERM
  assert capsys.readouterr().err == "SIGTERM: stopping after this step, with a checkpoint\n"


def test_ctrl_c_after_a_preemption_notice_aborts(stop):  # the user wants out now
  _signal(signal.SIGTERM)
  with pytest.raises(KeyboardInterrupt, match="Ctrl-C again: stopped at once"):
    _signal(signal.SIGINT)


def test_once_the_last_step_is_saved_a_signal_says_the_run_finishes(stop, capsys):
  stop.finishing = True
  _signal(signal.SIGINT)
  assert capsys.readouterr().err == ("Ctrl-C: the last step is saved; the final evaluation and "
                                     "export go on (Ctrl-C again stops at once, without "
                                     "saving)\n")
  with pytest.raises(KeyboardInterrupt):
    _signal(signal.SIGINT)


def test_restore_puts_the_previous_handlers_back():
  before = {s: signal.getsignal(s) for s in interrupts.NAMES}
  request = interrupts.StopRequest("d").install()
  assert all(signal.getsignal(s) == request._handle for s in interrupts.NAMES)
  request.restore()
  assert {s: signal.getsignal(s) for s in interrupts.NAMES} == before


def test_installed_from_another_thread_it_leaves_the_handlers_alone():
  before = {s: signal.getsignal(s) for s in interrupts.NAMES}
  thread = threading.Thread(target=lambda: interrupts.StopRequest("d").install())
  thread.start()
  thread.join()
  assert {s: signal.getsignal(s) for s in interrupts.NAMES} == before


def test_the_saved_message_says_which_signal_where_and_how_to_resume():
  assert interrupts.saved_message(signal.SIGINT, 12, "/w/checkpoints", 1) == (
      "Ctrl-C: saved a checkpoint at step 12 in /w/checkpoints; nothing the searchers finished "
      "is lost (work in flight is sampled again). Rerun the same command with the same "
      "--workdir to resume.")
  assert "Rerun the same command on every host" in interrupts.saved_message(
      signal.SIGTERM, 3, "d", 2)
