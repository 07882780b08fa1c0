"""Tools a model calls between its turns: a calculator and a sandboxed Python.

  calculator("123 * 456")             -> "56088"
  run_python("print(2 ** 10)", 5.0)   -> "1024\n"

Both return a string whatever the input: a result, or "error: ..." that the model reads
as the environment's reply. Neither can hurt the run that calls it.

The calculator parses arithmetic with `ast` and walks the tree itself (never eval):
numbers, + - * / // % **, unary signs and parentheses; exponents, operand sizes and the
expression's length are bounded, so `9**9**9` is an error, not a hang.

`run_python` runs model-written code in a separate process (`SANDBOX` below is the
launcher it runs as root before dropping to an unprivileged uid):
- namespaces (`unshare --fork --pid --net --mount --mount-proc --kill-child`): no network
  (a fresh net namespace: not even loopback is up, so 127.0.0.1 refuses), and a pid
  namespace whose init is the launcher: when it ends, or when the caller kills `unshare`
  at the wall-clock limit, the kernel kills every process the code started;
- a fresh root: a size-capped tmpfs holding only read-only binds of /usr and the
  interpreter's prefix, and /work (the throwaway working directory, also in that tmpfs):
  the run's files do not exist there, and everything but /work is read-only;
- limits: RLIMIT_CPU (CPU seconds), RLIMIT_AS (address space), RLIMIT_FSIZE, and
  RLIMIT_NPROC for the 64-process fork bound. The machines run as root, where RLIMIT_NPROC
  binds nothing, and the pid cgroup is not writable here, so the code runs under a uid of
  its own (one per call, from a range no account uses) that is not root: the kernel then
  counts its processes against RLIMIT_NPROC, per call;
- output: at most `max_output_bytes` of stdout + stderr are read; the process is killed
  at the first byte beyond them.
Without user namespaces or mount rights (`unshare` missing or refused) it raises
SandboxUnavailable with the reason, rather than running code unconfined.
"""
from __future__ import annotations

import ast
import itertools
import math
import operator
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time

# --- Calculator ------------------------------------------------------------------------
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_DIGITS = 100  # operands and results beyond 10^100 are refused

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class _CalcError(ValueError):
  pass


def _check_size(x):
  if abs(x) >= 10 ** MAX_DIGITS:
    raise _CalcError(f"a number beyond 10^{MAX_DIGITS}")
  return x


def _evaluate(node):
  if isinstance(node, ast.Expression):
    return _evaluate(node.body)
  if isinstance(node, ast.Constant) and type(node.value) in (int, float):
    return _check_size(node.value)
  if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
    return _UNARY[type(node.op)](_evaluate(node.operand))
  if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
    a, b = _evaluate(node.left), _evaluate(node.right)
    if isinstance(node.op, ast.Pow) and abs(b) > MAX_EXPONENT:
      raise _CalcError(f"an exponent beyond {MAX_EXPONENT}")
    try:
      out = _BINARY[type(node.op)](a, b)
    except ZeroDivisionError:
      raise _CalcError("division by zero") from None
    except OverflowError:
      raise _CalcError("overflow") from None
    if isinstance(out, complex):
      raise _CalcError("a complex result")
    return _check_size(out)
  raise _CalcError(f"unsupported syntax ({type(node).__name__}): numbers, + - * / // % ** "
                   "and parentheses only")


def calculator(expression: str) -> str:
  """The value of an arithmetic expression as text ("56088", "0.5"), or "error: ..."."""
  expression = expression.strip()
  if len(expression) > MAX_EXPRESSION_CHARS:
    return f"error: expression longer than {MAX_EXPRESSION_CHARS} characters"
  try:
    value = _evaluate(ast.parse(expression, mode="eval"))
  except SyntaxError:
    return "error: not an arithmetic expression"
  except _CalcError as e:
    return f"error: {e}"
  if isinstance(value, float):
    if not math.isfinite(value):
      return "error: overflow"
    if value.is_integer() and abs(value) < 2 ** 53:
      return str(int(value))
    return repr(round(value, 10))
  return str(value)


# --- Python in a sandbox -----------------------------------------------------------------
class SandboxUnavailable(RuntimeError):
  """run_python cannot confine code on this machine (no namespaces or mount rights)."""


# The launcher, run by `unshare` as pid 1 of the new namespaces (root there): it builds the
# fresh root, drops to the call's uid under the limits, and runs the code as its child; it
# exits with the child, which ends the pid namespace (every process of the code dies).
SANDBOX = r"""
import ctypes, os, resource, sys
root, uid, code = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cpu, mem, fsize, nproc, tmpfs = (int(x) for x in sys.argv[4:9])
prefix = sys.argv[9]
libc = ctypes.CDLL(None, use_errno=True)
def mount(src, dst, fs, flags, data=None):
  if libc.mount(src.encode(), dst.encode(), fs.encode() if fs else None, flags,
                data.encode() if data else None):
    sys.exit("sandbox: mount %s: %s" % (dst, os.strerror(ctypes.get_errno())))
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
mount("none", "/", None, MS_REC | MS_PRIVATE)
mount("sandbox", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=%dk,mode=755" % tmpfs)
for link in ("bin", "lib", "lib64"):
  if os.path.islink("/" + link):
    os.symlink(os.readlink("/" + link), os.path.join(root, link))
for src in ("/usr", prefix):
  dst = root + src
  os.makedirs(dst, exist_ok=True)
  mount(src, dst, None, MS_BIND | MS_REC)
  mount(src, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
os.makedirs(root + "/work")
os.chown(root + "/work", uid, uid)
os.chroot(root)
os.chdir("/work")
pid = os.fork()
if pid == 0:
  for limit, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem),
                       (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NPROC, nproc),
                       (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, 64)):
    resource.setrlimit(limit, (value, value))
  os.setgroups([])
  os.setgid(uid)
  os.setuid(uid)
  env = {"PATH": "/usr/bin", "HOME": "/work", "TMPDIR": "/work", "PYTHONHASHSEED": "0"}
  os.execve(sys.executable, [sys.executable, "-I", "-c", code], env)
_, status = os.waitpid(pid, 0)
sys.exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
"""

# One uid per call (none of them root or an account), so RLIMIT_NPROC counts each call's
# processes apart; a 2^16 range is reused round-robin.
_UIDS = itertools.cycle(range(1_000_000, 1_065_536))
_UID_LOCK = threading.Lock()


def _interpreter() -> tuple[str, str]:
  """(the base interpreter, its prefix): a venv's python is a link into its base."""
  exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
  return exe, os.path.realpath(sys.base_prefix)


def run_python(code: str, timeout_s: float, *, memory_mb: int = 512,
               max_output_bytes: int = 16_384, max_processes: int = 64,
               disk_mb: int = 16) -> str:
  """What `code` printed (stdout and stderr, in order), or "error: ..." with the output
  so far when it failed, crashed, or ran past a limit (module doc: the sandbox).

  `timeout_s` bounds the wall-clock time and, rounded up, the CPU time of each process.
  """
  if not timeout_s > 0:
    raise ValueError(f"run_python: timeout_s={timeout_s} must be > 0")
  unshare = shutil.which("unshare")
  if unshare is None:
    raise SandboxUnavailable("run_python needs util-linux's `unshare` (not on PATH) for its "
                             "pid, network and mount namespaces")
  exe, prefix = _interpreter()
  with _UID_LOCK:
    uid = next(_UIDS)
  root = tempfile.mkdtemp(prefix="tba_sandbox_")  # only a mount point: the tmpfs goes on it
  args = [unshare, "--fork", "--pid", "--net", "--mount", "--mount-proc", "--kill-child",
          exe, "-I", "-S", "-c", SANDBOX, root, str(uid), code, str(math.ceil(timeout_s)),
          str(memory_mb << 20), str(disk_mb << 20), str(max_processes), str(disk_mb << 10),
          prefix]
  start = time.monotonic()
  try:
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
  except OSError as e:
    os.rmdir(root)
    raise SandboxUnavailable(f"run_python could not start `unshare`: {e}") from None
  out, reason = bytearray(), None
  try:
    while True:
      left = timeout_s - (time.monotonic() - start)
      if left <= 0:
        reason = f"timed out after {timeout_s:g} s"
        break
      ready, _, _ = select.select([proc.stdout], [], [], left)
      if not ready:
        continue
      chunk = os.read(proc.stdout.fileno(), 65536)
      if not chunk:
        break
      out += chunk
      if len(out) > max_output_bytes:
        reason = f"output beyond {max_output_bytes} bytes"
        break
  finally:
    if proc.poll() is None:
      proc.kill()  # --kill-child: the namespace's init dies, and with it every process
    proc.wait()
    proc.stdout.close()
    os.rmdir(root)
  text = bytes(out[:max_output_bytes]).decode("utf-8", "replace")
  if reason is None and proc.returncode != 0:
    if text.startswith("sandbox: "):  # the launcher itself failed (mounts refused)
      raise SandboxUnavailable(f"run_python: {text.strip()} (no mount rights here?)")
    if text.startswith("unshare: "):
      raise SandboxUnavailable(f"run_python: namespaces refused: {text.strip()}")
    reason = _exit_reason(proc.returncode, timeout_s)
  return text if reason is None else f"error: {reason}\n{text}"


def _exit_reason(code: int, timeout_s: float) -> str:
  import signal
  if code > 128 and code - 128 == signal.SIGXCPU:
    return f"CPU time limit ({math.ceil(timeout_s)} s) exceeded"
  if code > 128:
    return f"killed by signal {signal.Signals(code - 128).name}"
  return f"exit status {code}"
