"""One-sided transfers between two processes on the provider the environment names: batches of
128 blocks of 16-512 KiB written into a target's region, every byte checked once the
notification came, notifications in post order, reads back; descriptors and blocks refused
when bad; a closed region revoked; a region holding its memory alive."""
import gc
import weakref

import numpy as np
import pytest

import loom
from conftest import run_pair
from peers import accept, connect, pattern

SLOT = 512 << 10
BLOCKS = 128
BATCHES = 3


def block_lengths(batch):
    rng = np.random.default_rng(batch)
    return [int(x) for x in rng.integers(16 << 10, SLOT + 1, size=BLOCKS)]


def kv_target(conn):
    with loom.Context() as context:
        target = accept(conn, context, rma=True)
        cache = np.zeros(BATCHES * BLOCKS * SLOT, dtype=np.uint8)
        region = context.register_memory(cache)
        conn.send_bytes(target.export_region(region))
        notes = []
        while len(notes) < BATCHES:
            note = target.wait(timeout=120)  # polls; on shm its progress carries the writes
            assert note is not None, "no notification within 120 s"
            batch = note.value
            # Every byte of the batch is in once its notification is out.
            for i, length in enumerate(block_lengths(batch)):
                start = (batch * BLOCKS + i) * SLOT
                assert np.array_equal(cache[start:start + length],
                                      pattern(batch * 1000 + i, length)), (batch, i)
            notes.append((note.tag, note.value, note.blocks, note.bytes))
        conn.send("checked")
        assert conn.recv() == "read back"
        # Bad exports: a read-only region, a closed one, one of another context.
        with pytest.raises(loom.InvalidError, match="read-only"):
            target.export_region(context.register_memory(b"constant bytes"))
        closed = context.register_memory(np.zeros(64, dtype=np.uint8))
        closed.close()
        with pytest.raises(loom.ClosedError):
            target.export_region(closed)
        with loom.Context() as other:
            with pytest.raises(loom.InvalidError, match="another context"):
                target.export_region(other.register_memory(bytearray(64)))
        # Revocation: closing the region makes the initiator refuse writes into it.
        region.close()
        conn.send("revoked")
        assert conn.recv() == "refused"
        target.close()
        return notes


def kv_initiator(conn):
    with loom.Context() as context:
        rma = connect(conn, context, rma=True)
        descriptor = conn.recv_bytes()
        assert len(descriptor) <= loom.MAX_REGION_DESCRIPTOR_BYTES
        remote = rma.import_region(descriptor)
        staging = np.zeros(BATCHES * BLOCKS * SLOT, dtype=np.uint8)
        local = context.register_memory(staging)
        requests = []
        for batch in range(BATCHES):
            blocks = []
            for i, length in enumerate(block_lengths(batch)):
                start = (batch * BLOCKS + i) * SLOT
                staging[start:start + length] = pattern(batch * 1000 + i, length)
                # Offsets as numpy computes them work too, and blocks as lists.
                block = (local, np.int64(start) if i % 2 else start, remote, start, length)
                blocks.append(list(block) if i % 5 == 0 else block)
            requests.append(rma.write(blocks, loom.Notification(tag=42, value=batch)))
        # The notifications leave as this side's progress sees each batch complete.
        assert loom.wait_all(requests, timeout=120)
        assert conn.recv() == "checked"
        # Read the first batch back into a second buffer.
        back = np.zeros(BLOCKS * SLOT, dtype=np.uint8)
        back_region = context.register_memory(back)
        lengths = block_lengths(0)
        reads = [(back_region, i * SLOT, remote, i * SLOT, lengths[i]) for i in range(BLOCKS)]
        assert rma.read(reads).wait(timeout=120)
        for i, length in enumerate(lengths):
            assert np.array_equal(back[i * SLOT:i * SLOT + length], pattern(i, length)), i
        bad_blocks(rma, context, local, remote, descriptor)
        conn.send("read back")
        assert conn.recv() == "revoked"
        with pytest.raises(loom.InvalidError, match="deregistered"):
            rma.write([(local, 0, remote, 0, 4096)]).wait(timeout=60)
        with pytest.raises(loom.InvalidError, match="stale"):
            rma.import_region(descriptor)
        conn.send("refused")
        rma.close()
        with pytest.raises(loom.ClosedError):
            rma.write([(local, 0, remote, 0, 8)])


def bad_blocks(rma, context, local, remote, descriptor):
    size = BATCHES * BLOCKS * SLOT
    with pytest.raises(loom.InvalidError, match="outside the remote region"):
        rma.write([(local, 0, remote, size - 10, 11)])
    with pytest.raises(loom.InvalidError, match="outside the local region"):
        rma.write([(local, size - 10, remote, 0, 11)])
    with pytest.raises(loom.InvalidError, match="negative"):
        rma.write([(local, -1, remote, 0, 8)])
    with pytest.raises(loom.InvalidError):
        rma.write([])
    with pytest.raises(TypeError):
        rma.write([(b"not a region", 0, remote, 0, 8)])
    with pytest.raises(TypeError):
        rma.write([(local, 0, descriptor, 0, 8)])  # bytes, not an imported region
    with pytest.raises(TypeError):
        rma.write([(local, 0, remote, 0)])
    with pytest.raises(loom.InvalidError, match="read-only"):
        rma.read([(context.register_memory(b"x" * 64), 0, remote, 0, 8)])
    with loom.Context() as other:
        with pytest.raises(loom.InvalidError, match="another context"):
            rma.write([(other.register_memory(bytearray(64)), 0, remote, 0, 8)])
    corrupt = bytearray(descriptor)
    corrupt[0] ^= 0xFF
    with pytest.raises(loom.InvalidError, match="magic"):
        rma.import_region(bytes(corrupt))
    with pytest.raises(loom.InvalidError, match="truncated"):
        rma.import_region(descriptor[:-1])


def test_kv_batches_land_whole_and_in_order():
    notes, _ = run_pair(kv_target, kv_initiator)
    assert notes == [(42, b, BLOCKS, sum(block_lengths(b))) for b in range(BATCHES)]


def alive_target(conn):
    with loom.Context() as context:
        target = accept(conn, context, rma=True)
        array = np.zeros(1 << 20, dtype=np.uint8)
        alive = weakref.ref(array)
        region = context.register_memory(array)
        conn.send_bytes(target.export_region(region))
        del array
        gc.collect()
        assert alive() is not None, "the region let its memory go"
        note = target.wait(timeout=60)
        assert note is not None and note.bytes == 1 << 20
        assert np.array_equal(alive(), pattern(5, 1 << 20))
        region.close()
        gc.collect()
        assert alive() is None, "a closed region still holds its memory"
        conn.send("done")


def alive_initiator(conn):
    with loom.Context() as context:
        rma = connect(conn, context, rma=True)
        remote = rma.import_region(conn.recv_bytes())
        data = pattern(5, 1 << 20)
        region = context.register_memory(data)
        del data  # the region holds it, and the request holds the region
        request = rma.write([(region, 0, remote, 0, 1 << 20)], notification=7)
        del region
        assert request.wait(timeout=60)
        assert conn.recv() == "done"


def test_a_region_keeps_its_memory_alive():
    run_pair(alive_target, alive_initiator)
