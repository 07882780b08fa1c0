"""The launcher of sandbox.run_python: a script that run_python runs as root for each call.

  python -I -S sandbox_launcher.py STATUS_FD < orders.json

It imports nothing of tba_jax (it runs under the base interpreter, without site-packages).
Its orders (JSON on stdin) come from run_python; its own failures go to the pipe STATUS_FD,
which the code never holds, never to the code's output. Three processes:
- supervise: root in the host's namespaces; gets SIGTERM when its caller dies
  (PR_SET_PDEATHSIG) and then kills the init; removes the mount point and the cgroup leaves
  once the init is gone;
- init: pid 1 of fresh pid, mount and network namespaces, SIGKILLed when the supervisor
  dies; it builds the root, ends with the code's process or at the deadline, and when it
  ends the kernel kills every process of its pid namespace;
- run_code: joins the cgroup leaves, takes the limits, the call's uid and the seccomp
  filter, and execs the interpreter on the code.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import resource
import signal
import struct
import sys
import time
import traceback

libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 32, 4096, 16384, 1 << 18)
CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, SECCOMP_MODE_FILTER = 1, 22, 38, 2

# --- Seccomp: the syscalls the code gets EPERM for -------------------------------------------
# Kernel keyrings (a uid's keys outlive its call), eBPF, io_uring, perf events, userfaultfd and
# ptrace: attack surface that no print() needs. (machine -> audit arch, syscall numbers.)
DENIED_SYSCALLS = {
    "x86_64": (0xC000003E, {"ptrace": 101, "add_key": 248, "request_key": 249, "keyctl": 250,
                            "perf_event_open": 298, "bpf": 321, "userfaultfd": 323,
                            "io_uring_setup": 425, "io_uring_enter": 426,
                            "io_uring_register": 427}),
    "aarch64": (0xC00000B7, {"ptrace": 117, "add_key": 217, "request_key": 218, "keyctl": 219,
                             "perf_event_open": 241, "bpf": 280, "userfaultfd": 282,
                             "io_uring_setup": 425, "io_uring_enter": 426,
                             "io_uring_register": 427}),
}
_BPF_LD_ABS, _BPF_JEQ, _BPF_JGE, _BPF_RET = 0x20, 0x15, 0x35, 0x06
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
_X32_SYSCALL_BIT = 0x40000000


def seccomp_filter(machine: str) -> bytes | None:
  """The classic-BPF program (struct sock_filter[]) of DENIED_SYSCALLS for `machine`
  (platform.machine()), or None for a machine it does not know."""
  if machine not in DENIED_SYSCALLS:
    return None
  arch, numbers = DENIED_SYSCALLS[machine]
  checks = [(_BPF_JGE, _X32_SYSCALL_BIT)] if machine == "x86_64" else []  # x32's calls
  checks += [(_BPF_JEQ, nr) for nr in sorted(numbers.values())]
  deny = 3 + len(checks) + 1  # the index of the EPERM return; jumps count from the next one
  program = [(_BPF_LD_ABS, 0, 0, 4),  # seccomp_data.arch: another ABI means other numbers
             (_BPF_JEQ, 0, deny - 2, arch),
             (_BPF_LD_ABS, 0, 0, 0)]  # seccomp_data.nr
  program += [(op, deny - i - 1, 0, k) for i, (op, k) in enumerate(checks, start=3)]
  program += [(_BPF_RET, 0, 0, _SECCOMP_RET_ALLOW),
              (_BPF_RET, 0, 0, _SECCOMP_RET_ERRNO | errno.EPERM)]
  return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


# --- The three processes ---------------------------------------------------------------------
class Failed(Exception):
  """A step of the launcher failed: its message is the status report."""


class SockFprog(ctypes.Structure):
  _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def check(result, what):
  if result != 0:
    raise Failed(f"{what}: {os.strerror(ctypes.get_errno())}")


def prctl(option, *args):  # unused arguments must be 0: pass all four, as full words
  return libc.prctl(option, *(ctypes.c_ulong(x) for x in (args + (0, 0, 0, 0))[:4]))


def mount(src, dst, fs, flags, data=None):
  check(libc.mount(src.encode(), dst.encode(), fs.encode() if fs else None, flags,
                   data.encode() if data else None), f"mount {dst}")


def exit_code(wait_status):
  if os.WIFSIGNALED(wait_status):
    return 128 + os.WTERMSIG(wait_status)
  return os.WEXITSTATUS(wait_status)


def remove_leaves(leaves):
  """rmdir each cgroup leaf; a leaf is busy until the kernel has reaped its last process."""
  for leaf in leaves:
    deadline = time.monotonic() + 5.0
    while True:
      try:
        os.rmdir(leaf)
      except FileNotFoundError:
        pass
      except OSError as e:
        if e.errno == errno.EBUSY and time.monotonic() < deadline:
          time.sleep(0.01)
          continue
      break


def cleanup(o):
  """Removes the call's cgroup leaves and its mount point. The caller does it again: both
  are idempotent."""
  remove_leaves(o["cgroups"])
  try:
    os.rmdir(o["root"])
  except OSError:
    pass


def supervise(o):
  child = [None]  # the init's pid once forked; 0 once it has exited (nothing left to kill)

  def stop(*_):  # the caller died (PR_SET_PDEATHSIG) or ends the call early
    if child[0] is None:
      cleanup(o)
      os._exit(128 + signal.SIGTERM)
    if child[0]:
      os.kill(child[0], signal.SIGKILL)  # the init: its namespace dies with it

  signal.signal(signal.SIGTERM, stop)
  check(prctl(PR_SET_PDEATHSIG, signal.SIGTERM), "prctl(PR_SET_PDEATHSIG)")
  if os.getppid() != o["caller"]:  # it died before the line above
    stop()
  check(libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")  # the next child is its pid 1
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # until `child` is known
  pid = os.fork()
  if pid == 0:
    init(o)
  child[0] = pid
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
  # Wait without reaping: until the reap below, a late SIGKILL from stop() hits the init's
  # zombie, never a process that reused its pid. The init exits only once every process of
  # its namespace is gone.
  os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
  child[0] = 0
  _, wait_status = os.waitpid(pid, 0)
  cleanup(o)
  os._exit(exit_code(wait_status))


def init(o):
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
  check(prctl(PR_SET_PDEATHSIG, signal.SIGKILL), "prctl(PR_SET_PDEATHSIG)")
  # The deadline, inside the namespace: holds even when the supervisor is gone.
  signal.signal(signal.SIGALRM, lambda *_: os._exit(128 + signal.SIGKILL))
  signal.setitimer(signal.ITIMER_REAL, o["timeout_s"])
  check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare(CLONE_NEWNS | CLONE_NEWNET)")
  leaves = [os.open(f"{leaf}/cgroup.procs", os.O_WRONLY) for leaf in o["cgroups"]]
  with open("/proc/self/oom_score_adj", "w") as f:  # inherited: the OOM killer's first pick
    f.write("1000")
  os.nice(o["nice"])
  root = o["root"]
  mount("none", "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host
  mount("sandbox", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={o['tmpfs_kb']}k,mode=755")
  for link in ("bin", "lib", "lib64"):
    if os.path.islink("/" + link):
      os.symlink(os.readlink("/" + link), os.path.join(root, link))
  for src in ("/usr", o["prefix"]):
    dst = root + src
    os.makedirs(dst, exist_ok=True)
    mount(src, dst, None, MS_BIND | MS_REC)
    mount(src, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
  os.makedirs(root + "/work")
  os.chown(root + "/work", o["uid"], o["uid"])
  os.chroot(root)
  os.chdir("/work")
  pid = os.fork()
  if pid == 0:
    run_code(o, leaves)
  for fd in leaves:
    os.close(fd)
  while True:  # reap the orphans the code leaves; its main process's end is the call's
    reaped, wait_status = os.waitpid(-1, 0)
    if reaped == pid:
      os._exit(exit_code(wait_status))


def run_code(o, leaves):
  for fd in leaves:  # the leaves' cgroup.procs, opened before the chroot; "0": this process
    os.write(fd, b"0")
    os.close(fd)
  for name, value in o["rlimits"]:
    resource.setrlimit(getattr(resource, name), (value, value))
  os.setgroups([])
  os.setgid(o["uid"])
  os.setuid(o["uid"])
  check(prctl(PR_SET_NO_NEW_PRIVS, 1), "prctl(PR_SET_NO_NEW_PRIVS)")
  program = seccomp_filter(platform.machine())  # None on a machine it does not know
  if program is not None:
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    check(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog)),
          "prctl(PR_SET_SECCOMP)")
  os.set_inheritable(o["status"], False)  # closed by the exec: the code cannot write to it
  env = {"PATH": "/usr/bin", "HOME": "/work", "TMPDIR": "/work", "PYTHONHASHSEED": "0"}
  os.execve(o["exe"], [o["exe"], "-I", "-c", o["code"]], env)


def main(status):
  try:
    orders = json.loads(sys.stdin.buffer.read())
    orders["status"] = status
    devnull = os.open(os.devnull, os.O_RDONLY)  # the code's stdin
    os.dup2(devnull, 0)
    os.close(devnull)
    supervise(orders)
  except BaseException as e:  # in any of the three processes: report, and end that one
    try:
      os.write(status, (str(e) if isinstance(e, Failed) else traceback.format_exc()).encode())
    finally:
      os._exit(1)


if __name__ == "__main__":
  main(int(sys.argv[1]))
