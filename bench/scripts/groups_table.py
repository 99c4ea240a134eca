#!/usr/bin/env python3
"""N:m grouping figures: N communicators each way between a hub and P peer processes, with
m = 0 (a lane per communicator), 1 and 4 lanes per direction shared by all of them. Prints the
hub's lanes, endpoints, memory and setup time per communicator, from fi_p2p_hub --json runs
(one verified 1 MiB message on every communicator each way).

  bench/scripts/groups_table.py [--providers tcp,shm] [--comms 64] [--peers 1,4,16] [--groups 0,1,4]

fi_p2p_hub sets loom's recommended provider settings where the environment lacks them (for
tcp;ofi_rxm a shared receive queue of 256 buffers per endpoint), as fi_p2p_bw does.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def provider_env(provider, build):
    env = dict(os.environ, LOOM_PROVIDER=provider)
    env.pop("LOOM_NICS", None)
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
    parser.add_argument("--providers", default="tcp,shm")
    parser.add_argument("--comms", type=int, default=64, help="communicators each way in all")
    parser.add_argument("--peers", default="1,4,16")
    parser.add_argument("--groups", default="0,1,4")
    parser.add_argument("--build", default="build-release")
    args = parser.parse_args()
    binary = os.path.join(args.build, "bench", "p2p_hub", "fi_p2p_hub")
    print(f"hub side; {args.comms} communicators each way spread evenly over the peers;"
          " 1 data + 1 control rail per lane")
    print(f"{'provider':9} {'peers':>5} {'m':>2} {'lanes':>5} {'endpoints':>9} "
          f"{'KiB/comm':>9} {'setup us/comm':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for provider in args.providers.split(","):
            for peers in (int(p) for p in args.peers.split(",")):
                for groups in args.groups.split(","):
                    per_peer = args.comms // peers
                    path = f"{tmp}/run.json"
                    cmd = [binary, "--peers", str(peers), "--comms-per-peer", str(per_peer),
                           "--groups", groups, "-S", "1m", "--timeout", "300", "-q",
                           "--json", path]
                    run = subprocess.run(cmd, env=provider_env(provider, args.build),
                                         capture_output=True, text=True, timeout=900)
                    if run.returncode != 0:
                        print(f"{provider:9} {peers:>5} {groups:>2} failed: "
                              f"{(run.stderr.strip().splitlines() or [''])[-1]}")
                        continue
                    with open(path) as f:
                        data = json.load(f)
                    last = data["rows"][-1]
                    comms = 2 * per_peer * peers  # each way
                    setup_us = sum(p["setup_us"] for p in data["per_peer"])
                    growth_kib = last["rss_kib"] - data["rss_before_kib"]
                    print(f"{provider:9} {peers:>5} {groups:>2} {last['lanes']:>5} "
                          f"{last['endpoints']:>9} {growth_kib / comms:>9.0f} "
                          f"{setup_us / comms:>13.0f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
