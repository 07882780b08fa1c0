"""Python for model-written code: `run_python(code, timeout_s)` -> what the code printed.

  run_python("print(2 ** 10)", 5.0)   -> "1024\n"
  run_python("1 / 0", 5.0)            -> "error: exit status 1\nTraceback ..."
  check_sandbox()                     -> "cgroup v1 leaf per call (cpu, memory, pids)"

It returns a string whatever the code does: what the code printed, or "error: ..." with the
output so far when the code failed, crashed or ran past a limit. It raises
SandboxUnavailable only when this host cannot confine code (no namespaces, no mount rights),
never because of what the code does; `check_sandbox()` finds that out once, at start.

The caller starts the launcher (sandbox_launcher.py, root), which supervises the call from
the host's namespaces and forks the init of fresh pid, mount and network namespaces, which
forks the code's process:
- tied to the caller: the launcher gets SIGTERM when its caller dies (PR_SET_PDEATHSIG) and
  kills the init; the init gets SIGKILL when the launcher dies, and itself ends the call at
  the deadline (`timeout_s`); when the init ends, the kernel kills every process of its pid
  namespace. Nothing outlives the call, its deadline or its caller;
- no network (a fresh net namespace: not even loopback is up, so 127.0.0.1 refuses);
- a fresh root: a size-capped tmpfs holding read-only binds of /usr and the interpreter's
  prefix, and /work (the throwaway working directory, also in that tmpfs): the run's files
  do not exist there, and everything but /work is read-only;
- limits per call: where this process can make cgroups (v2, else v1; found once by making a
  test leaf), the code runs in a leaf of its own under the caller's cgroup: memory
  `memory_mb` (swap 0) for all its processes together, `max_processes` pids, `cpus` CPUs
  (where the cpu controller is usable). Elsewhere each process gets an equal share:
  RLIMIT_AS = memory_mb / n, n = min(max_processes, FALLBACK_MAX_PROCESSES) processes at
  most (RLIMIT_NPROC: per call, as each call has a uid of its own). Always: RLIMIT_AS <=
  memory_mb, RLIMIT_CPU = ceil(timeout_s) per process, RLIMIT_FSIZE, 64 files, no core
  files, nice 10, and oom_score_adj 1000 (the OOM killer takes the code before the trainer);
- a uid of its own from UIDS (no account's, never root), claimed host-wide: byte i of a lock
  file under /run is locked while UIDS[i] runs a call, and a shared cursor moves past it, so
  two calls never share a uid and a uid comes back only after the range has gone round;
- a seccomp filter (x86_64, aarch64; none elsewhere) answering EPERM to keyctl, add_key,
  request_key, bpf, io_uring_*, perf_event_open, userfaultfd and ptrace, and to every call
  of another ABI (x32, i386);
- output: at most `max_output_bytes` of stdout + stderr are read; the call is stopped at
  the first byte beyond them.
The launcher reports its own failures on a pipe the code never holds (closed on exec): only
those raise SandboxUnavailable. The mount point and the cgroup leaves are removed on every
path, by the launcher (also when its caller dies) and again by the caller. Code over
MAX_CODE_BYTES, or holding NUL bytes or lone surrogates, gets an error reply unrun.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import math
import os
import platform
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

from tba_jax.tasks import sandbox_launcher

UIDS = range(1_000_000, 1_000_000 + (1 << 16))  # no account's; none is root
NICE = 10
FALLBACK_MAX_PROCESSES = 4  # without cgroups: the process cap, and memory's divisor
MAX_CODE_BYTES = 100_000  # the code travels as one argv string (the kernel's cap: 128 KiB)
CPU_PERIOD_US = 100_000
LAUNCHER = os.path.abspath(sandbox_launcher.__file__)


class SandboxUnavailable(RuntimeError):
  """run_python cannot confine code on this host (no namespaces, mount rights, ...)."""


# --- Limits per call: a cgroup leaf where the host allows one ------------------------------
def _own_cgroups() -> tuple[str | None, dict[str, str]]:
  """(the cgroup v2 directory, {v1 controller: directory}) this process runs in."""
  paths = {}  # "memory" / "cpu,cpuacct" / "" (v2) -> path in that hierarchy
  with open("/proc/self/cgroup") as f:
    for line in f:
      _, controllers, path = line.rstrip("\n").split(":", 2)
      paths[controllers] = path
  v2, v1 = None, {}
  with open("/proc/self/mountinfo") as f:
    for line in f:
      fields = line.split()
      mount_root, mount_point = fields[3], fields[4]
      fs_type, options = fields[fields.index("-") + 1], fields[-1].split(",")
      for key, path in paths.items():
        if mount_root != "/" and not path.startswith(mount_root):
          continue
        directory = os.path.normpath(mount_point + path[len(mount_root.rstrip("/")):])
        if fs_type == "cgroup2" and key == "":
          v2 = directory
        elif fs_type == "cgroup" and key and set(key.split(",")) <= set(options):
          v1.update((c, directory) for c in key.split(",") if c in ("memory", "pids", "cpu"))
  return v2, v1


def _limit_files(version: int, controller: str, memory: int, processes: int,
                 cpus: float) -> dict[str, str]:
  quota = str(max(1000, int(cpus * CPU_PERIOD_US)))
  return {(2, "memory"): {"memory.max": str(memory), "memory.swap.max": "0"},
          (2, "pids"): {"pids.max": str(processes)},
          (2, "cpu"): {"cpu.max": f"{quota} {CPU_PERIOD_US}"},
          (1, "memory"): {"memory.limit_in_bytes": str(memory),  # before memsw: memsw >= it
                          "memory.memsw.limit_in_bytes": str(memory)},
          (1, "pids"): {"pids.max": str(processes)},
          (1, "cpu"): {"cpu.cfs_period_us": str(CPU_PERIOD_US), "cpu.cfs_quota_us": quota},
          }[version, controller]


def _make_leaves(cgroups: tuple[int, dict[str, str]], name: str, memory: int, processes: int,
                 cpus: float) -> list[str]:
  """Makes the leaf `name` under each parent in `cgroups` with its limits; its directories.
  Files a kernel lacks (swap accounting off) are skipped; any other failure raises OSError."""
  version, parents = cgroups
  leaves: dict[str, dict[str, str]] = {}
  for controller, parent in parents.items():
    leaves.setdefault(os.path.join(parent, name), {}).update(
        _limit_files(version, controller, memory, processes, cpus))
  made = []
  try:
    for leaf, files in leaves.items():
      try:
        os.mkdir(leaf)
      except FileExistsError:  # left by a call whose caller and launcher were both killed
        os.rmdir(leaf)
        os.mkdir(leaf)
      made.append(leaf)
      for file, value in files.items():
        if file.split(".")[1] in ("swap", "memsw") and not os.path.exists(f"{leaf}/{file}"):
          continue
        with open(f"{leaf}/{file}", "w") as f:
          f.write(value)
  except OSError:
    sandbox_launcher.remove_leaves(made)
    raise
  return made


@functools.cache
def _cgroups() -> tuple[int, dict[str, str]] | None:
  """(version, {controller: parent directory}) where this process can make per-call leaves
  with memory and pids limits (cpu where it can too), or None: the rlimit fallback."""
  try:
    v2, v1 = _own_cgroups()
  except OSError:
    return None
  options = []
  if v2 is not None:
    try:
      with open(f"{v2}/cgroup.controllers") as f:
        available = set(f.read().split()) & {"memory", "pids", "cpu"}
      with open(f"{v2}/cgroup.subtree_control") as f:
        missing = available - set(f.read().split())
      if {"memory", "pids"} <= available:
        options += [(2, {c: v2 for c in sorted(available)}), (2, {"memory": v2, "pids": v2})]
      if {"memory", "pids"} <= available and missing:
        # Fails (EBUSY) where this cgroup holds processes and is not the root: no v2 then.
        with open(f"{v2}/cgroup.subtree_control", "w") as f:
          f.write(" ".join(f"+{c}" for c in sorted(missing)))
    except OSError:
      pass
  if {"memory", "pids"} <= v1.keys():
    options += [(1, v1), (1, {"memory": v1["memory"], "pids": v1["pids"]})]
  for option in options:
    try:  # a test leaf proves the rights: mkdir, every limit file, rmdir
      probe = _make_leaves(option, f"tba_sandbox.probe{os.getpid()}", 1 << 30, 64, 1.0)
      sandbox_launcher.remove_leaves(probe)
      return option
    except OSError:
      continue
  return None


# --- One uid per call, host-wide -------------------------------------------------------------
class _UidPool:
  """Byte 8 + i of a lock file is locked (fcntl.lockf) while UIDS[i] runs a call; bytes
  [0, 8) hold a cursor shared by every process, so a freed uid waits for the range to go
  round. POSIX locks belong to the process (a second lock by it succeeds, and closing any
  descriptor of the file drops them all): `held` and one descriptor kept open cover that."""

  def __init__(self, path: str):
    self._path, self._fd, self._held, self._lock = path, -1, set(), threading.Lock()

  def claim(self) -> int:
    with self._lock:
      if self._fd < 0:
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                           0o600)
      fcntl.lockf(self._fd, fcntl.LOCK_EX, 8, 0)  # the cursor: one claim at a time
      try:
        cursor = int.from_bytes(os.pread(self._fd, 8, 0).ljust(8, b"\0"), "little")
        for step in range(len(UIDS)):
          i = (cursor + step) % len(UIDS)
          if i in self._held:
            continue
          try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 8 + i)
          except OSError:  # another process runs a call under it
            continue
          self._held.add(i)
          os.pwrite(self._fd, ((i + 1) % len(UIDS)).to_bytes(8, "little"), 0)
          return UIDS[i]
      finally:
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 8, 0)
    raise SandboxUnavailable(f"run_python: all {len(UIDS)} sandbox uids are in use")

  def release(self, uid: int) -> None:
    with self._lock:
      fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 8 + uid - UIDS.start)
      self._held.discard(uid - UIDS.start)

  @contextlib.contextmanager
  def claimed(self):
    uid = self.claim()
    try:
      yield uid
    finally:
      self.release(uid)


_UID_POOL = _UidPool("/run/tba_sandbox.uids" if os.access("/run", os.W_OK)
                     else "/tmp/tba_sandbox.uids")


# --- The caller ------------------------------------------------------------------------------
def _interpreter() -> tuple[str, str]:
  """(the base interpreter, its prefix): a venv's python is a link into its base."""
  exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
  return exe, os.path.realpath(sys.base_prefix)


def _refusal(code: str) -> str | None:
  """Why `code` cannot even be handed to an interpreter, or None."""
  if "\0" in code:
    return "the code contains a NUL byte"
  try:
    size = len(code.encode("utf-8"))
  except UnicodeEncodeError:
    return "the code is not valid UTF-8 (a lone surrogate)"
  return f"the code is longer than {MAX_CODE_BYTES} bytes" if size > MAX_CODE_BYTES else None


def run_python(code: str, timeout_s: float, *, memory_mb: int = 512,
               max_output_bytes: int = 16_384, max_processes: int = 64,
               disk_mb: int = 16, cpus: float = 1.0) -> str:
  """What `code` printed (stdout and stderr, in order), or "error: ..." with the output
  so far when it failed, crashed, or ran past a limit (module doc: the sandbox).

  `timeout_s` bounds the wall-clock time and, rounded up, the CPU time of each process;
  `memory_mb`, `max_processes` and `cpus` bound the call as a whole (module doc: limits).
  """
  if not timeout_s > 0:
    raise ValueError(f"run_python: timeout_s={timeout_s} must be > 0")
  if (refusal := _refusal(code)) is not None:
    return f"error: {refusal}"
  if not sys.platform.startswith("linux"):
    raise SandboxUnavailable(f"run_python needs Linux's namespaces, not {sys.platform}")
  cgroups, memory = _cgroups(), memory_mb << 20
  processes = max_processes if cgroups else min(max_processes, FALLBACK_MAX_PROCESSES)
  address_space = memory if cgroups else memory // processes
  exe, prefix = _interpreter()
  start = time.monotonic()
  with _UID_POOL.claimed() as uid, tempfile.TemporaryDirectory(
      prefix="tba_sandbox_", ignore_cleanup_errors=True) as root:  # the tmpfs's mount point
    status_r, status_w = os.pipe()
    leaves, proc = [], None
    try:
      if cgroups:
        try:
          leaves = _make_leaves(cgroups, f"tba_sandbox.{uid}", memory, max_processes, cpus)
        except OSError as e:
          raise SandboxUnavailable(f"run_python: cannot make the call's cgroup: {e}") from None
      orders = {"caller": os.getpid(), "root": root, "uid": uid, "code": code, "exe": exe,
                "prefix": prefix, "timeout_s": timeout_s, "tmpfs_kb": disk_mb << 10,
                "cgroups": leaves, "nice": NICE,
                "rlimits": [("RLIMIT_CPU", math.ceil(timeout_s)), ("RLIMIT_AS", address_space),
                            ("RLIMIT_FSIZE", disk_mb << 20), ("RLIMIT_NPROC", processes),
                            ("RLIMIT_CORE", 0), ("RLIMIT_NOFILE", 64)]}
      try:
        proc = subprocess.Popen([exe, "-I", "-S", LAUNCHER, str(status_w)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, pass_fds=(status_w,),
                                start_new_session=True)
      except OSError as e:
        raise SandboxUnavailable(f"run_python could not start its launcher: {e}") from None
      os.close(status_w)
      status_w = -1
      try:
        proc.stdin.write(json.dumps(orders).encode())
        proc.stdin.close()
      except BrokenPipeError:  # the launcher died at once: its status says why
        pass
      out, reason = _read_output(proc, start, timeout_s, max_output_bytes)
    finally:
      if proc is not None:
        _stop(proc)
      failure = _read_status(status_r)
      for fd in (status_r, status_w):
        if fd >= 0:
          os.close(fd)
      sandbox_launcher.remove_leaves(leaves)  # the launcher did this too, unless it was killed
  if failure:
    raise SandboxUnavailable(f"run_python's launcher failed: {failure.strip()}")
  text = bytes(out[:max_output_bytes]).decode("utf-8", "replace")
  if reason is None and proc.returncode != 0:
    reason = _exit_reason(proc.returncode, timeout_s)
  return text if reason is None else f"error: {reason}\n{text}"


def _read_output(proc, start: float, timeout_s: float, max_bytes: int
                 ) -> tuple[bytearray, str | None]:
  """(what the code printed, why the call stopped early or None) read until EOF."""
  out = bytearray()
  while True:
    left = timeout_s - (time.monotonic() - start)
    if left <= 0:
      return out, f"timed out after {timeout_s:g} s"
    ready, _, _ = select.select([proc.stdout], [], [], left)
    if not ready:
      continue
    chunk = os.read(proc.stdout.fileno(), 65536)
    if not chunk:
      return out, None
    out += chunk
    if len(out) > max_bytes:
      return out, f"output beyond {max_bytes} bytes"


def _stop(proc) -> None:
  """Ends the launcher: SIGTERM lets it kill the namespace and clean up; SIGKILL if not."""
  if proc.poll() is None:
    proc.terminate()
    try:
      proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
      proc.kill()  # its init dies with it (PR_SET_PDEATHSIG), and the namespace with that
  proc.wait()
  proc.stdout.close()


def _read_status(fd: int) -> str:
  """What the launcher reported on its status pipe: nothing unless it failed (a few lines)."""
  os.set_blocking(fd, False)  # a launcher killed by SIGKILL may leave its init a moment
  try:
    return os.read(fd, 1 << 16).decode("utf-8", "replace")
  except BlockingIOError:
    return ""


def _exit_reason(code: int, timeout_s: float) -> str:
  if code > 128 and code - 128 == signal.SIGXCPU:
    return f"CPU time limit ({math.ceil(timeout_s)} s) exceeded"
  if code > 128 and code - 128 in signal.valid_signals():
    return f"killed by signal {signal.Signals(code - 128).name}"
  return f"exit status {code}"


def check_sandbox(timeout_s: float = 10.0) -> str:
  """Runs `print(6 * 7)` once: how this host bounds a call (for the log), or
  SandboxUnavailable with the reason, so an environment fails at start, not hours in."""
  out = run_python("print(6 * 7)", timeout_s)
  if out != "42\n":
    raise SandboxUnavailable(f"run_python's check printed {out!r}, not '42\\n'")
  cgroups = _cgroups()
  limits = (f"cgroup v{cgroups[0]} leaf per call ({', '.join(cgroups[1])})" if cgroups else
            f"no usable cgroup: rlimits, at most {FALLBACK_MAX_PROCESSES} processes "
            "sharing memory_mb")
  machine = platform.machine()
  return limits + ("" if sandbox_launcher.seccomp_filter(machine) else
                   f"; no seccomp filter on {machine}")
