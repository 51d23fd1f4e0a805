"""The seccomp filter every sandboxed job runs under, compiled once per service with libseccomp.

libseccomp (through `pyseccomp`, its binding on PyPI) turns the rules below into a BPF program at service
start; the runner loads those bytes with one `prctl` right before the program runs, so no job pays for
importing the binding. The filter answers EPERM (ENOSYS for `clone3`, whose flags it cannot read, so the C
library falls back to `clone`) and allows everything else:

* new namespaces (`unshare`, `setns`, `clone` with a CLONE_NEW* flag): a user namespace would hand a
  program root's capabilities over a world of its own;
* mounts and the new mount API, `pivot_root`, `chroot`;
* `bpf`, `perf_event_open`, `userfaultfd`, `io_uring_*` (kernel attack surface no test needs);
* the kernel keyring (`keyctl`, `add_key`, `request_key`);
* reaching into another process (`ptrace`, `process_vm_readv/writev`, `pidfd_getfd`, `kcmp`);
* `socket(AF_UNIX, ...)`: nothing to connect a host socket with (`socketpair`, which asyncio needs and
  which reaches no one, stays allowed);
* device files and FIFOs (`mknod`, `mknodat`, behind `os.mkfifo` too): a FIFO where another job reads
  would block it, and a test has no use for one;
* modules, kexec, swap, reboot, `acct`, `quotactl`, `syslog`, `iopl`/`ioperm`, handle-based opens.
"""

from __future__ import annotations

import errno
import os
import socket

DENIED_SYSCALLS = (
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "ptrace",
    "mknod",
    "mknodat",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "syslog",
    "iopl",
    "ioperm",
    "open_by_handle_at",
    "name_to_handle_at",
)
NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x00000080,  # CLONE_NEWTIME
)


def compile_filter() -> tuple[bytes | None, str]:
    """(the BPF program, "") or (None, why it cannot be built here)."""
    try:
        import pyseccomp as seccomp
    except (ImportError, RuntimeError, OSError) as e:  # RuntimeError: the binding found no libseccomp
        return None, f"no seccomp binding: {type(e).__name__}: {e} (pip install pyseccomp; apt install libseccomp2)"
    deny = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            rules.add_rule(deny, name)
        except (OSError, ValueError):  # a call this architecture does not have (iopl on arm64): nothing to deny
            continue
    for flag in NAMESPACE_FLAGS:
        rules.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    rules.add_rule(deny, "socket", seccomp.Arg(0, seccomp.EQ, socket.AF_UNIX))
    read_end, write_end = os.pipe()
    try:
        with os.fdopen(write_end, "wb") as sink:
            rules.export_bpf(sink)
        with os.fdopen(read_end, "rb") as source:
            read_end = -1
            program = source.read()
    finally:
        if read_end >= 0:
            os.close(read_end)
    if not program or len(program) % 8:
        return None, f"libseccomp exported {len(program)} bytes, not a BPF program"
    return program, ""
