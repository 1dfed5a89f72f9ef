"""The seccomp filter of the code sandbox: a classic BPF program, built here by hand (no libseccomp
binding needed), that bwrap loads (`--seccomp FD`) just before it executes the interpreter.

It refuses (EPERM, the call fails; the process lives on) new processes (fork, vfork, clone without
CLONE_THREAD; clone3 answers ENOSYS so glibc falls back to clone), sockets of any family but
AF_UNIX (EAFNOSUPPORT), device and fifo nodes (mknod), ptrace and cross-process memory access,
mounts and namespaces, keyrings, pidfds, io_uring, bpf, perf, userfaultfd, module and kexec loading.
Threads stay allowed (RLIMIT_AS bounds them). A syscall of another ABI (x32, or an architecture the
filter was not built for) kills the process, so the table cannot be bypassed by switching ABI.
Stdlib only.
"""

from __future__ import annotations

import errno
import platform
import struct

# BPF opcodes (linux/bpf_common.h) and seccomp return values (linux/seccomp.h)
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_KILL_PROCESS, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET = 0, 4, 16  # struct seccomp_data; arg0's low 32 bits (little endian)
CLONE_THREAD, AF_UNIX, X32_BIT = 0x00010000, 1, 0x40000000

DENIED = str.split(
    "ptrace process_vm_readv process_vm_writev kcmp mount umount2 pivot_root chroot fsopen fsmount move_mount "
    "open_tree unshare setns keyctl add_key request_key mknod mknodat pidfd_open pidfd_send_signal pidfd_getfd "
    "fork vfork io_uring_setup io_uring_enter io_uring_register bpf perf_event_open userfaultfd init_module "
    "finit_module delete_module kexec_load kexec_file_load reboot swapon swapoff syslog acct settimeofday "
    "quotactl open_by_handle_at name_to_handle_at"
)

# syscall numbers: asm/unistd_64.h (x86_64) and asm-generic/unistd.h (aarch64)
X86_64 = dict(
    ptrace=101, process_vm_readv=310, process_vm_writev=311, kcmp=312, mount=165, umount2=166, pivot_root=155,
    chroot=161, fsopen=430, fsmount=432, move_mount=429, open_tree=428, unshare=272, setns=308, keyctl=250,
    add_key=248, request_key=249, mknod=133, mknodat=259, pidfd_open=434, pidfd_send_signal=424, pidfd_getfd=438,
    fork=57, vfork=58, io_uring_setup=425, io_uring_enter=426, io_uring_register=427, bpf=321, perf_event_open=298,
    userfaultfd=323, init_module=175, finit_module=313, delete_module=176, kexec_load=246, kexec_file_load=320,
    reboot=169, swapon=167, swapoff=168, syslog=103, acct=163, settimeofday=164, quotactl=179,
    open_by_handle_at=304, name_to_handle_at=303, clone=56, clone3=435, socket=41,
)  # fmt: skip
AARCH64 = dict(
    ptrace=117, process_vm_readv=270, process_vm_writev=271, kcmp=272, mount=40, umount2=39, pivot_root=41,
    chroot=51, fsopen=430, fsmount=432, move_mount=429, open_tree=428, unshare=97, setns=268, keyctl=219,
    add_key=217, request_key=218, mknodat=33, pidfd_open=434, pidfd_send_signal=424, pidfd_getfd=438,
    io_uring_setup=425, io_uring_enter=426, io_uring_register=427, bpf=280, perf_event_open=241, userfaultfd=282,
    init_module=105, finit_module=273, delete_module=106, kexec_load=104, kexec_file_load=294, reboot=142,
    swapon=224, swapoff=225, syslog=116, acct=89, settimeofday=170, quotactl=60, open_by_handle_at=265,
    name_to_handle_at=264, clone=220, clone3=435, socket=198,
)  # fmt: skip
ARCHES = {"x86_64": (0xC000003E, X86_64), "aarch64": (0xC00000B7, AARCH64)}  # AUDIT_ARCH_*


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def supported() -> bool:
    """A filter can be built for this machine's architecture."""
    return platform.machine() in ARCHES


def build(machine: str | None = None) -> bytes:
    """The filter as bwrap reads it from its fd: an array of struct sock_filter."""
    audit_arch, nr = ARCHES[machine or platform.machine()]
    prog = [_op(LD_W_ABS, ARCH_OFFSET), _op(JEQ_K, audit_arch, 1, 0), _op(RET_K, RET_KILL_PROCESS)]
    prog.append(_op(LD_W_ABS, NR_OFFSET))
    if audit_arch == ARCHES["x86_64"][0]:
        prog += [_op(JGE_K, X32_BIT, 0, 1), _op(RET_K, RET_KILL_PROCESS)]
    for name in DENIED:
        if name in nr:  # aarch64 has no fork, vfork, mknod
            prog += [_op(JEQ_K, nr[name], 0, 1), _op(RET_K, RET_ERRNO | errno.EPERM)]
    prog += [_op(JEQ_K, nr["clone3"], 0, 1), _op(RET_K, RET_ERRNO | errno.ENOSYS)]
    prog += _arg0_rule(nr["clone"], JSET_K, CLONE_THREAD, errno.EPERM)  # a thread, not a process
    prog += _arg0_rule(nr["socket"], JEQ_K, AF_UNIX, errno.EAFNOSUPPORT)
    prog.append(_op(RET_K, RET_ALLOW))
    return b"".join(prog)


def _arg0_rule(number: int, test: int, k: int, err: int) -> list[bytes]:
    """Syscall `number` is allowed when `arg0 test k` holds, else fails with `err` (other syscalls
    jump over the block with A, the number, untouched)."""
    return [
        _op(JEQ_K, number, 0, 4),
        _op(LD_W_ABS, ARG0_OFFSET),
        _op(test, k, 0, 1),
        _op(RET_K, RET_ALLOW),
        _op(RET_K, RET_ERRNO | err),
    ]
