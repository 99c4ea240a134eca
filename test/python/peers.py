"""What both sides of a two-process test do to connect."""
import numpy as np

import loom


def accept(conn, context, rma=False):
    """Listens, sends the handle over `conn`, returns the RecvComm (or RmaTarget)."""
    listener = context.listen()
    conn.send_bytes(listener.handle)
    made = listener.accept_rma(timeout=60) if rma else listener.accept(timeout=60)
    assert made is not None, "no peer connected within 60 s"
    listener.close()
    return made


def connect(conn, context, rma=False):
    """Connects to the handle that comes over `conn`; returns the SendComm (or RmaInitiator)."""
    handle = conn.recv_bytes()
    made = (context.connect_rma(handle) if rma else context.connect(handle)).wait(timeout=60)
    assert made is not None, "the listener did not accept within 60 s"
    return made


def pattern(seed, nbytes, dtype=np.uint8):
    """Deterministic content: `nbytes` bytes viewed as `dtype` (nbytes a multiple of its size)."""
    raw = np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)
    return raw.view(dtype)


def local_pair(sender, receiver):
    """A SendComm of `sender` to a RecvComm of `receiver`, both contexts in this process (the
    tests that do this run on tcp: shm keeps same-process pairs to loom's own tests)."""
    listener = receiver.listen()
    connector = sender.connect(listener.handle)
    out = into = None
    for _ in range(100000):
        out = out or connector.poll()
        into = into or listener.accept(timeout=0)
        if out is not None and into is not None:
            listener.close()
            return out, into
    raise AssertionError("no connection")
