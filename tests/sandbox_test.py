"""The sandboxed Python (tasks/sandbox.py): every case comes back as a string within its limit,
raises only when the host cannot confine code, and leaves nothing behind, not even when its
caller is SIGKILLed."""
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from tba_jax.tasks import sandbox
from tba_jax.tasks.sandbox import SandboxUnavailable, run_python

TIMEOUT = 3.0
MARGIN = 3.0  # process start-up and teardown on a loaded 2-core machine
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True, scope="module")
def _confined_here():
  try:
    sandbox.check_sandbox()
  except SandboxUnavailable as e:
    pytest.skip(f"this machine cannot confine code: {e}")


@pytest.fixture
def uids(monkeypatch):
  """The uids this test's calls ran under."""
  used, claim = [], sandbox._UID_POOL.claim

  def recorded():
    used.append(claim())
    return used[-1]

  monkeypatch.setattr(sandbox._UID_POOL, "claim", recorded)
  return used


def _timed(code, timeout=TIMEOUT, **kw):
  start = time.monotonic()
  out = run_python(code, timeout, **kw)
  elapsed = time.monotonic() - start
  assert elapsed < timeout + MARGIN, (elapsed, out)
  return out


def _stat(pid):
  """/proc/PID/stat's fields after the command's name (state, ppid, ...); None once gone."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()
  except OSError:
    return None


def _live(pids):
  return [pid for pid in pids if (stat := _stat(pid)) and stat[0] != "Z"]  # zombies aside


def _processes(uids=(), marker=None):
  """Live pids running under one of `uids`, or whose command line holds `marker`."""
  out = []
  for pid in _live(int(p) for p in os.listdir("/proc") if p.isdigit()):
    try:
      if os.stat(f"/proc/{pid}").st_uid in uids:
        out.append(pid)
      elif marker is not None:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
          if marker.encode() in f.read():
            out.append(pid)
    except OSError:  # it ended while we looked
      pass
  return out


def _wait_until(predicate, timeout_s):
  deadline = time.monotonic() + timeout_s
  while not predicate() and time.monotonic() < deadline:
    time.sleep(0.05)
  return predicate()


def _descendants(pid):
  children = {}
  for p in (int(p) for p in os.listdir("/proc") if p.isdigit()):
    if (stat := _stat(p)) is not None:
      children.setdefault(int(stat[1]), []).append(p)
  out, todo = set(), [pid]
  while todo:
    for child in children.get(todo.pop(), []):
      out.add(child)
      todo.append(child)
  return out


def _leaves(uid):
  cgroups = sandbox._cgroups()
  parents = set(cgroups[1].values()) if cgroups else set()
  return [p for p in parents if os.path.exists(os.path.join(p, f"tba_sandbox.{uid}"))]


# --- What the code sees ----------------------------------------------------------------------
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


# Numbers from the kernel's syscall tables, apart from the module's own.
SYSCALLS = {"x86_64": {"keyctl": 250, "perf_event_open": 298, "bpf": 321, "io_uring_setup": 425,
                       "userfaultfd": 323, "ptrace": 101},
            "aarch64": {"keyctl": 219, "perf_event_open": 241, "bpf": 280, "io_uring_setup": 425,
                        "userfaultfd": 282, "ptrace": 117}}


def test_denied_syscalls_get_eperm_and_threads_and_processes_still_work():
  if platform.machine() not in SYSCALLS:
    pytest.skip(f"no seccomp filter on {platform.machine()}")
  # keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 0) succeeds unfiltered, as do
  # ptrace(PTRACE_TRACEME) and io_uring_setup's EFAULT and perf_event_open's EFAULT.
  code = ("import ctypes, subprocess, threading\n"
          "libc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
          f"for name, nr in {SYSCALLS[platform.machine()]!r}.items():\n"
          "  ctypes.set_errno(0)\n"
          "  args = (0, -4, 0) if name == 'keyctl' else (0, 0, 0)\n"
          "  print(name, libc.syscall(nr, *args), ctypes.get_errno())\n"
          "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
          "print(subprocess.run(['/usr/bin/echo', 'process'], capture_output=True).stdout)")
  lines = _timed(code).splitlines()
  assert lines[:-2] == [f"{name} -1 1" for name in SYSCALLS[platform.machine()]], lines
  assert lines[-2:] == ["thread", "b'process\\n'"]


def test_code_runs_niced_in_its_own_cgroup_and_first_for_the_oom_killer(uids):
  marker = f"tba_marker_{uuid.uuid4().hex}"
  call = threading.Thread(target=run_python, args=(f"import time  # {marker}\ntime.sleep(2)", 5))
  call.start()
  try:
    assert _wait_until(lambda: _processes(marker=marker), 5.0)
    pid = _processes(marker=marker)[0]
    with open(f"/proc/{pid}/oom_score_adj") as f:
      assert f.read().strip() == "1000"
    assert int(_stat(pid)[16]) == sandbox.NICE
    with open(f"/proc/{pid}/cgroup") as f:
      in_leaf = f"tba_sandbox.{uids[0]}" in f.read()
    assert in_leaf == (sandbox._cgroups() is not None)
  finally:
    call.join()


# --- Limits per call ---------------------------------------------------------------------------
@pytest.mark.parametrize("limits", ["cgroup", "rlimits"])
def test_three_children_of_400_mb_cannot_all_fit_in_512_mb(limits, monkeypatch):
  if limits == "cgroup" and sandbox._cgroups() is None:
    pytest.skip("no cgroup this process can make leaves in")
  if limits == "rlimits":
    monkeypatch.setattr(sandbox, "_cgroups", lambda: None)
  code = ("import os, time\npids = []\nfor _ in range(3):\n  pid = os.fork()\n  if pid == 0:\n"
          "    try:\n      b = bytearray(400 << 20)\n"
          "      b[::4096] = b'x' * len(range(0, len(b), 4096))  # touch every page\n"
          "      time.sleep(1.0)\n    finally:\n      os._exit(0 if 'b' in dir() else 1)\n"
          "  pids.append(pid)\n"
          "print(sum(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) == 0 for p in pids))")
  out = _timed(code, timeout=10.0, memory_mb=512)
  assert out.startswith("error: ") or int(out) < 3, out


def test_fork_bomb_is_bounded_and_cleaned_up(uids):
  code = ("import os, time\nn = 0\ntry:\n  while True:\n    if os.fork() == 0:\n"
          "      time.sleep(60); os._exit(0)\n    n += 1\nexcept OSError:\n  print(n)")
  out = _timed(code)
  assert int(out) < 64
  assert _wait_until(lambda: not _processes(uids=uids), 5.0)


def test_recursive_fork_bomb_times_out_and_is_killed(uids):
  out = _timed("import os\nwhile True:\n  try: os.fork()\n  except OSError: pass", timeout=2.0)
  assert out.startswith("error: ")
  assert _wait_until(lambda: not _processes(uids=uids), 5.0)


def test_infinite_loop_times_out():
  assert _timed("while True: pass").startswith("error: timed out")


def test_cpu_limit_binds_a_busy_process_that_hides_from_the_wall_clock():
  out = _timed("while True: pass", timeout=1.0)
  assert out.startswith("error: ")


def test_printing_100_mb_is_cut_at_the_output_limit():
  out = _timed("for _ in range(100): print('x' * 1_000_000)", max_output_bytes=1000)
  assert out.startswith("error: output beyond 1000 bytes") and len(out) < 1100


def test_memory_hog_fails():
  out = _timed("x = bytearray(4 * 1024 ** 3)", memory_mb=256)
  assert out.startswith("error: ") and "MemoryError" in out


def test_crash_is_reported():
  assert _timed("import ctypes; ctypes.string_at(0)").startswith("error: killed by signal SIGSEGV")


def test_exit_status_and_traceback_are_reported():
  out = _timed("1 / 0")
  assert out.startswith("error: exit status 1") and "ZeroDivisionError" in out


# --- Nothing outlives the call -----------------------------------------------------------------
def test_nothing_sandboxed_survives_its_callers_sigkill(tmp_path):
  marker = f"tba_marker_{uuid.uuid4().hex}"
  code = f"import os, time  # {marker}\nfor _ in range(2):\n  os.fork()\ntime.sleep(60)\n"
  caller = subprocess.Popen(
      [sys.executable, "-c", f"import sys; sys.path.insert(0, {REPO!r}); "
       "from tba_jax.tasks.sandbox import run_python; run_python(sys.stdin.read(), 30.0)"],
      stdin=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
  caller.stdin.write(code)
  caller.stdin.close()
  try:
    assert _wait_until(lambda: len(_processes(marker=marker)) == 4, 10.0)
    launched = _descendants(caller.pid)  # the launcher, the init and the code's processes
    assert set(_processes(marker=marker)) <= launched and len(launched) == 6
    uid = os.stat(f"/proc/{_processes(marker=marker)[0]}").st_uid
    assert os.listdir(tmp_path)  # the mount point
    assert bool(_leaves(uid)) == (sandbox._cgroups() is not None)
  finally:
    caller.kill()
    caller.wait()
  left = lambda: _live(launched) + _processes(uids={uid})
  try:
    assert _wait_until(lambda: not left(), 10.0), left()
  finally:
    for pid in left():  # a failed run leaves nothing running either
      os.kill(pid, signal.SIGKILL)
  assert _wait_until(lambda: not os.listdir(tmp_path) and not _leaves(uid), 5.0), (
      os.listdir(tmp_path), _leaves(uid))


def test_the_init_ends_the_call_at_the_deadline_without_the_caller(monkeypatch, uids):
  read = sandbox._read_output  # a caller that never stops the call itself
  monkeypatch.setattr(sandbox, "_read_output",
                      lambda proc, start, timeout_s, max_bytes: read(proc, start, 1e9, max_bytes))
  out = _timed("import os, time\nos.fork()\ntime.sleep(60)", timeout=1.0)
  assert out.startswith("error: killed by signal SIGKILL"), out
  assert _wait_until(lambda: not _processes(uids=uids), 5.0)


# --- Uids ------------------------------------------------------------------------------------
def test_calls_in_parallel_processes_get_different_uids():
  script = (f"import sys; sys.path.insert(0, {REPO!r}); from tba_jax.tasks.sandbox import "
            "run_python; print(run_python('import os, time; print(os.getuid()); time.sleep(1)',"
            " 10.0), end='')")
  callers = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
  printed = [int(c.communicate(timeout=30)[0]) for c in callers]
  assert len(set(printed)) == 2 and all(uid in sandbox.UIDS for uid in printed), printed


def test_calls_in_parallel_threads_get_different_uids():
  printed = []
  calls = [threading.Thread(target=lambda: printed.append(
      _timed("import os, time; print(os.getuid()); time.sleep(0.5)"))) for _ in range(3)]
  for call in calls:
    call.start()
  for call in calls:
    call.join()
  assert len(set(printed)) == 3, printed


# --- Who raises --------------------------------------------------------------------------------
@pytest.mark.parametrize("printed", ["sandbox: mount /: refused", "unshare: refused"])
def test_code_printing_the_launchers_words_gets_an_error_reply(printed):
  out = _timed(f"print({printed!r}); raise SystemExit(1)")
  assert out == f"error: exit status 1\n{printed}\n"


@pytest.mark.parametrize("code, reason", [
    ("print(1)\0", "NUL byte"), ("print('\ud800')", "surrogate"),
    ("x = 1\n" * 20_000, "longer than")])
def test_code_no_interpreter_can_take_gets_an_error_reply(code, reason):
  out = run_python(code, TIMEOUT)
  assert out.startswith("error: ") and reason in out


def test_a_launcher_that_fails_raises_with_its_reason(monkeypatch):
  exe, _ = sandbox._interpreter()
  monkeypatch.setattr(sandbox, "_interpreter", lambda: (exe, "/nonexistent/tba_prefix"))
  with pytest.raises(SandboxUnavailable, match="mount .*No such file"):
    run_python("print(1)", TIMEOUT)
  with pytest.raises(SandboxUnavailable, match="mount .*No such file"):
    sandbox.check_sandbox()


def test_check_sandbox_says_how_calls_are_bounded():
  assert sandbox.check_sandbox().startswith("cgroup v") == (sandbox._cgroups() is not None)
