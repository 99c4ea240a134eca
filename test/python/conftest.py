"""Two-process harness for loom's Python tests: each side runs in its own process (from a
forkserver, so no process inherits another's loom state), the two joined by a pipe over which
they pass handles and descriptors. The provider comes from the environment meson sets
(LOOM_PROVIDER, FI_PROVIDER, ...), as for the C++ tests."""
import multiprocessing
import os
import queue
import time
import traceback

import pytest

import loom

_mp = multiprocessing.get_context("forkserver")
_mp.set_forkserver_preload(["numpy", "loom"])

# Generous for a loaded 2-core machine and sanitizer builds; a hang fails, it never blocks CI.
PAIR_TIMEOUT_S = 240


def _child(target, conn, results, index, args):
    try:
        results.put((index, "ok", target(conn, *args)))
    except BaseException:  # noqa: B036 - reported to the parent, whatever it is
        results.put((index, "error", traceback.format_exc()))


def run_pair(left, right, *args, dies=None, timeout=PAIR_TIMEOUT_S):
    """Runs left(conn, *args) and right(conn, *args) in two processes whose `conn`s are the two
    ends of one pipe; returns their results. A side that raises fails the test with its
    traceback. `dies` (0 or 1): that side is expected to kill itself; its exit status is
    returned in its place."""
    ends = _mp.Pipe()
    results = _mp.Queue()
    procs = [_mp.Process(target=_child, args=(fn, end, results, i, args))
             for i, (fn, end) in enumerate(((left, ends[0]), (right, ends[1])))]
    for p in procs:
        p.start()
    for end in ends:
        end.close()
    out = [None, None]
    errors = []
    deadline = time.monotonic() + timeout
    waiting = {0, 1} - ({dies} if dies is not None else set())
    try:
        while waiting:
            try:
                index, kind, value = results.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                errors.append(f"timed out after {timeout} s waiting for side(s) {sorted(waiting)}")
                break
            waiting.discard(index)
            if kind == "error":
                errors.append(f"side {index} failed:\n{value}")
                break  # the other side may wait for its peer forever: it is killed below
            out[index] = value
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 1)
            if p.is_alive():
                p.kill()
                p.join()
            # A side killed with its endpoints open leaves shm regions under its pid, which a
            # later process given that pid would have to clear first; reaped, its pid is free.
            if p.exitcode is not None and p.exitcode < 0:
                loom.remove_process_leftovers(p.pid)
    if dies is not None:
        out[dies] = procs[dies].exitcode
    if errors:
        pytest.fail("\n".join(errors), pytrace=False)
    return out


@pytest.fixture
def provider():
    return os.environ.get("LOOM_PROVIDER", "")
