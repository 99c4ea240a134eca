#!/usr/bin/env python3
"""fi_p2p_bw's bandwidth pass driven from Python through the `loom` module, to show what the
binding costs: server and client forked on this host (as fi_p2p_bw --loopback), handles over a
pipe. The client posts a window of messages from one buffer (SendComm.isend_many) and waits for
them (loom.wait_all) and for the server's 4-byte ack; the server keeps the next window's
receives posted (RecvComm.irecv_many) while one arrives, and both buffers are 2 MiB-aligned and
advised MADV_HUGEPAGE: fi_p2p_bw's protocol and memory, message for message.

  PYTHONPATH=build/python bench/python/p2p_bw.py -S 4k,1m,16m [-I N] [-W 64] [-w 10]
      [--pin-core 0,1] [--json FILE] [--no-provider-settings] [--per-message]

Prints fabtests' columns (bytes iters total time MB/sec usec/xfer Mxfers/sec); --json writes
them as fi_p2p_bw does ({"results": [{"bytes", "iterations", "seconds", "mb_per_sec", ...}]}).
--per-message posts and waits each message with its own call (isend/irecv/Request.wait_all of a
list) instead of one call per window.
"""
import argparse
import json
import mmap
import multiprocessing
import os
import sys
import time

import numpy as np

import loom

HUGE_PAGE = 2 << 20
ACK_TAG = 0xACCACC
WINDOWS_POSTED = 2


def to_bytes(text):
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(text[:-1]) * scale[text[-1]] if text[-1] in scale else int(text)


def default_iterations(size):  # fi_p2p_bw's (bench/common/options.cpp)
    return 20000 if size < (64 << 10) else 2000 if size < (1 << 20) else 200


def huge_page_buffer(size):
    """`size` bytes at a 2 MiB boundary of an anonymous mapping advised MADV_HUGEPAGE."""
    # Private: a shared anonymous mapping is shmem, which transparent huge pages leave alone.
    mapping = mmap.mmap(-1, max(size, 1) + 2 * HUGE_PAGE,
                        flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mapping.madvise(mmap.MADV_HUGEPAGE)
    whole = np.frombuffer(mapping, dtype=np.uint8)
    skip = -whole.ctypes.data % HUGE_PAGE
    buffer = whole[skip:skip + max(size, 1)]
    buffer[:] = 0x5A
    return buffer


def connect_both(conn, context):
    """A SendComm and a RecvComm to the peer at the other end of `conn`."""
    listener = context.listen()
    conn.send_bytes(listener.handle)
    connector = context.connect(conn.recv_bytes())
    out = into = None
    deadline = time.monotonic() + 60
    while out is None or into is None:
        out = out or connector.poll()
        into = into or listener.accept(timeout=0)
        if time.monotonic() > deadline:
            raise RuntimeError("connect: the peer did not answer in 60 s")
    listener.close()
    return out, into


class Side:
    def __init__(self, conn, options, client):
        self.conn, self.options, self.client = conn, options, client
        self.context = loom.Context(loopback_only=True)
        self.out, self.into = connect_both(conn, self.context)
        self.ack = np.zeros(4, dtype=np.uint8)
        self.context.register_memory(self.ack)
        self.message = 0
        self.conn.send("ready")
        assert self.conn.recv() == "ready"

    def prepare(self, size):
        self.buffer = huge_page_buffer(size)
        self.view = self.buffer[:size]
        self.region = self.context.register_memory(self.buffer)

    def send_windows(self, count):
        window, per_message = self.options.window, self.options.per_message
        done = 0
        while done < count:
            n = min(window, count - done)
            ack = self.into.irecv(self.ack, ACK_TAG)
            if per_message:
                sends = [self.out.isend(self.view, self.message + done) for _ in range(n)]
                loom.wait_all(sends)
            else:
                loom.wait_all([self.out.isend_many([self.view] * n, self.message + done)])
            ack.wait()
            done += n

    def receive_windows(self, count):
        window, per_message = self.options.window, self.options.per_message
        posted = 0
        ahead = WINDOWS_POSTED if WINDOWS_POSTED * window <= loom.MAX_REQUESTS_PER_COMM else 1

        def post_next():
            nonlocal posted
            n = min(window, count - posted)
            if n == 0:
                return None
            tag = self.message + posted
            posted += n
            if per_message:
                return [self.into.irecv(self.view, tag) for _ in range(n)]
            return [self.into.irecv_many([self.view] * n, tag)]

        windows = [post_next() for _ in range(ahead)]
        k = 0
        while windows[k % ahead] is not None:
            loom.wait_all(windows[k % ahead])
            self.out.isend(self.ack, ACK_TAG).wait()
            windows[k % ahead] = post_next()
            k += 1

    def bandwidth(self, count):
        self.conn.send("sync")
        assert self.conn.recv() == "sync"
        start = time.perf_counter()
        if self.client:
            self.send_windows(count)
        else:
            self.receive_windows(count)
        seconds = time.perf_counter() - start
        self.message += count
        return seconds


def run_side(conn, result, options, client):
    cores = [int(c) for c in options.pin_core.split(",")] if options.pin_core else []
    if len(cores) == 2:
        os.sched_setaffinity(0, {cores[1] if client else cores[0]})
    side = Side(conn, options, client)
    rows = []
    for size in options.sizes:
        side.prepare(size)
        iterations = options.iterations or default_iterations(size)
        if options.warmup:
            side.bandwidth(options.warmup)
        seconds = side.bandwidth(iterations)
        rows.append({"bytes": size, "iterations": iterations, "total_bytes": size * iterations,
                     "seconds": seconds, "mb_per_sec": size * iterations / seconds / 1e6,
                     "usec_per_xfer": seconds / iterations * 1e6,
                     "mxfers_per_sec": iterations / seconds / 1e6,
                     "gb_per_sec": size * iterations / seconds / 1e9})
    side.out.close()
    side.into.close()
    side.context.close()
    if client:
        result.send(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-S", dest="sizes", default="4k,64k,1m,16m")
    parser.add_argument("-I", dest="iterations", type=int, default=0)
    parser.add_argument("-w", dest="warmup", type=int, default=10)
    parser.add_argument("-W", dest="window", type=int, default=64)
    parser.add_argument("--pin-core", default="")
    parser.add_argument("--json")
    parser.add_argument("--no-provider-settings", action="store_true")
    parser.add_argument("--per-message", action="store_true")
    options = parser.parse_args()
    options.sizes = [to_bytes(s) for s in options.sizes.split(",")]
    if not options.no_provider_settings:  # as fi_p2p_bw: those the environment lacks
        for name, value, why in loom.recommended_provider_settings(loopback_only=True):
            if name not in os.environ:
                os.environ[name] = value
                print(f"# {name}={value} (loom's recommendation: {why})")
    # The parent makes no loom object: forked children start clean.
    mp = multiprocessing.get_context("fork")
    ends = mp.Pipe()
    result, client_result = mp.Pipe(duplex=False)
    procs = [mp.Process(target=run_side, args=(ends[i], client_result, options, i == 1))
             for i in range(2)]
    for p in procs:
        p.start()
    client_result.close()
    try:
        rows = result.recv()
    except EOFError:
        rows = None
    for p in procs:
        p.join()
    if rows is None or any(p.exitcode != 0 for p in procs):
        print("p2p_bw.py: a side failed", file=sys.stderr)
        return 1
    print(f"# p2p_bw.py (loom {loom.__version__} from Python), window {options.window}, "
          f"{'one call per message' if options.per_message else 'one call per window'}")
    print(f"{'bytes':<8} {'iters':<8} {'total':<10} {'time':<9} {'MB/sec':<10} "
          f"{'usec/xfer':<10} {'Mxfers/sec':<10}")
    for r in rows:
        print(f"{r['bytes']:<8} {r['iterations']:<8} {r['total_bytes']:<10} {r['seconds']:<9.3f} "
              f"{r['mb_per_sec']:<10.2f} {r['usec_per_xfer']:<10.2f} {r['mxfers_per_sec']:<10.3f}")
    if options.json:
        with open(options.json, "w") as f:
            json.dump({"tool": "p2p_bw.py", "results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
