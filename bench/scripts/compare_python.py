#!/usr/bin/env python3
"""Runs the Python-driven bench (bench/python/p2p_bw.py, through the `loom` module) and the C++
fi_p2p_bw on the same provider, sizes and window, interleaved (each goes first in turn), server
pinned to one core and client to another, and prints python/fi_p2p_bw per size: the ratio of
the medians of the repetitions and the median of each repetition's own ratio ("paired").

  bench/scripts/compare_python.py [--build build] [--providers tcp,shm] [--reps 5]
      [--sizes 4k,1m,16m] [--bytes 1g] [--expect 4k=0.7,1m=0.95,16m=0.95] [--fail-below R]
      [--per-message]

Both use the same libloom from the build directory: the ratio is the Python layer's cost.
--expect marks each row ok/LOW against the ratio the Python package promises; --fail-below R
exits 1 when a paired ratio and the ratio of the two tools' best runs are both below R (a
floor for CI, where the machine's load swings both tools 2x within a minute, and a virtual
machine that flips into its slow mode for two runs of three can halve one tool's median:
the best runs say whether the Python layer itself lost).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_BENCH = os.path.join(HERE, "..", "python", "p2p_bw.py")


def to_bytes(text):
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(text[:-1]) * scale[text[-1]] if text[-1] in scale else int(text)


def provider_env(provider, build):
    env = dict(os.environ, LOOM_PROVIDER=provider, FI_PROVIDER=provider)
    env["PYTHONPATH"] = os.path.join(build, "python")
    if provider != "shm":
        env["LOOM_NICS"] = "lo"
    if provider == "epmr":
        env["FI_PROVIDER"] = "epmr,tcp"
        env["FI_PROVIDER_PATH"] = os.path.abspath(os.path.join(build, "providers", "epmr"))
    return env


def run(args, env, json_path):
    done = subprocess.run(args + ["--json", json_path], env=env, capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    with open(json_path) as f:
        return json.load(f)["results"][0]["mb_per_sec"]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--providers", default="tcp,shm")
    parser.add_argument("--sizes", default="4k,1m,16m")
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--bytes", default="1g", help="per run and size (at least 200 messages)")
    parser.add_argument("--pin-core", default="0,1")
    parser.add_argument("--expect", default="4k=0.7,1m=0.95,16m=0.95")
    parser.add_argument("--fail-below", type=float, default=0.0)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--per-message", action="store_true",
                        help="the Python bench posts and waits one call per message")
    args = parser.parse_args()
    expect = dict(item.split("=") for item in args.expect.split(",") if item)
    p2p_bw = os.path.join(args.build, "bench", "p2p_bw", "fi_p2p_bw")
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for provider in args.providers.split(","):
            env = provider_env(provider, args.build)
            calls = "one call per message" if args.per_message else "one call per window"
            print(f"\n## {provider} (loopback, window {args.window}, cores {args.pin_core}; "
                  f"median of {args.reps}, interleaved; Python: {calls})")
            print(f"{'size':>6} {'iters':>7} {'python MB/s':>12} {'fi_p2p_bw MB/s':>15} "
                  f"{'ratio':>6} {'paired':>7} {'best':>6} {'python min..max':>17} "
                  f"{'p2p_bw min..max':>17}")
            for size in args.sizes.split(","):
                iters = max(to_bytes(args.bytes) // to_bytes(size), 200)
                common = ["-S", size, "-I", str(iters), "-W", str(args.window)]
                if args.pin_core:
                    common += ["--pin-core", args.pin_core]
                python = [args.python, PYTHON_BENCH] + (["--per-message"] if args.per_message else [])
                tools = [
                    lambda: run(python + common, env, f"{tmp}/py.json"),
                    lambda: run([p2p_bw, "--loopback", "--no-pingpong"] + common, env,
                                f"{tmp}/p2p.json"),
                ]
                results = [[], []]
                for rep in range(args.reps):
                    for k in range(len(tools)):
                        which = (rep + k) % len(tools)
                        results[which].append(tools[which]())
                py, ref = results
                ratio = statistics.median(py) / statistics.median(ref)
                paired = statistics.median(a / b for a, b in zip(py, ref))
                best = max(py) / max(ref)
                verdict = ""
                if size in expect:
                    verdict = "ok" if paired >= float(expect[size]) else f"LOW (< {expect[size]})"
                if paired < args.fail_below and best < args.fail_below:
                    failed = True
                    verdict += f" FAIL (< {args.fail_below})"
                print(f"{size:>6} {iters:>7} {statistics.median(py):12.1f} "
                      f"{statistics.median(ref):15.1f} {ratio:6.3f} {paired:7.3f} {best:6.3f} "
                      f"{min(py):8.0f}..{max(py):<8.0f} {min(ref):8.0f}..{max(ref):<8.0f} "
                      f"{verdict}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
