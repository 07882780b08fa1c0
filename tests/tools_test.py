"""The tools a model calls: the ast calculator and the sandboxed Python (tasks/tools.py).

Every sandbox case must come back as a string within its limit and leave nothing behind."""
import os
import time

import pytest

from tba_jax.tasks import tools
from tba_jax.tasks.tools import calculator, run_python

TIMEOUT = 3.0
MARGIN = 3.0  # process start-up and teardown on a loaded 2-core machine


@pytest.mark.parametrize("expression, expected", [
    ("123 * 456", "56088"), ("(2 + 3) * -4", "-20"), ("7 / 2", "3.5"), ("2 ** 10", "1024"),
    ("17 // 5", "3"), ("17 % 5", "2"), (" 1.5 * 2 ", "3")])
def test_calculator_evaluates_arithmetic(expression, expected):
  assert calculator(expression) == expected


@pytest.mark.parametrize("expression", [
    "__import__('os').system('true')", "9 ** 9 ** 9", "10 ** 200 * 10 ** 200", "1 / 0", "x + 1",
    "1 +", "[1, 2]", "(-1) ** 0.5", "1" * 300])
def test_calculator_refuses_everything_else_with_an_error_string(expression):
  assert calculator(expression).startswith("error: ")


def _timed(code, timeout=TIMEOUT, **kw):
  start = time.monotonic()
  out = run_python(code, timeout, **kw)
  elapsed = time.monotonic() - start
  assert elapsed < timeout + MARGIN, (elapsed, out)
  return out


def _sandbox_processes():
  out = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      if 1_000_000 <= os.stat(f"/proc/{pid}").st_uid < 1_065_536:
        out.append(pid)
    except FileNotFoundError:
      pass
  return out


def _no_sandbox_processes_left():
  # The kernel kills a dead pid namespace's processes asynchronously: allow it a moment.
  deadline = time.monotonic() + 5.0
  while _sandbox_processes() and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not _sandbox_processes(), "processes of a sandbox uid outlived their call"


def test_run_python_returns_what_the_code_prints():
  assert _timed("print(6 * 7)") == "42\n"


def test_run_python_working_directory_is_private_and_writable():
  out = _timed("import os; open('a', 'w').write('x'); print(os.getcwd(), os.listdir('.'))")
  assert out == "/work ['a']\n"


def test_os_system_cannot_reach_the_runs_files(tmp_path):
  marker = tmp_path / "marker"
  out = _timed(f"import os; print(os.system('ls /work/main; touch {marker}'))")
  assert "No such file or directory" in out and not marker.exists()


def test_reading_outside_its_directory_fails():
  here = os.path.abspath(__file__)
  assert os.path.exists(here)
  out = _timed(f"print(open({here!r}).read())")
  assert out.startswith("error: ") and "FileNotFoundError" in out


def test_writing_outside_its_directory_fails(tmp_path):
  target = tmp_path / "x"
  for path in (str(target), "/usr/tba_sandbox_test", "/x"):
    out = _timed(f"open({path!r}, 'w').write('x')")
    assert out.startswith("error: ") and "Error" in out, out
  assert not target.exists() and not os.path.exists("/usr/tba_sandbox_test")


def test_no_network_not_even_loopback():
  out = _timed("import socket; s = socket.socket(); s.settimeout(1); "
               "s.connect(('127.0.0.1', 22)); print('connected')")
  assert out.startswith("error: ") and "connected" not in out.splitlines()[-1:]


def test_fork_bomb_is_bounded_and_cleaned_up():
  code = ("import os, time\nn = 0\ntry:\n  while True:\n    if os.fork() == 0:\n"
          "      time.sleep(60); os._exit(0)\n    n += 1\nexcept OSError:\n  print(n)")
  out = _timed(code)
  assert int(out) < 64
  _no_sandbox_processes_left()


def test_recursive_fork_bomb_times_out_and_is_killed():
  out = _timed("import os\nwhile True:\n  try: os.fork()\n  except OSError: pass", timeout=2.0)
  assert out.startswith("error: ")
  _no_sandbox_processes_left()


def test_infinite_loop_times_out():
  assert _timed("while True: pass").startswith("error: timed out")


def test_cpu_limit_binds_a_busy_process_that_hides_from_the_wall_clock():
  out = _timed("while True: pass", timeout=1.0)
  assert out.startswith("error: ")


def test_printing_100_mb_is_cut_at_the_output_limit():
  out = _timed("print('x' * 100_000_000)", max_output_bytes=1000)
  assert out.startswith("error: output beyond 1000 bytes") and len(out) < 1100


def test_memory_hog_fails():
  out = _timed("x = bytearray(4 * 1024 ** 3)", memory_mb=256)
  assert out.startswith("error: ") and "MemoryError" in out


def test_crash_is_reported():
  assert _timed("import ctypes; ctypes.string_at(0)").startswith("error: killed by signal SIGSEGV")


def test_exit_status_and_traceback_are_reported():
  out = _timed("1 / 0")
  assert out.startswith("error: exit status 1") and "ZeroDivisionError" in out


def test_without_unshare_it_refuses_rather_than_running_unconfined(monkeypatch):
  monkeypatch.setattr(tools.shutil, "which", lambda name: None)
  with pytest.raises(tools.SandboxUnavailable, match="unshare"):
    run_python("print(1)", 1.0)
