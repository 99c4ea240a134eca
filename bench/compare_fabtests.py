#!/usr/bin/env python3
"""Runs loom's fi_p2p_bw and fabtests' fi_rdm_tagged_bw and fi_rma_bw -o writedata on the same
provider, interleaved, server pinned to one core and client to another, and prints the
loom/fabtests ratio per size: of the medians of the repetitions, of the best runs, and the
median of each repetition's own ratio ("paired": the three runs of a repetition follow each
other, so a slow period of the machine weighs on all three). Every
tool runs the same iterations, enough to move about 2 GiB (100000 messages at 4 KiB): on a
virtual machine whole runs slow down by half now and then, and a short run is all one or the
other.

  FABTESTS_BIN=/tmp/fabtests/bin bench/compare_fabtests.py [--providers tcp,shm] [--reps 3]

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
import time

SIZES = ["4k", "64k", "256k", "1m", "4m", "16m"]
PORT = 9400


def to_bytes(text):
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(text[:-1]) * scale[text[-1]] if text[-1] in scale else int(text)


def iterations(size):
    return 100000 if to_bytes(size) < 65536 else max((2 << 30) // to_bytes(size), 100)


def fabtests_args(provider):
    # tcp must bind 127.0.0.1 explicitly: with -d lo alone the server listens on eth0's address.
    if provider == "shm":
        return ["-p", "shm", "-e", "rdm", "-s", "127.0.0.1"]
    return ["-p", provider, "-e", "rdm", "-d", "lo", "-s", "127.0.0.1"]


def run_fabtests(binary, extra, provider, size, port):
    args = fabtests_args(provider) + extra + ["-S", str(to_bytes(size)), "-I",
                                             str(iterations(size))]
    server = subprocess.Popen(["taskset", "-c", "0", binary] + args + ["-B", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.4)
    try:
        out = subprocess.run(["taskset", "-c", "1", binary] + args + ["-P", str(port), "127.0.0.1"],
                             capture_output=True, text=True, timeout=180).stdout
    finally:
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    fields = out.strip().splitlines()[-1].split()
    return float(fields[4]), float(fields[6])  # MB/sec, Mxfers/sec


def run_loom(binary, provider, size, json_path):
    env = dict(os.environ, LOOM_PROVIDER=provider, FI_PROVIDER=provider)
    if provider != "shm":
        env["LOOM_NICS"] = "lo"
    subprocess.run([binary, "--loopback", "--pin-core", "0,1", "-S", size, "-I",
                    str(iterations(size)), "--no-pingpong", "--json", json_path], env=env,
                   check=True, capture_output=True, timeout=300)
    with open(json_path) as f:
        result = json.load(f)["results"][0]
    return result["mb_per_sec"], result["mxfers_per_sec"]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--providers", default="tcp,shm")
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--loom", default="build-release/bench/fi_p2p_bw")
    args = parser.parse_args()
    fabtests = os.environ.get("FABTESTS_BIN")
    if not fabtests:
        sys.exit("compare_fabtests: set FABTESTS_BIN to fabtests' bin directory")
    tagged = os.path.join(fabtests, "fi_rdm_tagged_bw")
    rma = os.path.join(fabtests, "fi_rma_bw")
    port = PORT
    with tempfile.TemporaryDirectory() as tmp:
        for provider in args.providers.split(","):
            print(f"\n## {provider} (loopback, 1 rail, window 64, server on core 0, client on "
                  f"core 1; median of {args.reps}, interleaved)")
            print(f"{'size':>6} {'loom MB/s':>10} {'tagged MB/s':>12} {'writedata MB/s':>15} "
                  f"{'loom/tagged':>12} {'loom/writedata':>15} {'loom/best':>10} "
                  f"{'best runs':>10} {'paired':>7} {'loom Mxfer/s':>13} {'tagged Mxfer/s':>15}")
            for size in args.sizes.split(","):
                loom, tag, wd = [], [], []
                runs = [lambda p: tag.append(run_fabtests(tagged, [], provider, size, p)),
                        lambda p: wd.append(run_fabtests(rma, ["-o", "writedata"], provider,
                                                         size, p)),
                        lambda p: loom.append(run_loom(args.loom, provider, size,
                                                       f"{tmp}/r.json"))]
                for rep in range(args.reps):
                    # Each tool goes first in turn: a run is slower right after one that
                    # zeroed and freed gigabytes (fabtests allocates 64 messages each way).
                    for k in range(len(runs)):
                        port += 1
                        runs[(rep + k) % len(runs)](port)
                med = lambda runs, i: statistics.median(r[i] for r in runs)
                top = lambda runs: max(r[0] for r in runs)
                l, t, w = med(loom, 0), med(tag, 0), med(wd, 0)
                best = top(loom) / max(top(tag), top(wd))
                paired = statistics.median(
                    lr[0] / max(tr[0], wr[0]) for lr, tr, wr in zip(loom, tag, wd))
                print(f"{size:>6} {l:10.1f} {t:12.1f} {w:15.1f} {l / t:12.2f} {l / w:15.2f} "
                      f"{l / max(t, w):10.2f} {best:10.2f} {paired:7.2f} {med(loom, 1):13.3f} "
                      f"{med(tag, 1):15.3f}", flush=True)


if __name__ == "__main__":
    main()
