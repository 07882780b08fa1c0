"""Stop requests: SIGTERM and Ctrl-C save a checkpoint and stop; a second Ctrl-C aborts.

A preemption notice (SIGTERM) or a first Ctrl-C (SIGINT) only records the signal.
The loop exchanges it with every host at its next step (distributed.broadcast_max),
so every process saves the same step and returns, whichever host was signalled. An
evaluation in progress reads the request too (`signum`, through the loop's
`should_stop`) and is abandoned on every host at once (evaluation.py): the run saves the
step it evaluated, without finishing the evaluation or taking another update.
A second Ctrl-C is for a user who cannot wait for that step: it raises
KeyboardInterrupt at once, saving nothing more (the checkpoints already written
stay, and a rerun resumes from the newest). Repeated SIGTERMs (schedulers resend
them) only repeat the request. Once the last step is saved (`finishing`), a first
signal only says that the final evaluation and export go on.

Handlers are installed only from the main thread (Python delivers signals
there); a run started in another thread (a notebook's) keeps the default ones.
"""
from __future__ import annotations

import signal
import sys
import threading

import tqdm

# The stop signals, as the run's messages name them; the largest number wins when hosts
# received different ones (distributed.broadcast_max).
NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class StopRequest:
  """The first stop signal received (`signum`, 0 for none) while installed."""

  def __init__(self, checkpoints: str):
    self.checkpoints = checkpoints  # where the kept checkpoints are, for the messages
    self.signum = 0
    self.finishing = False  # the last step is saved: only the evaluation and export are left
    self._previous: dict[int, object] = {}

  def install(self) -> "StopRequest":
    if threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._handle) for s in NAMES}
    return self

  def restore(self) -> None:
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    self._previous = {}

  def _handle(self, signum, frame) -> None:
    del frame
    if signum == signal.SIGINT and self.signum:
      self.restore()  # a third Ctrl-C, should cleanup hang, is Python's own
      raise KeyboardInterrupt(
          f"{NAMES[signum]} again: stopped at once, without saving; the checkpoints in "
          f"{self.checkpoints} are kept (rerun the same command to resume from the newest)")
    if not self.signum:
      self.signum = signum
      again = " (Ctrl-C again stops at once, without saving)" if signum == signal.SIGINT else ""
      doing = ("the last step is saved; the final evaluation and export go on" if self.finishing
               else "stopping after this step, with a checkpoint")
      # tqdm.write: on a line of its own, not glued to the progress bar.
      tqdm.tqdm.write(f"{NAMES[signum]}: {doing}{again}", file=sys.stderr)


def saved_message(signum: int, step: int, directory: str, hosts: int) -> str:
  """What a run stopped by `signum` prints once every process saved `step`."""
  everywhere = " on every host" if hosts > 1 else ""
  return (f"{NAMES[signum]}: saved a checkpoint at step {step} in {directory}; nothing the "
          f"searchers finished is lost (work in flight is sampled again). Rerun the same "
          f"command{everywhere} with the same --workdir to resume.")
