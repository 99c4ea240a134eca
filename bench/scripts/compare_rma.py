#!/usr/bin/env python3
"""Runs loom's one-sided writes (fi_p2p_bw --op write) against fabtests' fi_rma_bw on the same
provider, interleaved, server pinned to core 0 and client to core 1, and prints per case (block
size x blocks per batch) the medians of the repetitions and their ratios:

Every loom column but `distinct` writes all blocks from one local slot into one remote slot
(--offsets same), as fi_rma_bw writes one buffer: the ratios compare protocols, not memory.

  distinct        loom writing each block of a batch from and to its own slot (--offsets
                  contiguous, as a KV-cache transfer does): 64 MiB per batch at 512k x 128, so on
                  shm (a memory copy) it reads memory bandwidth where the others read the cache's
  loom/write      loom's notified batches against fi_rma_bw -o write (no notification at all)
  loom/writedata  against fi_rma_bw -o writedata (remote CQ data on every write)
  loom/write-dc   against fi_rma_bw -o write -U: FI_DELIVERY_COMPLETE, as loom's writes go (its
                  notification follows their completions), so this one compares the rest
  compl/cqdata    loom's two notification protocols on this machine: after completion (loom's)
                  against counted CQ data (--notify-protocol cq-data, NIXL's)
  paired          the median of each repetition's own loom/write ratio (the five runs of a
                  repetition follow each other, so a slow period of the machine weighs on all)

and, per provider, 512k x 128 notified against one 16m block per batch (both loom; same slot,
and distinct slots, where 64m x 1 moves as many bytes per batch as 512k x 128). Every tool
moves the same blocks (100000 below 64 KiB, else about 2 GiB, as compare_fabtests.py): fi_rma_bw
one message per block with its window of 64, loom batches of --blocks with 2 batches in flight
(its default -W). Memory touched differs: fi_rma_bw writes every message from one buffer to one
remote address (one block's worth), and so does loom but in the distinct column. On a virtual
machine whole runs slow down by half now and then: interleave, use medians.

  FABTESTS_BIN=/tmp/fabtests/bin bench/scripts/compare_rma.py [--providers tcp,shm] [--reps 5]
      [--cases 512k:128,16m:1,64m:1,4k:128,16k:128,64k:128] [--show-runs]

fabtests are not part of loom: build them from libfabric's source (matching the installed
libfabric) into a directory of your own and point FABTESTS_BIN at its bin/.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_fabtests import (fabtests_args, iterations, loom_env, page_args, print_machine,
                              run_fabtests_pair, to_bytes)

CASES = "512k:128,16m:1,64m:1,4k:128,16k:128,64k:128"
PORT = 9700
TOOLS = ["loom", "cqdata", "distinct", "write", "writedata", "write_dc"]


def run_rma_bw(binary, op, provider, size, blocks, port, extra=()):
    args = fabtests_args(provider) + list(extra) + ["-o", op, "-S", str(to_bytes(size)), "-I",
                                                    str(blocks)]
    return float(run_fabtests_pair(binary, args, port)[4]) / 1000  # MB/sec -> GB/s


def run_loom(binary, provider, size, blocks, batches, protocol, offsets, json_path):
    """GB/s and the row's JSON."""
    done = subprocess.run([binary, "--loopback", "--pin-core", "0,1", "--op", "write",
                           "--blocks", str(blocks), "-S", size, "-I", str(batches), "-w", "2",
                           "--no-pingpong", "--notify-protocol", protocol, "--offsets", offsets,
                           "--json", json_path] + page_args(binary),
                          env=loom_env(provider), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1]
        raise RuntimeError(f"fi_p2p_bw {protocol} {offsets} {size}x{blocks} on {provider}: {why}")
    with open(json_path) as f:
        row = json.load(f)["results"][0]
    return row["gb_per_sec"], row


def ratio(a, b):
    return f"{a / b:.2f}" if a and b else "n/a"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--providers", default="tcp,shm")
    parser.add_argument("--cases", default=CASES, help="SIZE:BLOCKS,... (default %(default)s)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--loom", default="build-release/bench/p2p_bw/fi_p2p_bw")
    parser.add_argument("--show-runs", action="store_true",
                        help="also print every repetition's GB/s (loom/cqdata/write/writedata/"
                             "write-dc)")
    args = parser.parse_args()
    fabtests = os.environ.get("FABTESTS_BIN")
    if not fabtests:
        sys.exit("compare_rma: set FABTESTS_BIN to fabtests' bin directory")
    rma_bw = os.path.join(fabtests, "fi_rma_bw")
    print_machine([args.loom])
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",")]
    port = PORT
    with tempfile.TemporaryDirectory() as tmp:
        for provider in args.providers.split(","):
            print(f"\n## {provider} (loopback, 1 rail, server on core 0, client on core 1; "
                  f"loom -W 2 batches, fi_rma_bw -W 64; GB/s, median of {args.reps}, "
                  f"interleaved)")
            print(f"{'case':>9} {'loom':>6} {'cqdata':>7} {'distinct':>8} {'write':>6} {'wdata':>6} "
                  f"{'wr-dc':>6} {'loom/write':>11} {'loom/wdata':>11} {'loom/wr-dc':>11} "
                  f"{'compl/cqdata':>13} {'paired':>7} {'batch p50 us':>13} "
                  f"{'notify p50 us':>14}", flush=True)
            loom_by_case, distinct_by_case = {}, {}
            for size, blocks in cases:
                total = iterations(size)  # blocks each tool moves
                batches = max(total // blocks, 10)
                runs = {tool: [] for tool in TOOLS}
                rows = []

                def loom(protocol, offsets, into):
                    gbps, row = run_loom(args.loom, provider, size, blocks, batches, protocol,
                                         offsets, f"{tmp}/r.json")
                    into.append(gbps)
                    if protocol == "completion" and offsets == "same":
                        rows.append(row)

                steps = [lambda p: loom("completion", "same", runs["loom"]),
                         lambda p: loom("cq-data", "same", runs["cqdata"]),
                         lambda p: loom("completion", "contiguous", runs["distinct"]),
                         lambda p: runs["write"].append(
                             run_rma_bw(rma_bw, "write", provider, size, batches * blocks, p)),
                         lambda p: runs["writedata"].append(
                             run_rma_bw(rma_bw, "writedata", provider, size, batches * blocks,
                                        p)),
                         lambda p: runs["write_dc"].append(
                             run_rma_bw(rma_bw, "write", provider, size, batches * blocks, p,
                                        ["-U"]))]
                for rep in range(args.reps):
                    # Each tool goes first in turn: a run is slower right after one that zeroed
                    # and freed gigabytes.
                    for k in range(len(steps)):
                        port += 1
                        steps[(rep + k) % len(steps)](port)
                med = {tool: (statistics.median(v) if v and None not in v else None)
                       for tool, v in runs.items()}
                loom_by_case[(size, blocks)] = med["loom"]
                distinct_by_case[(size, blocks)] = med["distinct"]
                paired = statistics.median(a / b for a, b in zip(runs["loom"], runs["write"]))
                batch = statistics.median(r["batch_latency"]["p50_us"] for r in rows)
                notify = statistics.median(r["time_to_notify"]["p50_us"] for r in rows)
                fmt = lambda v: f"{v:.3f}" if v is not None else "n/a"
                print(f"{size + 'x' + str(blocks):>9} {fmt(med['loom']):>6} "
                      f"{fmt(med['cqdata']):>7} {fmt(med['distinct']):>8} {fmt(med['write']):>6} "
                      f"{fmt(med['writedata']):>6} {fmt(med['write_dc']):>6} "
                      f"{ratio(med['loom'], med['write']):>11} "
                      f"{ratio(med['loom'], med['writedata']):>11} "
                      f"{ratio(med['loom'], med['write_dc']):>11} "
                      f"{ratio(med['loom'], med['cqdata']):>13} {paired:7.2f} {batch:13.0f} "
                      f"{notify:14.0f}", flush=True)
                if args.show_runs:
                    print("          runs: " + " ".join(
                        "/".join(fmt(runs[t][r]) for t in TOOLS) for r in range(args.reps)),
                          flush=True)
            for name, by_case in (("same slot", loom_by_case), ("distinct slots", distinct_by_case)):
                many = by_case.get(("512k", 128))
                for big in ("16m", "64m"):
                    one = by_case.get((big, 1))
                    if many and one:
                        print(f"# {provider}, {name}: 512k x 128 notified / {big} x 1 notified = "
                              f"{many / one:.2f}")


if __name__ == "__main__":
    main()
