"""Two-sided transfers between two processes on the provider the environment names: every byte
of numpy buffers of several dtypes and sizes 0 B to 64 MiB, grouped receives, windows posted in
one call, a dead peer, a waiting thread that leaves the GIL to others."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import loom
from conftest import run_pair
from peers import accept, connect, pattern

DTYPES = [np.uint8, np.int16, np.float32, np.float64, np.complex128]
SIZES = [0, 1, 8, 4096, 16 << 10, 16 << 10 | 8, 256 << 10, 1 << 20, (16 << 20) + 16, 64 << 20]
SLACK = 64  # receive buffers are this much larger: what is past the message must stay put


def cases():
    for i, nbytes in enumerate(SIZES):
        dtype = DTYPES[i % len(DTYPES)]
        item = np.dtype(dtype).itemsize
        yield i, nbytes - nbytes % item, dtype


def sizes_receiver(conn):
    with loom.Context() as context:
        comm = accept(conn, context)
        seen = []
        for i, nbytes, dtype in cases():
            buffer = np.full(nbytes + SLACK, 0xA5, dtype=np.uint8).view(dtype)
            # Every other one in a context region, the others registered for their message.
            region = context.register_memory(buffer) if i % 2 else None
            request = comm.irecv(buffer, i)
            assert request.wait(timeout=120), f"message {i} did not arrive"
            assert request.sizes == (nbytes,)
            got = buffer.view(np.uint8)
            assert np.array_equal(got[:nbytes], pattern(i, nbytes)), f"message {i}: bytes differ"
            assert (got[nbytes:] == 0xA5).all(), f"message {i}: written past its end"
            if region is not None:
                region.close()
            seen.append(nbytes)
        conn.send("done")
        return seen


def sizes_sender(conn):
    with loom.Context() as context:
        comm = connect(conn, context)
        for i, nbytes, dtype in cases():
            data = pattern(i, nbytes, dtype)
            region = context.register_memory(data) if i % 3 == 0 and nbytes else None
            request = comm.isend(data, i)
            assert request.wait(timeout=120)
            assert request.sizes == (nbytes,)
            del region
        assert conn.recv() == "done"


def test_every_byte_of_every_size_and_dtype():
    seen, _ = run_pair(sizes_receiver, sizes_sender)
    assert seen == [n for _, n, _ in cases()]


def grouped_receiver(conn):
    with loom.Context() as context:
        comm = accept(conn, context)
        for n in range(2, loom.MAX_RECV_BUFFERS + 1):
            tags = [100 + k for k in range(n)]
            if n == 4:
                tags = [7, 7, 8, 8]  # equal tags fill their buffers in send order
            lengths = [int(x) for x in np.random.default_rng(n).integers(1, 40000, size=n)]
            buffers = [np.zeros(length, dtype=np.uint8) for length in lengths]
            request = comm.irecv(buffers, tags)
            assert request.wait(timeout=60)
            assert request.sizes == tuple(lengths)
            order = conn.recv()  # the order the sender sent them in
            for k, buffer in enumerate(buffers):
                seed = n * 100 + k
                assert np.array_equal(buffer, pattern(seed, lengths[k])), (n, k, order)
            conn.send(lengths)
        conn.send("done")


def grouped_sender(conn):
    with loom.Context() as context:
        comm = connect(conn, context)
        rng = np.random.default_rng(1)
        for n in range(2, loom.MAX_RECV_BUFFERS + 1):
            tags = [100 + k for k in range(n)]
            if n == 4:
                tags = [7, 7, 8, 8]
            lengths = [int(x) for x in np.random.default_rng(n).integers(1, 40000, size=n)]
            order = list(range(n))
            if n != 4:
                rng.shuffle(order)
            messages = [pattern(n * 100 + k, lengths[k]) for k in range(n)]
            requests = [comm.isend(messages[k], tags[k]) for k in order]
            assert loom.wait_all(requests, timeout=60)
            conn.send(order)
            assert conn.recv() == lengths
        assert conn.recv() == "done"


def test_grouped_receives_match_by_tag():
    run_pair(grouped_receiver, grouped_sender)


WINDOW = 64
ROUNDS = 20


def window_receiver(conn, size):
    with loom.Context() as context:
        comm = accept(conn, context)
        slab = np.zeros(WINDOW * size, dtype=np.uint8)
        context.register_memory(slab)
        views = [slab[k * size:(k + 1) * size] for k in range(WINDOW)]
        for r in range(ROUNDS):
            requests = comm.irecv_many(views, [r * WINDOW + k for k in range(WINDOW)])
            assert len(requests) == WINDOW
            assert requests.wait(timeout=60)
            assert requests.sizes == [size] * WINDOW
            for k in range(WINDOW):
                assert views[k][0] == (r + k) % 256 and views[k][-1] == (r * k) % 256, (r, k)
            conn.send(r)


def window_sender(conn, size):
    with loom.Context() as context:
        comm = connect(conn, context)
        slab = np.zeros(WINDOW * size, dtype=np.uint8)
        views = [slab[k * size:(k + 1) * size] for k in range(WINDOW)]
        for r in range(ROUNDS):
            for k in range(WINDOW):
                views[k][0], views[k][-1] = (r + k) % 256, (r * k) % 256
            requests = comm.isend_many(views, [r * WINDOW + k for k in range(WINDOW)])
            assert loom.wait_all([requests], timeout=60)
            assert conn.recv() == r  # the receiver checked them: the buffers may change


@pytest.mark.parametrize("size", [4096, 100 << 10])
def test_windows_posted_in_one_call(size):
    run_pair(window_receiver, window_sender, size)


PEER_TIMEOUT_MS = 1500


def dead_peer_survivor(conn):
    with loom.Context(peer_timeout_ms=PEER_TIMEOUT_MS) as context:
        comm = accept(conn, context)
        buffer = np.zeros(1 << 20, dtype=np.uint8)
        assert comm.irecv(buffer, 1).wait(timeout=60)
        pending = comm.irecv(buffer, 2)  # its message never comes: the peer dies
        conn.send("kill")
        assert conn.recv() == "dying"
        try:  # the victim is gone once its end of the pipe closed
            while True:
                conn.recv()
        except EOFError:
            pass
        start = time.monotonic()
        with pytest.raises(loom.PeerError) as failure:
            pending.wait(timeout=60)
        elapsed = time.monotonic() - start
        assert failure.value.status == loom.Status.PEER_ERROR
        assert failure.value.message
        return elapsed


def dead_peer_victim(conn):
    with loom.Context(peer_timeout_ms=PEER_TIMEOUT_MS) as context:
        comm = connect(conn, context)
        assert comm.isend(np.ones(1 << 20, dtype=np.uint8), 1).wait(timeout=60)
        assert conn.recv() == "kill"
        conn.send("dying")
        os.kill(os.getpid(), signal.SIGKILL)


def test_dead_peer_raises_within_the_peer_timeout():
    elapsed, status = run_pair(dead_peer_survivor, dead_peer_victim, dies=1)
    assert status == -signal.SIGKILL
    # Silence for LOOM_PEER_TIMEOUT_MS (measured from the last word, before the kill), then the
    # liveness check's own step: a loaded machine gets a generous margin on top.
    assert elapsed < PEER_TIMEOUT_MS / 1000 * 2 + 3, f"took {elapsed:.2f} s"


def gil_receiver(conn):
    with loom.Context() as context:
        comm = accept(conn, context)
        buffer = np.zeros(16, dtype=np.uint8)
        request = comm.irecv(buffer, 3)
        ticks = 0
        stop = threading.Event()

        def count():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                time.sleep(0.001)

        thread = threading.Thread(target=count)
        thread.start()
        conn.send("go")  # the sender waits 0.5 s, then sends
        assert request.wait(timeout=30)
        stop.set()
        thread.join()
        return ticks


def gil_sender(conn):
    with loom.Context() as context:
        comm = connect(conn, context)
        assert conn.recv() == "go"
        time.sleep(0.5)
        assert comm.isend(np.arange(16, dtype=np.uint8), 3).wait(timeout=30)


def test_a_waiting_thread_releases_the_gil():
    ticks, _ = run_pair(gil_receiver, gil_sender)
    # Holding the GIL through the wait, the wait would leave it no turn at all.
    assert ticks > 10, f"the other thread ran {ticks} times in 0.5 s"


def close_receiver(conn):
    with loom.Context() as context:
        comm = accept(conn, context)
        held = bytearray(4096)
        request = comm.irecv(held, 1)
        with pytest.raises(BufferError):
            held.extend(b"x")  # its memory is held while the receive may write it
        conn.send("posted")
        comm.close()
        assert comm.closed
        with pytest.raises(loom.CancelledError):
            request.wait(timeout=10)
        held.extend(b"x")  # let go once the request ended
        with pytest.raises(loom.ClosedError):
            comm.irecv(held, 2)
        conn.send("closed")


def close_sender(conn):
    with loom.Context() as context:
        comm = connect(conn, context)
        assert conn.recv() == "posted"
        assert conn.recv() == "closed"
        with pytest.raises(loom.PeerError):
            comm.isend(b"late", 1).wait(timeout=30)


def test_close_cancels_pending_requests_and_lets_go_of_their_memory():
    run_pair(close_receiver, close_sender)
