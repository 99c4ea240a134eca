#!/usr/bin/env python3
"""A KV-cache transfer between two processes: the prefill process writes 128 blocks of 16-512 KiB
straight into the decode process's cache, then one notification says the request is in.
Run: PYTHONPATH=build/python examples/kv_transfer.py   (LOOM_PROVIDER=shm, tcp, ... as usual)"""
import multiprocessing as mp
import time

import numpy as np

import loom

SLOT, ROUNDS = 512 << 10, 10
LENGTHS = [int(n) for n in np.random.default_rng(0).integers(16 << 10, SLOT + 1, size=128)]


def decode(pipe):  # the target: owns the KV cache, learns when each request's blocks are in
    with loom.Context() as ctx:
        cache = np.zeros(len(LENGTHS) * SLOT, dtype=np.uint8)
        region = ctx.register_memory(cache)
        listener = ctx.listen()
        pipe.send(listener.handle)
        target = listener.accept_rma()
        pipe.send(target.export_region(region))
        for _ in range(ROUNDS):
            note = target.wait()  # polls: every byte of the batch is in once it returns
            assert cache[LENGTHS[0] - 1] == note.tag % 251  # block 0's last byte is this round's
            pipe.send(note.bytes)


def prefill(pipe):  # the initiator: writes its blocks, then says "request `tag` is in"
    with loom.Context() as ctx:
        rma = ctx.connect_rma(pipe.recv()).wait()
        remote = rma.import_region(pipe.recv())
        kv = np.empty(len(LENGTHS) * SLOT, dtype=np.uint8)
        local = ctx.register_memory(kv)
        blocks = [(local, i * SLOT, remote, i * SLOT, n) for i, n in enumerate(LENGTHS)]
        for tag in range(ROUNDS):
            kv[:] = tag % 251
            start = time.perf_counter()
            rma.write(blocks, loom.Notification(tag=tag)).wait()  # the notification leaves
            landed = pipe.recv()  # the decode side saw it
            seconds = time.perf_counter() - start
            print(f"request {tag}: {landed / 2**20:.1f} MiB in {seconds * 1e3:.2f} ms, "
                  f"{landed / seconds / 1e9:.2f} GB/s")


if __name__ == "__main__":
    ends = mp.Pipe()
    sides = [mp.Process(target=side, args=(end,)) for side, end in zip((decode, prefill), ends)]
    for p in sides:
        p.start()
    for p in sides:
        p.join()
