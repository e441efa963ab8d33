"""Keep the calling thread's alternate signal stack across a call that replaces it.

OpenVINO's ``compile_model`` (2026.4.1, beside torch 2.14.1) installs an alternate signal stack of its own on the
calling thread and unmaps it when the compiled model is freed, without restoring the one it replaced. The thread
is left with a dangling stack: the next signal handled on it (faulthandler's SIGSEGV, SIGBUS, SIGILL, SIGFPE,
SIGABRT handlers run there) cannot be delivered, and the kernel kills the process with a bare SIGSEGV
(``si_code=SI_KERNEL``) that no handler reports. In the test suite this killed pytest-xdist workers at random,
one or two per run, after the OpenVINO tests; a long-lived `vit serve` could die the same way.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
from collections.abc import Iterator


class _Stack(ctypes.Structure):  # stack_t (Linux)
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    with contextlib.suppress(OSError):
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return None


def signal_stack() -> tuple[int, int, int] | None:
    """The calling thread's alternate signal stack as (address, flags, size); None where it cannot be read."""
    libc = _libc()
    stack = _Stack()
    if libc is None or libc.sigaltstack(None, ctypes.byref(stack)) != 0:
        return None
    return stack.ss_sp or 0, stack.ss_flags, stack.ss_size


@contextlib.contextmanager
def kept_signal_stack() -> Iterator[None]:
    """Run the block, then give the calling thread back the alternate signal stack it had before (a no-op where
    there is no sigaltstack, outside Linux)."""
    before = signal_stack()
    try:
        yield
    finally:
        if before is not None and signal_stack() != before:
            address, flags, size = before
            SS_ONSTACK = 1  # (the flag says "running on it now": never set in a stack handed to sigaltstack)
            stack = _Stack(address or None, flags & ~SS_ONSTACK, size)
            _libc().sigaltstack(ctypes.byref(stack), None)
