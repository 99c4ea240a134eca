#!/usr/bin/env python3
"""N:m grouping figures: for N communicators and m = 0 (a lane per communicator), 1 and 4,
prints the sender's endpoints, registered bytes, memory and setup time per communicator, and
the aggregate bandwidth at 1 MiB, from fi_p2p_bw --loopback --json runs.

  bench/groups_table.py [--providers tcp,shm,epmr] [--comms 1,8,64] [--groups 0,1,4]

tcp;ofi_rxm endpoints get rxm's per-connection bounce buffers (128, as loom turns rxm's shared
receive queue of 4096 off), so 64 ungrouped communicators fit in memory on a small machine.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def provider_env(provider, build):
    env = dict(os.environ, LOOM_PROVIDER=provider)
    if provider == "shm":
        env["FI_PROVIDER"] = "shm"
    else:
        env["LOOM_NICS"] = "lo"
        env["FI_PROVIDER"] = "tcp"
    if provider == "epmr":
        env["FI_PROVIDER"] = "epmr,tcp"
        env["FI_PROVIDER_PATH"] = os.path.join(build, "providers", "epmr")
    return env


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--providers", default="tcp,shm,epmr")
    parser.add_argument("--comms", default="1,8,64")
    parser.add_argument("--groups", default="0,1,4")
    parser.add_argument("--build", default="build-release")
    args = parser.parse_args()
    binary = os.path.join(args.build, "bench", "fi_p2p_bw")
    print("sender side; 1 data + 1 control rail;"
          " bandwidth = aggregate over the communicators at 1 MiB, window 64")
    print(f"{'provider':9} {'N':>3} {'m':>2} {'lanes':>5} {'endpoints':>9} {'registered':>11} "
          f"{'KiB/comm':>9} {'setup us':>9} {'GB/s 1MiB':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for provider in args.providers.split(","):
            for comms in args.comms.split(","):
                for groups in args.groups.split(","):
                    path = f"{tmp}/run.json"
                    cmd = [binary, "--loopback", "--pin-core", "0,1", "--no-pingpong", "-S", "1m",
                           "-I", "400", "--comms", comms, "--groups", groups, "--timeout", "120",
                           "--json", path]
                    run = subprocess.run(cmd, env=provider_env(provider, args.build),
                                         capture_output=True, text=True, timeout=900)
                    if run.returncode != 0:
                        print(f"{provider:9} {comms:>3} {groups:>2} failed: "
                              f"{run.stderr.strip().splitlines()[-1:]}")
                        continue
                    with open(path) as f:
                        data = json.load(f)
                    setup, result = data["setup"], data["results"][0]
                    print(f"{provider:9} {comms:>3} {groups:>2} {setup['send_lanes']:>5} "
                          f"{setup['lane_endpoints']:>9} "
                          f"{setup['registered_bytes'] / 2**20:>9.1f}Mi "
                          f"{setup['memory_kib_per_comm']:>9.0f} "
                          f"{setup['connect_accept_us_median']:>9.0f} "
                          f"{result['gb_per_sec']:>10.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
