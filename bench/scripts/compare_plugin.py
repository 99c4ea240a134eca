#!/usr/bin/env python3
"""Runs loom's NCCL net plugin through ncclnet_check --bw and loom's fi_p2p_bw on the same
provider, sizes and window, interleaved (each tool goes first in turn), server pinned to one
core and client to another, and prints plugin/fi_p2p_bw per size: of the medians of the
repetitions and the median of each repetition's own ratio ("paired").

  bench/scripts/compare_plugin.py [--build build-release] [--providers tcp,shm] [--reps 5]

Both tools use the same libloom from the build directory: the ratio is the plugin layer's
cost (the ncclNet calls, the request pool, NCCL-style progress thread), not loom's.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

SIZES = ["64k", "256k", "1m", "4m", "16m"]


def to_bytes(text):
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(text[:-1]) * scale[text[-1]] if text[-1] in scale else int(text)


def iterations(size):
    # about 1 GiB a run, at least 200 messages: long enough that a slow second of the
    # machine does not decide a run.
    return max((1 << 30) // to_bytes(size), 200)


def provider_env(provider):
    env = dict(os.environ, LOOM_PROVIDER=provider, FI_PROVIDER=provider)
    if provider != "shm":
        env["LOOM_NICS"] = "lo"
    return env


def run(args, env, json_path):
    subprocess.run(args + ["--json", json_path], env=env, check=True, capture_output=True,
                   timeout=600)
    with open(json_path) as f:
        result = json.load(f)["results"][0]
    return result["mb_per_sec"]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build-release")
    parser.add_argument("--providers", default="tcp,shm")
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    check = os.path.join(args.build, "tools", "ncclnet_check", "ncclnet_check")
    p2p_bw = os.path.join(args.build, "bench", "p2p_bw", "fi_p2p_bw")
    plugin = os.path.abspath(os.path.join(args.build, "lib", "nccl", "libnccl-net-loom.so"))
    with tempfile.TemporaryDirectory() as tmp:
        for provider in args.providers.split(","):
            env = provider_env(provider)
            print(f"\n## {provider} (loopback, window {args.window}, server on core 0, client on "
                  f"core 1; median of {args.reps}, interleaved)")
            print(f"{'size':>6} {'iters':>6} {'plugin MB/s':>12} {'fi_p2p_bw MB/s':>15} "
                  f"{'ratio':>6} {'paired':>7} {'plugin min..max':>17} {'p2p_bw min..max':>17}")
            for size in args.sizes.split(","):
                common = ["-S", size, "-I", str(iterations(size)), "-W", str(args.window),
                          "--pin-core", "0,1"]
                tools = [
                    lambda: run([check, plugin, "--bw"] + common, env, f"{tmp}/plugin.json"),
                    lambda: run([p2p_bw, "--loopback", "--no-pingpong"] + common, env,
                                f"{tmp}/p2p.json"),
                ]
                results = [[], []]
                for rep in range(args.reps):
                    for k in range(len(tools)):
                        which = (rep + k) % len(tools)
                        results[which].append(tools[which]())
                plug, ref = results
                ratio = statistics.median(plug) / statistics.median(ref)
                paired = statistics.median(p / r for p, r in zip(plug, ref))
                print(f"{size:>6} {iterations(size):>6} {statistics.median(plug):12.1f} "
                      f"{statistics.median(ref):15.1f} {ratio:6.3f} {paired:7.3f} "
                      f"{min(plug):8.0f}..{max(plug):<8.0f} {min(ref):8.0f}..{max(ref):<8.0f}",
                      flush=True)


if __name__ == "__main__":
    main()
