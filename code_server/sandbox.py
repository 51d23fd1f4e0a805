"""The in-sandbox runner: builds one test's sandbox, then runs the program (and its assert) inside it.

The executor starts it by file path as `python -I -X utf8 .../code_server/sandbox.py fd:N`, in a
fresh single-threaded interpreter (never preexec_fn, which is unsafe in the threaded server). So this file
is a script: stdlib only, importing nothing from `code_server` (`-I` keeps both the package and this
file's directory off sys.path, so a program cannot import our modules either; it loads `remote_calls.py`
by path). It reads its job from an anonymous memory file (no path
a program could open), builds the sandbox, then reports on the status pipe (JSON
lines carrying a per-job token): "start" right before the program runs (the supervisor measures time from
it), then "done" or "error" ("setup_error" if the sandbox failed).

What runs depends on the job's mode:

* "serve": an assert test's program. It runs the program and answers a judge's requests over two pipes
  with plain data (`remote_calls.serve`). Its own "done" decides nothing: a program shares this
  interpreter and could forge anything it reports.
* "judge": the assert test itself, in a process that runs no program code (`remote_calls.judge`); its
  "done" or "error" is the verdict, with the time it waited for the program.
* "stdio": the program as the main program on the test's stdin; the supervisor compares its output.
* "assert": program and assert in one process; only the executor's start-up probe, with its own program.
* "bash": a command in the sample's workspace (below).

Sandbox layers, per test process (`python -I -X utf8` with a minimal environment, own session):

* Always: RLIMIT_CPU/AS/FSIZE/NOFILE/CORE/NPROC (NPROC counts the tasks of the job's uid, so the executor
  sizes it for that uid), a wall-clock kill of the whole process group, capped stdout+stderr capture (the
  test fails with `output_limit` once exceeded), a fresh work directory deleted afterwards, and a Python
  audit-hook guard installed before the program runs. The guard blocks socket creation, process creation
  (fork/exec/posix_spawn/subprocess/os.system, and `_posixsubprocess.fork_exec`, which raises no audit
  event: the runner swaps it for a refusal and the guard refuses a fresh copy of the module), subinterpreters
  (which would not see the hook), signals, ctypes foreign calls, reading any /proc/*/environ or another
  process's /proc entry (resolved through symlinks and `..`), opening directories outside the work dir,
  writes/renames/removals outside the work dir, hard links with either end outside it, listing the work
  root (other jobs' directories) and sqlite3 databases outside the work dir. Audit hooks cannot be removed
  from Python, but they are not a security boundary on their own (frame introspection, C extensions).
* When the service runs as root (the normal case in containers), kernel layers on top, each verified
  at start-up by a probe job and then required for every job (a job whose layers fail to come up is a
  500, never a silently weaker sandbox):
  - new network namespace: only a downed loopback exists, so nothing, not even 127.0.0.1, is reachable;
  - new mount namespace: an empty filesystem view apart from the system directories (/usr, /etc, /bin,
    /lib*, /dev, /proc, /sys), the interpreter with its packages, and the work dir: every other top-level
    directory (/tmp, /home, /root, /run, /var, /mnt, /opt, the project's) gets an empty tmpfs, top-level
    files an empty one, and the needed paths below them are bound back; /dev is a minimal tmpfs of its own
    (null, zero, full, random, urandom, the fd links: no GPU or disk device of the host); every mount is
    then re-mounted read-only except the work dir, a private size-capped tmpfs. So the project, other jobs'
    directories, Ray's session files and host UNIX sockets are out of sight;
  - new PID and IPC namespaces: the program is PID 1 of its own namespace, so when it is killed every
    process it started dies too, even ones that escaped the process group; a fresh /proc is mounted;
  - an unprivileged uid/gid (one per concurrency slot, `sandbox_uid_base + slot`, falling back to
    `nobody` when those uids are not usable) with no supplementary groups, `no_new_privs`, and
    RLIMIT_NPROC binding per slot uid.
  Without them only the "always" layers apply, with no network or filesystem isolation beyond the guard:
  the executor then refuses to start unless the weak mode is explicitly allowed (`allow_weak_sandbox`).

Bash jobs (`/execute` with language bash, for the generic_sandbox environment) get the same layers except the
Python guard, which cannot see into a shell; the executor runs them only where every kernel layer is up. The
runner unpacks the carried workspace into the work dir (mounted at one fixed path for all bash jobs, each in
its own mount namespace), runs the command in `bash` with the previous exported variables and directory,
stops whatever the command left running (it is PID 1 of the job's PID namespace), and reports the exit code,
the new shell state and the packed workspace on the status pipe.

Every test pays this interpreter's start-up, so what only the kernel layers need (ctypes, re, signal) is
imported where it is used.
"""

import builtins
import contextlib
import json
import os
import resource
import sys
import time
import traceback
import types

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x08000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 22, 38
SECCOMP_MODE_FILTER = 2
KEEP_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}
# Audit events the guard refuses outright (prefixes), and those whose path arguments (by position) must
# lie inside the work dir.
GUARD_BLOCKED_EVENTS = (
    "socket.",
    "subprocess.",
    "os.system",
    "os.exec",
    "os.spawn",
    "os.posix_spawn",
    "os.fork",
    "os.forkpty",
    "pty.",
    "os.kill",
    "os.killpg",
    "signal.pthread_kill",
    "ctypes.dlopen",
    "ctypes.dlsym",
    "ctypes.call_function",
    "ctypes.cdata",
    # A subinterpreter has its own (empty) set of audit hooks: code run in it would pass the guard unseen.
    "cpython.PyInterpreterState_New",
)
# Modules a program may not load (checked on the last dotted component, which names the C init function):
# a fresh `_posixsubprocess` would bring back the fork_exec the runner disarmed (see `disarm_fork_exec`),
# and the others reach past the audit hooks (subinterpreters, CPython's test-only C APIs).
GUARD_BLOCKED_MODULES = (
    "_posixsubprocess",
    "_xxsubinterpreters",
    "_xxinterpchannels",
    "_testcapi",
    "_testinternalcapi",
)
GUARD_PATH_ARGS = {
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.mkdir": (0,),
    "os.rename": (0, 1),
    "os.symlink": (1,),
    # Both ends: a hard link made inside the work dir to a file outside it (the service's own code, where the
    # work dir shares its filesystem) would make that file writable through the link.
    "os.link": (0, 1),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.truncate": (0,),
    "os.utime": (0,),
    "os.chflags": (0,),
    "os.lchflags": (0,),
}
GUARD_DEVICES = {"/dev/null", "/dev/stdout", "/dev/stderr"}
# Directory listings of the work root (the work dir's parent), which holds the other jobs' directories.
GUARD_LISTING_EVENTS = ("os.listdir", "os.scandir")
# Top-level directories a sandbox sees (read-only): the system's. The rest is hidden (`hidden_paths`).
VISIBLE_TOP_LEVEL = frozenset({"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "sys"})
LAYERS = ("cgroup", "netns", "mountns", "readonly_fs", "pidns", "uid_drop", "no_new_privs", "seccomp", "python_guard")
SETUP_FAILED = 70  # EX_SOFTWARE: the sandbox, not the program, failed


class Libc:
    def __init__(self):
        import ctypes

        self.ctypes = ctypes
        self.lib = ctypes.CDLL(None, use_errno=True)
        self.lib.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
        self.lib.unshare.argtypes = [ctypes.c_int]
        self.lib.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4

    def check(self, rc, what):
        if rc != 0:
            err = self.ctypes.get_errno()
            raise OSError(err, what + ": " + os.strerror(err))

    def unshare(self, flags):
        self.check(self.lib.unshare(flags), f"unshare({flags:#x})")

    def mount(self, source, target, fstype, flags, data=None):
        def enc(s):
            return None if s is None else os.fsencode(s)

        self.check(self.lib.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), "mount " + target)

    def prctl(self, option, arg, pointer=0):
        self.check(self.lib.prctl(option, arg, pointer, 0, 0), f"prctl({option})")


def mount_points():
    import re

    def unescape(s):
        return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)

    with open("/proc/self/mountinfo") as f:
        return [(unescape(p[4]), p[5].split(",")) for p in (line.split() for line in f)]


def first_blocked_ancestor(path):
    # The sandbox uid is neither owner nor group of anything, so only the "other" x bit matters.
    parts = path.strip("/").split("/")[:-1]
    for i in range(len(parts) + 1):
        ancestor = "/" + "/".join(parts[:i])
        try:
            if not os.stat(ancestor).st_mode & 0o001:
                return ancestor
        except FileNotFoundError:  # below a tmpfs an earlier path put over its blocked parent: ours, 0755
            return None
    return None


def same_file(path, fd):
    try:
        a, b = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def hidden_paths():
    """Where the host keeps what a program has no business seeing: every top-level directory and file but the
    system's own, and the shared-memory directories under /dev. (directories, files)"""
    directories, files = [], []
    for name in sorted(os.listdir("/")):
        path = "/" + name
        if name in VISIBLE_TOP_LEVEL or os.path.islink(path):
            continue
        if os.path.isdir(path):
            directories.append(path)
        elif os.path.isfile(path):
            files.append(path)
    directories += [p for p in ("/dev/shm", "/dev/mqueue") if os.path.isdir(p) and not os.path.islink(p)]
    return directories, files


def build_filesystem_view(libc, workdir, notes, uid):
    """An empty filesystem apart from the system directories, the interpreter and its packages, and the work
    dir: the project, /tmp, /home, /run (and the UNIX sockets there) and the like are empty tmpfs mounts. The
    needed paths under them are bound back. With a dropped uid, directories the interpreter needs that sit
    below a non-world-searchable parent (e.g. a pyenv under /root) are exposed the same way."""
    needed = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, workdir, *filter(None, sys.path)}
    paths = sorted({os.path.realpath(p) for p in needed if os.path.isdir(p)})
    # Take handles first: once a tmpfs hides a parent, the original paths no longer resolve.
    fds = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in paths}
    directories, files = hidden_paths()
    for hidden in directories:  # an empty tmpfs over each
        libc.mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for hidden in files:  # an empty file over each
        libc.mount("/dev/null", hidden, None, MS_BIND)
    for path in paths:
        blocked = first_blocked_ancestor(path) if uid is not None else None
        if blocked == "/":
            notes.append(f"cannot expose {path}: / is not world-searchable")
            continue
        if blocked is not None:
            libc.mount("tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
        if not same_file(path, fds[path]):
            os.makedirs(path, 0o755, exist_ok=True)
            libc.mount(f"/proc/self/fd/{fds[path]}", path, None, MS_BIND | MS_REC)
    for fd in fds.values():
        os.close(fd)


DEV_NODES = ("null", "zero", "full", "random", "urandom")
DEV_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
}


def minimal_dev(libc):
    """A fresh /dev holding the few character devices a program uses, bound from the host's: the host's other
    devices (GPUs' /dev/nvidia*, disks, terminals) are not there to open."""
    fds = {}
    for name in DEV_NODES:
        with contextlib.suppress(OSError):
            fds[name] = os.open("/dev/" + name, os.O_PATH)
    # Over the host's /dev, which with what is mounted below it (/dev/shm, /dev/pts) is out of reach under it.
    libc.mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for name, fd in fds.items():
        path = "/dev/" + name
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o666))
        libc.mount(f"/proc/self/fd/{fd}", path, None, MS_BIND)
        os.close(fd)
    for name, target in DEV_LINKS.items():
        os.symlink(target, "/dev/" + name)
    os.mkdir("/dev/shm", 0o755)  # empty, and read-only like the rest


def remount_readonly(libc, workdir, notes):
    root_ok = False
    for point, opts in mount_points():
        if point == workdir:
            continue
        if point.startswith("/dev/") and point[len("/dev/") :] not in DEV_NODES:
            continue  # the host's, under the sandbox's own /dev (`minimal_dev`): out of reach
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for opt in opts:
            flags |= KEEP_FLAGS.get(opt, 0)
        try:
            libc.mount(None, point, None, flags)
            root_ok = root_ok or point == "/"
        except OSError as e:
            notes.append(str(e))
    return root_ok


def cpu_seconds():
    """This process's CPU time. The runner sends it (with its relay's) in "start", before any program code runs;
    the supervisor subtracts it from what the kernel reports for the job when it reaps it, which leaves the
    program's own CPU time: counted by the kernel, so no program can report its own."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def relay_exit(pid):
    # The parent outside the PID namespace runs no program code: it mirrors the child's fate.
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    os._exit(128 + os.WTERMSIG(status))


def kernel_setup(job, layers, notes):
    libc = Libc()
    workdir = job["workdir"]
    try:
        libc.unshare(CLONE_NEWNET)
        layers["netns"] = True
    except OSError as e:
        notes.append(str(e))
    try:
        libc.unshare(CLONE_NEWNS)
        # Without private propagation our mounts could leak into the host namespace: stop if it fails.
        libc.mount(None, "/", None, MS_REC | MS_PRIVATE)
        layers["mountns"] = True
    except OSError as e:
        notes.append(str(e))
    if layers["mountns"]:
        uid = job["uid"] if job["uid"] is not None else 0
        size = job["workdir_bytes"]
        libc.mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=0700,uid={uid},gid={uid}")
        build_filesystem_view(libc, workdir, notes, job["uid"])
        minimal_dev(libc)
        layers["readonly_fs"] = remount_readonly(libc, workdir, notes)
    try:
        libc.unshare(CLONE_NEWPID | CLONE_NEWIPC)
        layers["pidns"] = True
    except OSError as e:
        notes.append(str(e))
    if layers["pidns"]:
        # The relay's own CPU time so far: the supervisor's count for the job includes it (see `cpu_seconds`).
        job["relay_cpu"] = cpu_seconds()
        pid = os.fork()
        if pid:
            relay_exit(pid)
        if layers["mountns"]:
            try:
                libc.mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
            except OSError as e:
                notes.append(str(e))
    return libc


def set_limits(job):
    def cap(which, soft, hard=None):
        hard = soft if hard is None else hard
        current = resource.getrlimit(which)[1]
        if current != resource.RLIM_INFINITY:  # without root a hard limit can only go down
            soft, hard = min(soft, current), min(hard, current)
        resource.setrlimit(which, (soft, hard))

    cap(resource.RLIMIT_CPU, job["cpu_seconds"], job["cpu_seconds"] + 1)
    cap(resource.RLIMIT_AS, job["memory_bytes"])
    cap(resource.RLIMIT_FSIZE, job["file_size_bytes"])
    cap(resource.RLIMIT_NOFILE, job["max_open_files"])
    cap(resource.RLIMIT_CORE, 0)
    # Always, also without a uid of our own: the executor sized it for the uid the job runs as.
    cap(resource.RLIMIT_NPROC, job["max_processes"])


def disarm_fork_exec():
    """`_posixsubprocess.fork_exec` (behind subprocess and multiprocessing) forks and execs without raising an
    audit event, so the guard cannot see it. Loaded before the guard and its function swapped for a refusal,
    the module stays importable (asyncio, sympy and pandas import subprocess), while a fresh copy of it is an
    import the guard refuses."""
    import _posixsubprocess

    def fork_exec(*args, **kwargs):
        raise PermissionError("sandbox: process creation is not allowed")

    _posixsubprocess.fork_exec = fork_exec
    if "subprocess" in sys.modules:  # 3.11 binds its own name for it at import
        sys.modules["subprocess"]._fork_exec = fork_exec


def proc_refusal(path, own):
    """Why opening `path` (absolute, normalised) is refused, or None: another process's /proc entry (its
    environment, memory, command line: the service's API key lives there) or any environ file."""
    if not path.startswith("/proc/"):
        return None
    parts = path.split("/")
    if parts[-1] == "environ":
        return "environment of a process"
    if parts[2].isdigit() and parts[2] != own:
        return "another process's /proc entry"
    return None


def listing_and_database_checks(root, inside):
    """(may_list(path), may_connect(database)) for the guard: the work root (the work dir's parent, which holds
    the other jobs' directories) is not listed, and sqlite3, which opens its files in C past the open hook,
    only opens an in-memory database or one in the work dir."""
    realpath, fsdecode, path_like = os.path.realpath, os.fsdecode, os.PathLike
    work_root = os.path.dirname(root) + "/"

    def may_list(path):
        if isinstance(path, int) or inside(path):
            return True
        return not (realpath(fsdecode(path)) + "/").startswith(work_root)

    def may_connect(database):
        if isinstance(database, (str, bytes)) and fsdecode(database) in (":memory:", ""):
            return True
        if not isinstance(database, (str, bytes, path_like)):
            return False
        return not fsdecode(database).startswith("file:") and inside(database)

    return may_list, may_connect


def install_guard(workdir):
    realpath, normpath, abspath, isdir = os.path.realpath, os.path.normpath, os.path.abspath, os.path.isdir
    fsdecode = os.fsdecode
    root = realpath(workdir)
    own = str(os.getpid())  # the program cannot fork, so this stays its pid
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    # Local copies: the program shares this interpreter, and in assert mode `import __main__` is this
    # module, so a hook reading module globals could be switched off by rebinding them.
    blocked, path_args, devices = GUARD_BLOCKED_EVENTS, dict(GUARD_PATH_ARGS), frozenset(GUARD_DEVICES)
    blocked_modules, refusal = frozenset(GUARD_BLOCKED_MODULES), proc_refusal
    listing_events = frozenset(GUARD_LISTING_EVENTS)

    def inside(path):
        if isinstance(path, int):
            return True
        path = fsdecode(path)
        if path in devices:
            return True
        path = realpath(path)
        return path == root or path.startswith(root + "/")

    def check_open(path, mode, flags):
        path = fsdecode(path)
        # Both spellings: the resolved one sees through symlinks (/proc/self/.., a link in the work dir),
        # the lexical one through a /proc/<pid>/root link that resolves elsewhere.
        why = refusal(realpath(path), own) or refusal(normpath(abspath(path)), own)
        if why:
            raise PermissionError(f"sandbox: no reads of the {why}: {path!r}")
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & write_flags
        )
        # A directory fd outside the work dir would let os.open(..., dir_fd=fd) write (or read /proc) through it.
        if (writing or (mode is None and isdir(path))) and not inside(path):
            raise PermissionError(f"sandbox: no writes outside the work directory: {path!r}")

    may_list, may_connect = listing_and_database_checks(root, inside)

    def hook(event, args):
        if event == "open":
            if args[0] is not None and not isinstance(args[0], int):
                check_open(*args)
        elif event == "import":
            if isinstance(args[0], str) and args[0].rpartition(".")[2] in blocked_modules:
                raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
        elif event in path_args:
            for i in path_args[event]:
                if not inside(args[i]):
                    raise PermissionError(f"sandbox: {event} outside the work directory: {args[i]!r}")
        elif event in listing_events:
            if args and args[0] is not None and not may_list(args[0]):
                raise PermissionError(f"sandbox: {event} outside the work directory: {args[0]!r}")
        elif event == "sqlite3.connect":
            if not may_connect(args[0]):
                raise PermissionError(f"sandbox: sqlite3 outside the work directory: {args[0]!r}")
        elif event.startswith(blocked):
            raise PermissionError(f"sandbox: {event} is not allowed")

    sys.addaudithook(hook)


def status_sender(fd, token):
    """`send(kind, **fields)` writes one JSON line to the status pipe, carrying the job's token so that a
    program that prints or exits early cannot pass for the runner."""

    # A closure, not a module-level function, for the same reason as the guard's local copies.
    def send(kind, **fields):
        data = memoryview((json.dumps(dict(kind=kind, token=token, **fields)) + "\n").encode())
        while data:  # a bash job's report carries its workspace archive: more than one pipe write
            data = data[os.write(fd, data) :]

    return send


def read_job(source):
    """The job from the anonymous memory file the executor passed (`fd:N`), closed before any program code
    runs: no file anywhere holds the token or the test for a program to read."""
    fd = int(source.removeprefix("fd:"))
    with os.fdopen(fd, "rb") as f:
        return json.loads(f.read())


def build_sandbox(job, layers, notes):
    """Every layer except the Python guard, which must come last: it would block this set-up."""
    os.umask(0o022)
    # First, while /sys is the host's and we are root: everything this job starts is counted in its slot's cgroup.
    for procs in job.get("cgroup_procs") or []:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    layers["cgroup"] = bool(job.get("cgroup_procs"))
    libc = kernel_setup(job, layers, notes) if job["kernel"] and os.geteuid() == 0 else None
    uid = job["uid"]
    if uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        layers["uid_drop"] = True
    if libc is not None:
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1)
        layers["no_new_privs"] = True
        if layers["pidns"]:
            import signal

            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
    set_limits(job)
    if job.get("seccomp_bpf"):
        load_syscall_filter(job["seccomp_bpf"], layers)
    os.chdir(job["workdir"])
    os.umask(0o077)


def load_syscall_filter(program_b64, layers):
    """The service's seccomp filter (`code_server/syscall_filter.py`, compiled by libseccomp), loaded as it is:
    from here on every process of the job runs under it. No-new-privs first, which the kernel requires of a
    process without CAP_SYS_ADMIN (and which keeps it from gaining privileges through exec)."""
    import base64
    import ctypes

    libc = Libc()

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    program = base64.b64decode(program_b64)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1)
    libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog))
    layers["seccomp"] = True


def program_module(mode):
    # Assert tests import the program as module `solution`, so its `if __name__ == "__main__":` block
    # stays quiet; stdio programs are the main program.
    sys.dont_write_bytecode = True
    sys.argv = ["solution.py"]
    name = "__main__" if mode == "stdio" else "solution"
    module = types.ModuleType(name)
    module.__builtins__ = builtins
    sys.modules[name] = module
    return module


def run_program(module, program, test, mode):
    """Run the program, then (only in the start-up probe) its assert; returns the name of the exception that
    failed it, or None. The supervisor measures the time."""
    error = None
    try:
        exec(compile(program, "<solution>", "exec"), module.__dict__)
        if test is not None:
            exec(compile(test, "<test>", "exec"), module.__dict__)
    except SystemExit as e:
        # A stdio program may end with sys.exit() / sys.exit(0); an assert test must reach its assert.
        if mode != "stdio" or e.code not in (None, 0):
            error = "SystemExit"
    except BaseException as e:
        error = type(e).__name__
        with contextlib.suppress(BaseException):  # a broken stderr must not turn a verdict into a crash
            traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):  # output lost to a closed stream only fails the comparison
            stream.flush()
    return error


def load_remote_calls(job):
    """`remote_calls.py` from the package's directory (the job names it: this runner may run from a compiled
    copy elsewhere), which `-I` keeps off sys.path (and out of sys.modules)."""
    import importlib.util

    path = job.get("remote_calls_path") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "remote_calls.py")
    spec = importlib.util.spec_from_file_location("_oi_remote_calls", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def judge_test(remote, job, test, send):
    """The judge: run the test against the program process's answers, report the verdict and the time the
    program took to answer, and exit. No program code ever runs in this process."""
    link = remote.Link(remote.Channel(job["channel_in"], job["channel_out"]))
    # The supervisor gives the judge a round-trip allowance per request on top of the test's time.
    link.progress = lambda requests, setup_s: send("progress", requests=requests, setup_s=setup_s)
    error = None
    try:
        if link.channel.receive() is None:  # the program process's hello, sent before its program runs
            raise remote.ProgramEnded("the program process ended before starting")
        remote.judge(test, link, job.get("program_source") or "", job.get("judge_limit"))
    except BaseException as e:
        error = type(e).__name__
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    if error is None:
        send("done", program_seconds=link.waited, requests=link.requests)
    else:
        send("error", error=error, program_seconds=link.waited, requests=link.requests)
    os._exit(0 if error is None else 1)


# Runs the command in the same shell process as the restored state, so `cd` and `export` persist; the EXIT
# trap saves them (also after an `exit` in the command). The state file lies in the workspace only while no
# command runs: it is removed before the command and taken away by the runner before packing.
BASH_WRAPPER = r"""__oi_state=$OI_STATE; unset OI_STATE
if [ -f "$__oi_state" ]; then . "$__oi_state" >/dev/null 2>&1; rm -f -- "$__oi_state"; fi
__oi_save() { { export -p; printf 'cd -- %q\n' "$PWD"; } >"$__oi_state" 2>/dev/null; }
trap __oi_save EXIT
eval "$1"
"""
STATE_FILE = ".oi-shell-state"


class TooManyEntries(Exception):
    pass


def extract_workspace(archive, root, notes, max_entries):
    """Unpack the carried workspace; members a tar may not create (absolute or `..` paths) are skipped."""
    import io
    import tarfile

    def keep(member, path):
        try:
            return tarfile.tar_filter(member, path)
        except tarfile.FilterError as e:
            notes.append(f"skipped {member.name!r}: {e}")
            return None

    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        members = []
        for member in tar:
            members.append(member)
            if len(members) > max_entries:
                raise TooManyEntries(f"the workspace has more than {max_entries} entries")
        tar.extractall(root, members=members, filter=keep)


def pack_workspace(root, notes, max_entries):
    """The workspace as tar.gz bytes. Entries are added one by one, so one unreadable file is skipped (and
    named) instead of losing the command's other changes. More than `max_entries` entries is TooManyEntries."""
    import io
    import tarfile

    buffer, count = io.BytesIO(), 0
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for directory, dirs, files in os.walk(root):
            dirs.sort()
            count += len(dirs) + len(files)
            if count > max_entries:
                raise TooManyEntries(f"the workspace has more than {max_entries} files, directories and links")
            for name in sorted(dirs) + sorted(files):
                path = os.path.join(directory, name)
                arcname = os.path.relpath(path, root)
                try:
                    info = tar.gettarinfo(path, arcname)
                    if info.isreg():
                        with open(path, "rb") as f:
                            tar.addfile(info, f)
                    elif info.isdir() or info.issym():
                        tar.addfile(info)
                    else:
                        notes.append(f"skipped {arcname!r}: not a file, directory or symlink")
                except OSError as e:
                    notes.append(f"skipped {arcname!r}: {e.strerror or e}")
    return buffer.getvalue()


def _bash_environment(root: str, state_path: str) -> dict[str, str]:
    interpreter_bin = os.path.dirname(sys.executable)  # `python` in the shell is the python tool's interpreter
    return {
        "PATH": f"{interpreter_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": root,
        "TMPDIR": root,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OI_STATE": state_path,
    }


def _run_shell(job, root: str, state_path: str) -> tuple[int, bool]:
    """(exit code, timed out) of the command under the state wrapper; its process group dies on timeout."""
    import signal
    import subprocess

    proc = subprocess.Popen(
        [job["bash"], "-c", BASH_WRAPPER, "bash", job["command"]],
        cwd=root,
        env=_bash_environment(root, state_path),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        return proc.wait(timeout=job["command_timeout"]), False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return 124, True  # what `timeout` reports, as open-instruct's backend shows it


def run_bash(job, layers):
    """Unpack the workspace, run the command under `bash` with the previous state, stop everything it
    started, pack the workspace; returns the report fields (exit code, workspace, state, notes)."""
    import base64
    import signal

    root, notes = job["workdir"], []
    started = time.perf_counter()
    if job["workspace"]:
        try:
            extract_workspace(base64.b64decode(job["workspace"]), root, notes, job["workspace_entries"])
        except Exception as e:  # a corrupt archive, or one too large for the work dir: the command does not run
            return {"exit_code": None, "error": f"the workspace could not be unpacked: {type(e).__name__}: {e}"}
    state_path = os.path.join(root, STATE_FILE)
    with open(state_path, "w", encoding="utf-8") as f:
        f.write(job["shell_state"])
    exit_code, timed_out = _run_shell(job, root, state_path)
    runtime = time.perf_counter() - started
    if layers.get("pidns"):
        # PID 1 of the job's namespace: nothing the command left running (`cmd &`) outlives it or changes
        # files while they are packed. Only here: outside a PID namespace -1 would reach other processes.
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
    shell_state = job["shell_state"]
    try:
        with open(state_path, encoding="utf-8", errors="replace") as f:
            shell_state = f.read()
        os.unlink(state_path)
    except OSError:
        pass  # a killed or trap-less command saved nothing: keep the previous state
    report = {"exit_code": exit_code, "timed_out": timed_out, "runtime": runtime, "shell_state": shell_state}
    try:
        archive = pack_workspace(root, notes, job["workspace_entries"])
    except TooManyEntries as e:
        notes.append(f"{e}, so none of this command's changes to it are kept")
        archive = None
    if archive is None:
        report["workspace"] = None
    elif len(archive) > job["workspace_bytes"]:
        notes.append(f"the workspace archive is {len(archive)} bytes, over the {job['workspace_bytes']}-byte limit")
        report["workspace"] = None
    else:
        report["workspace"] = base64.b64encode(archive).decode()
    report["notes"] = notes[:20]
    return report


def main():
    job = read_job(sys.argv[1])
    send = status_sender(job["status_fd"], job.pop("token"))
    layers = dict.fromkeys(LAYERS, False)
    notes = []
    mode = job["mode"]
    # Loaded before the sandbox hides this file's directory, and before any program code runs.
    remote = load_remote_calls(job) if mode in ("serve", "judge") else None
    try:
        build_sandbox(job, layers, notes)
    except Exception as e:
        send("setup_error", error=f"{type(e).__name__}: {e}", layers=layers, notes=notes)
        os._exit(SETUP_FAILED)

    if mode == "bash":
        # The guard is Python's and cannot see a shell: a bash job relies on the kernel layers, which the
        # executor requires for it (every expected one but the guard must be up).
        missing = [k for k, wanted in job["expected_layers"].items() if wanted and not layers.get(k)]
        if missing != [] and missing != ["python_guard"]:
            send("setup_error", error="sandbox layers failed: " + ", ".join(missing), layers=layers, notes=notes)
            os._exit(SETUP_FAILED)
        send("start", layers=layers, notes=notes)
        send("done", **run_bash(job, layers))
        os._exit(0)
    module = program_module(mode)
    program, test = job.pop("program"), job.pop("test", None)
    if job["guard"]:
        disarm_fork_exec()
        install_guard(job["workdir"])
        layers["python_guard"] = True
    missing = [k for k, wanted in job["expected_layers"].items() if wanted and not layers.get(k)]
    if missing:
        send("setup_error", error="sandbox layers failed: " + ", ".join(missing), layers=layers, notes=notes)
        os._exit(SETUP_FAILED)
    send("start", layers=layers, notes=notes, cpu=job.get("relay_cpu", 0.0) + cpu_seconds())
    if mode == "judge":
        judge_test(remote, job, test, send)
    if mode == "serve":
        channel = remote.Channel(job["channel_in"], job["channel_out"])
        # Before the program runs: the judge starts its clock on a message that no program code sent.
        channel.send({"hello": True})
    error = run_program(module, program, test, mode)
    if error is None and mode == "serve":
        remote.serve(module.__dict__, channel)
    if error is None:
        send("done")
    else:
        send("error", error=error)
    os._exit(0 if error is None else 1)


if __name__ == "__main__":
    main()
