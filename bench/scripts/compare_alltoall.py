#!/usr/bin/env python3
"""Runs fi_p2p_alltoall's all-to-all on N ranks (mpirun) and fi_p2p_bw --loopback --bidir
(two processes) on the same provider and size, interleaved (each tool goes first in turn), and
prints each tool's aggregate MB/sec per repetition, the medians and their ratio, and the median
of each repetition's own ratio ("paired").

Where the host has fewer cores than N, it also runs N/2 fi_p2p_bw --bidir pairs at once (as
many processes as the all-to-all has ranks, sharing the cores alike) and prints their sum and
the all-to-all's ratio to it: what oversubscription alone costs, beside what loom costs.

  bench/scripts/compare_alltoall.py [--build build] [--provider shm] [--ranks 4] [--size 1m]
                                    [--depth 64] [--groups G] [--env VAR=VALUE ...] [--reps 5]

The all-to-all's aggregate is every rank's bytes over the slowest rank's time; fi_p2p_bw's with
--bidir is both directions' bytes over the run's time. Both use loom's recommended provider
settings, set by the tools themselves. --groups and --env change the all-to-all's run only
(fi_p2p_bw runs as it is), e.g. --groups 0 (a lane per communicator) or --env
LOOM_PEER_ISOLATION=0.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile


def checked(command, env):
    """Runs a tool; on failure prints what it said before raising."""
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    if result.returncode != 0:
        print(result.stdout[-4000:], result.stderr[-4000:], sep="\n")
        result.check_returncode()
    return result


def provider_env(provider):
    env = dict(os.environ, LOOM_PROVIDER=provider, FI_PROVIDER=provider,
               # MPI only starts the ranks and swaps handles: its own transports stay off.
               OMPI_MCA_pml="ob1", OMPI_MCA_btl="self,vader,tcp")
    if provider != "shm":
        env["LOOM_NICS"] = "lo"
    return env


def p2p_bw(args, env, path):
    tool = os.path.join(args.build, "bench", "p2p_bw", "fi_p2p_bw")
    checked([tool, "--loopback", "--bidir", "-S", args.size, "-I", str(args.iterations),
             "--no-pingpong", "--json", path], env)
    with open(path) as f:
        return json.load(f)["results"][0]["mb_per_sec"]


def p2p_bw_pairs(args, env, path):
    """N/2 fi_p2p_bw --bidir pairs started together: the sum of their rates."""
    tool = os.path.join(args.build, "bench", "p2p_bw", "fi_p2p_bw")
    paths = [f"{path}.{i}" for i in range(args.ranks // 2)]
    runs = [subprocess.Popen([tool, "--loopback", "--bidir", "-S", args.size, "-I",
                              str(args.iterations), "--no-pingpong", "--json", p], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for p in paths]
    total = 0.0
    for run, p in zip(runs, paths):
        out, _ = run.communicate(timeout=1200)
        if run.returncode != 0:
            print(out[-4000:])
            raise subprocess.CalledProcessError(run.returncode, run.args)
        with open(p) as f:
            total += json.load(f)["results"][0]["mb_per_sec"]
    return total


def alltoall(args, env, path):
    tool = os.path.join(args.build, "bench", "p2p_alltoall", "fi_p2p_alltoall")
    # Each iteration moves N - 1 messages each way per rank.
    iterations = max(args.iterations // (args.ranks - 1), 20)
    extra = ["--groups", str(args.groups)] if args.groups is not None else []
    env = dict(env, **dict(item.split("=", 1) for item in args.env))
    checked(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(args.ranks), tool,
             "--pattern", "alltoall", "-S", args.size, "-I", str(iterations), "--depth",
             str(args.depth), "-q", "--json", path] + extra, env)
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
    parser.add_argument("--depth", type=int, default=64,
                        help="all-to-all iterations in flight (default 64, fi_p2p_bw's window)")
    parser.add_argument("--groups", type=int, help="the all-to-all's --groups")
    parser.add_argument("--env", action="append", default=[],
                        help="VAR=VALUE for the all-to-all's ranks (repeatable)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    env = provider_env(args.provider)
    cores = os.cpu_count() or 1
    tools = [("alltoall", alltoall), ("p2p_bw", p2p_bw)]
    if cores < args.ranks and args.ranks >= 4:
        tools.append(("pairs", p2p_bw_pairs))
    print(f"# {cores} cores, {args.ranks} ranks"
          + (f": also {args.ranks // 2} fi_p2p_bw --bidir pairs at once" if len(tools) > 2 else ""),
          flush=True)
    rates = {name: [] for name, _ in tools}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.json")
        for rep in range(args.reps):
            # Each tool goes first in turn.
            order = tools[rep % len(tools):] + tools[:rep % len(tools)]
            for name, run in order:
                rates[name].append(run(args, env, path))
            line = (f"rep {rep + 1}: alltoall {rates['alltoall'][-1]:.0f} MB/sec, fi_p2p_bw --bidir "
                    f"{rates['p2p_bw'][-1]:.0f} MB/sec, ratio "
                    f"{rates['alltoall'][-1] / rates['p2p_bw'][-1]:.2f}")
            if "pairs" in rates:
                line += (f"; {args.ranks // 2} pairs at once {rates['pairs'][-1]:.0f} MB/sec, ratio "
                         f"{rates['alltoall'][-1] / rates['pairs'][-1]:.2f}")
            print(line, flush=True)

    def ratio(base):
        a, b = statistics.median(rates["alltoall"]), statistics.median(rates[base])
        paired = statistics.median(x / y for x, y in zip(rates["alltoall"], rates[base]))
        return a, b, f"ratio {a / b:.2f}, paired {paired:.2f}"

    what = " ".join([f"--depth {args.depth}"] +
                    ([f"--groups {args.groups}"] if args.groups is not None else []) + args.env)
    a, b, text = ratio("p2p_bw")
    print(f"{args.provider}, {args.size}, {args.ranks} ranks{', ' + what if what else ''}: "
          f"alltoall {a:.0f} MB/sec, fi_p2p_bw --bidir {b:.0f} MB/sec (medians of {args.reps}); "
          f"{text}")
    if "pairs" in rates:
        _, c, text = ratio("pairs")
        print(f"  against {args.ranks // 2} fi_p2p_bw --bidir pairs at once ({args.ranks} processes "
              f"on {cores} cores): {c:.0f} MB/sec; {text}")


if __name__ == "__main__":
    main()
