#!/usr/bin/env python3
"""Runs fi_p2p_alltoall's all-to-all on N ranks (mpirun) and fi_p2p_bw --loopback --bidir
(two processes) on the same provider and size, interleaved (each tool goes first in turn), and
prints each tool's aggregate MB/sec per repetition, the medians and their ratio, and the median
of each repetition's own ratio ("paired").

  bench/scripts/compare_alltoall.py [--build build] [--provider shm] [--ranks 4] [--size 1m]
                                    [--reps 5]

The all-to-all's aggregate is every rank's bytes over the slowest rank's time; fi_p2p_bw's with
--bidir is both directions' bytes over the run's time. Both use loom's recommended provider
settings, set by the tools themselves.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile


def provider_env(provider):
    env = dict(os.environ, LOOM_PROVIDER=provider, FI_PROVIDER=provider,
               # MPI only starts the ranks and swaps handles: its own transports stay off.
               OMPI_MCA_pml="ob1", OMPI_MCA_btl="self,vader,tcp")
    if provider != "shm":
        env["LOOM_NICS"] = "lo"
    return env


def p2p_bw(args, env, path):
    tool = os.path.join(args.build, "bench", "p2p_bw", "fi_p2p_bw")
    subprocess.run([tool, "--loopback", "--bidir", "-S", args.size, "-I", str(args.iterations),
                    "--no-pingpong", "--json", path], env=env, check=True, capture_output=True,
                   timeout=600)
    with open(path) as f:
        return json.load(f)["results"][0]["mb_per_sec"]


def alltoall(args, env, path):
    tool = os.path.join(args.build, "bench", "p2p_alltoall", "fi_p2p_alltoall")
    # Each iteration moves N - 1 messages each way per rank.
    iterations = max(args.iterations // (args.ranks - 1), 20)
    subprocess.run(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(args.ranks),
                    tool, "--pattern", "alltoall", "-S", args.size, "-I", str(iterations), "-q",
                    "--json", path], env=env, check=True, capture_output=True, timeout=600)
    with open(path) as f:
        return json.load(f)["aggregate"]["alltoall"][0]["mb_per_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--provider", default="shm")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--size", default="1m")
    parser.add_argument("--iterations", type=int, default=600,
                        help="fi_p2p_bw's messages per direction (default 600); the all-to-all "
                             "runs this / (ranks - 1) iterations")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    env = provider_env(args.provider)
    rates = {"alltoall": [], "p2p_bw": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.json")
        for rep in range(args.reps):
            order = [("alltoall", alltoall), ("p2p_bw", p2p_bw)]
            if rep % 2:
                order.reverse()
            for name, run in order:
                rates[name].append(run(args, env, path))
            print(f"rep {rep + 1}: alltoall {rates['alltoall'][-1]:.0f} MB/sec, fi_p2p_bw --bidir "
                  f"{rates['p2p_bw'][-1]:.0f} MB/sec, ratio "
                  f"{rates['alltoall'][-1] / rates['p2p_bw'][-1]:.2f}", flush=True)
    a, b = statistics.median(rates["alltoall"]), statistics.median(rates["p2p_bw"])
    paired = statistics.median(x / y for x, y in zip(rates["alltoall"], rates["p2p_bw"]))
    print(f"{args.provider}, {args.size}, {args.ranks} ranks: alltoall {a:.0f} MB/sec, "
          f"fi_p2p_bw --bidir {b:.0f} MB/sec (medians of {args.reps}); ratio {a / b:.2f}, "
          f"paired {paired:.2f}")


if __name__ == "__main__":
    main()
