"""10^4 requests leave no reference and no memory behind: one at a time, in windows posted by
one call, refused ones, and ones dropped while they run (their communicator finishes them).
One process, two contexts (tcp)."""
import gc
import sys
import tracemalloc

import numpy as np
import pytest

import loom
from peers import local_pair

COUNT = 10_000
WINDOW = 50


@pytest.fixture
def pair():
    with loom.Context() as a, loom.Context() as b:
        out, into = local_pair(a, b)
        yield a, b, out, into


def one_at_a_time(out, into, send, recv, count):
    for i in range(count):
        receive = into.irecv(recv, i)
        sent = out.isend(send, i)
        assert loom.wait_all([receive, sent], timeout=30)
        assert receive.sizes == (len(recv),) and sent.sizes == (len(recv),)


def windows(out, into, send, recv, count):
    for i in range(count // WINDOW):
        receives = into.irecv_many([recv] * WINDOW, i)
        sends = out.isend_many([send] * WINDOW, i)
        assert loom.wait_all([receives, sends], timeout=30)
        assert len(sends.sizes) == WINDOW


def refused(out, into, send, recv, count):
    frozen = bytes(64)
    raised = 0
    for i in range(count):
        try:
            into.irecv(frozen, i)
        except loom.InvalidError:
            raised += 1
    for i in range(count):
        try:
            out.isend(object(), i)
        except TypeError:
            raised += 1
    assert raised == 2 * count


def measure(run, *args):
    """References to the buffers and traced memory after `run` against before it. Tracing starts
    before a warm-up round as long, so that what Python parks in its free lists and caches on
    the way is traced in both snapshots (started after it, the first round left ~120 KiB
    under PYTHONMALLOC=malloc, the second ~15 KiB, then nothing; a leak grows each round).
    Memory counts where this file's lines allocated it (what loom's calls make is traced to
    the line that called them), not where pytest or the snapshots did."""
    out, into, send, recv = args
    tracemalloc.start()
    run(out, into, send, recv, COUNT)
    gc.collect()
    refs = (sys.getrefcount(send), sys.getrefcount(recv))
    before = tracemalloc.take_snapshot()
    run(out, into, send, recv, COUNT)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    mine = [tracemalloc.Filter(True, __file__)]
    grown = sum(stat.size_diff for stat in
                after.filter_traces(mine).compare_to(before.filter_traces(mine), "filename"))
    return refs, (sys.getrefcount(send), sys.getrefcount(recv)), grown


@pytest.mark.parametrize("run", [one_at_a_time, windows, refused])
@pytest.mark.parametrize("registered", [False, True])
def test_no_reference_or_memory_grows(pair, run, registered):
    a, b, out, into = pair
    send = np.arange(1024, dtype=np.uint16).view(np.uint8)[:1024]
    recv = bytearray(1024)
    if registered:
        a.register_memory(send)
        b.register_memory(recv)
    before, after, grown = measure(run, out, into, send, recv)
    assert before == after, f"references before {before}, after {after}"
    assert grown < 64 << 10, f"{grown} bytes more traced after {COUNT} requests"


def test_dropped_requests_are_finished_by_their_communicator(pair):
    _, _, out, into = pair
    send = np.ones(256, dtype=np.uint8)
    recv = bytearray(256)
    refs = (sys.getrefcount(send), sys.getrefcount(recv))
    for i in range(COUNT):  # far more than the 128 a communicator keeps in flight
        into.irecv(recv, i)
        out.isend(send, i)
    # Still usable: a message after them all arrives (the dropped ones went before it).
    assert loom.wait_all([into.irecv(recv, 77), out.isend(send, 77)], timeout=60)
    out.close()
    into.close()
    gc.collect()
    assert (sys.getrefcount(send), sys.getrefcount(recv)) == refs
