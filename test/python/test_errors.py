"""Bad input raises the right exception, carrying loom's status and message: objects that are
not buffers, read-only or non-contiguous receive buffers, too small a buffer, too many buffers or
requests, closed communicators, bad handles and configuration. Also: DLPack objects, context
managers, Ctrl-C in a wait. One process, two contexts (tcp)."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import loom
from peers import local_pair, pattern


@pytest.fixture
def pair():
    with loom.Context() as a, loom.Context() as b:
        out, into = local_pair(a, b)
        yield a, b, out, into


def test_objects_that_are_not_buffers_raise_type_error(pair):
    a, _, out, into = pair
    for bad in (object(), 12, "text", None):
        with pytest.raises(TypeError):
            out.isend(bad, 1)
        with pytest.raises(TypeError):
            into.irecv(bad, 1)
        with pytest.raises(TypeError):
            a.register_memory(bad)
    with pytest.raises(TypeError):
        out.isend(b"x", -1)  # a tag is an unsigned 32-bit int
    with pytest.raises((OverflowError, ValueError)):
        out.isend_many([b"x"], [1 << 32])
    with pytest.raises(TypeError):
        into.irecv_many([bytearray(1)], ["tag"])


def test_read_only_and_non_contiguous_receive_buffers_are_refused(pair):
    _, _, out, into = pair
    frozen = np.zeros(16, dtype=np.uint8)
    frozen.flags.writeable = False
    for read_only in (b"bytes", memoryview(bytearray(16)).toreadonly(), frozen):
        with pytest.raises(loom.InvalidError, match="read-only") as failure:
            into.irecv(read_only, 1)
        assert failure.value.status == loom.Status.INVALID
    strided = np.zeros((16, 16), dtype=np.uint8)[:, 3]
    with pytest.raises(loom.InvalidError, match="contiguous"):
        into.irecv(strided, 1)
    with pytest.raises(loom.InvalidError, match="contiguous"):
        out.isend(strided, 1)
    # Read-only memory sends fine.
    request = into.irecv(bytearray(5), 2)
    assert loom.wait_all([out.isend(b"hello", 2), request], timeout=30)


def test_too_small_a_buffer_fails_on_both_sides(pair):
    """The first message of a connection waits for its buffer's announcement (no credit yet):
    the sender judges it too."""
    _, _, out, into = pair
    small = bytearray(10)
    receive = into.irecv(small, 4)
    send = out.isend(np.ones(100, dtype=np.uint8), 4)
    for request in (receive, send):
        with pytest.raises(loom.TruncatedError) as failure:
            request.wait(timeout=30)
        assert failure.value.status == loom.Status.TRUNCATED
        assert "larger than" in failure.value.message
        assert request.status == loom.Status.TRUNCATED
    assert small == bytearray(10)  # nothing written


def test_a_small_message_sent_ahead_is_judged_by_its_receiver_alone(pair):
    """Once credits are out a small message goes ahead of its buffer's announcement, and its
    send is done once it left, as an MPI or NCCL send is: only the receive fails."""
    _, _, out, into = pair
    first = bytearray(8)
    assert loom.wait_all([into.irecv(first, 1), out.isend(b"abcdefgh", 1)], timeout=30)
    small = bytearray(10)
    receive = into.irecv(small, 4)
    send = out.isend(np.arange(100, dtype=np.uint8), 4)
    send.wait(timeout=30)
    assert send.status == loom.Status.OK
    with pytest.raises(loom.TruncatedError, match="larger than"):
        receive.wait(timeout=30)
    assert small == bytearray(10)  # nothing written
    after = bytearray(3)
    assert loom.wait_all([into.irecv(after, 5), out.isend(b"xyz", 5)], timeout=30)
    assert after == bytearray(b"xyz")


def test_too_many_buffers_or_requests(pair):
    _, _, out, into = pair
    buffers = [bytearray(8) for _ in range(loom.MAX_RECV_BUFFERS + 1)]
    with pytest.raises(loom.InvalidError, match="1 to 8 buffers"):
        into.irecv(buffers, list(range(len(buffers))))
    with pytest.raises(loom.InvalidError, match="tags"):
        into.irecv(buffers[:3], [1, 2])
    with pytest.raises(loom.InvalidError):
        into.irecv([], [])
    with pytest.raises(loom.RetryError, match="do not fit"):
        into.irecv_many(buffers * 20, 9)  # 180 > 128: nothing is posted
    held = [into.irecv(bytearray(8), 9) for _ in range(loom.MAX_REQUESTS_PER_COMM)]
    with pytest.raises(loom.RetryError) as failure:
        into.irecv(bytearray(8), 9)
    assert failure.value.status == loom.Status.RETRY
    sent = out.isend_many([b"12345678"] * len(held), 9)
    assert loom.wait_all(held + [sent], timeout=60)
    assert sent.sizes == [8] * len(held)


def test_closed_communicator_raises_and_its_requests_are_cancelled(pair):
    _, _, out, into = pair
    pending = into.irecv(bytearray(8), 1)
    into.close()
    into.close()  # idempotent
    with pytest.raises(loom.ClosedError, match="closed") as failure:
        into.irecv(bytearray(8), 1)
    assert isinstance(failure.value, loom.InvalidError)
    with pytest.raises(loom.CancelledError):
        pending.test()
    with pytest.raises(loom.CancelledError):  # every time it is asked
        pending.wait()
    with pytest.raises(loom.ClosedError):
        into.stats()


def test_bad_configuration_and_handles():
    with pytest.raises(TypeError, match="unknown config keyword"):
        loom.Context(no_such_setting=1)
    with pytest.raises(loom.InvalidError, match="LOOM_DATA_RAILS"):
        loom.Context(data_rails="many")
    with pytest.raises(loom.ProviderError) as failure:
        loom.Context(provider="no-such-provider")
    assert failure.value.operation
    with loom.Context() as context:
        with pytest.raises(loom.InvalidError):
            context.connect(b"x" * (loom.MAX_HANDLE_BYTES + 1))
        with pytest.raises(loom.InvalidError):
            context.connect(b"not a handle")
        with pytest.raises(loom.InvalidError, match="empty"):
            context.register_memory(bytearray())
    assert context.closed
    with pytest.raises(loom.ClosedError):
        context.listen()


def test_device_memory_without_cuda_is_refused():
    class FakeCudaArray:
        __cuda_array_interface__ = {"shape": (1024,), "typestr": "<f4", "data": (1 << 40, False),
                                    "strides": None, "version": 3}

    with loom.Context() as context:
        if any(nic["device_memory"] for nic in context.nics()):
            pytest.skip("this build and provider take CUDA memory")
        with pytest.raises(loom.ProviderError, match="CUDA|device"):
            context.register_memory(FakeCudaArray())


class DLPackOnly:
    """Host memory offered through __dlpack__ alone (as a torch CPU tensor does)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_dlpack_objects_move_and_are_held(pair):
    a, _, out, into = pair
    source = np.arange(4096, dtype=np.uint32)
    sink = np.zeros_like(source)
    region = a.register_memory(DLPackOnly(source))
    assert region.nbytes == source.nbytes and region.device == "cpu"
    receive = into.irecv(DLPackOnly(sink), 3)
    assert loom.wait_all([out.isend(DLPackOnly(source), 3), receive], timeout=30)
    assert receive.sizes == (source.nbytes,)
    assert np.array_equal(source, sink)
    region.close()


def test_context_managers_close_what_they_opened():
    with loom.Context() as a, loom.Context() as b:
        with b.listen() as listener:
            out, into = local_pair(a, b)
        assert listener.closed
        with a.register_memory(bytearray(64)) as region:
            assert not region.closed
        assert region.closed
        with out, into:
            pass
        assert out.closed and into.closed
        again, kept = local_pair(a, b)
    assert a.closed and b.closed and again.closed and kept.closed


def test_errors_carry_status_and_message():
    assert issubclass(loom.InvalidError, loom.Error) and issubclass(loom.InvalidError, ValueError)
    assert issubclass(loom.PeerError, ConnectionError)
    assert issubclass(loom.ClosedError, loom.InvalidError)
    for cls, status in ((loom.RetryError, loom.Status.RETRY),
                        (loom.TruncatedError, loom.Status.TRUNCATED),
                        (loom.CancelledError, loom.Status.CANCELLED),
                        (loom.PeerError, loom.Status.PEER_ERROR),
                        (loom.ProviderError, loom.Status.ERROR)):
        assert cls.status == status


def test_ctrl_c_raises_out_of_a_wait_and_the_request_goes_on(pair):
    # libinfinipath (linked by Debian's libfabric) installs its own SIGINT handler when loaded,
    # which ended the interpreter with status 1; the module puts Python's back.
    _, _, out, into = pair
    request = into.irecv(bytearray(8), 1)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        request.wait(timeout=30)
    assert time.monotonic() - started < 5
    timer.join()
    assert loom.wait_all([request, out.isend(b"12345678", 1)], timeout=30)
    assert request.sizes == (8,)


def test_connect_labels_name_the_peer_at_both_ends():
    """accept() takes connects in the order they came; the label each connect carried says
    which one it is, on both communicators (and on one-sided connections)."""
    labels = [7, 0, (1 << 64) - 1]
    with loom.Context() as a, loom.Context() as b:
        listener = b.listen()
        connectors = [a.connect(listener.handle, label=label) for label in labels]
        rma_connector = a.connect_rma(listener.handle, label=99)
        outs, intos = [None] * len(labels), []
        initiator = target = None
        for _ in range(100000):
            outs = [out or c.poll() for out, c in zip(outs, connectors)]
            made = listener.accept(timeout=0)
            if made is not None:
                intos.append(made)
            initiator = initiator or rma_connector.poll()
            target = target or listener.accept_rma(timeout=0)
            if all(outs) and len(intos) == len(labels) and initiator and target:
                break
        assert [out.label for out in outs] == labels
        assert sorted(into.label for into in intos) == sorted(labels)
        assert (initiator.label, target.label) == (99, 99)
        # Each accepted communicator is its labelled sender's: bytes keyed by the label arrive.
        got = [np.zeros(64, dtype=np.uint8) for _ in intos]
        receives = [into.irecv(buffer, 5) for into, buffer in zip(intos, got)]
        sends = [out.isend(pattern(out.label % 1000, 64), 5) for out in outs]
        assert all(request.wait(timeout=30) for request in receives + sends)
        for into, buffer in zip(intos, got):
            assert np.array_equal(buffer, pattern(into.label % 1000, 64))
        with pytest.raises((OverflowError, TypeError)):
            a.connect(listener.handle, label=-1)
        with pytest.raises((OverflowError, TypeError)):
            a.connect(listener.handle, label=1 << 64)
        intos[0].close()
        with pytest.raises(loom.ClosedError):
            intos[0].label
        listener.close()
