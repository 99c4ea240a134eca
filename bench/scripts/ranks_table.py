#!/usr/bin/env python3
"""What each extra peer costs a rank, from fi_p2p_alltoall runs on one host at N = 2, 4, 8, 16,
32 ranks (mpirun --oversubscribe), per provider: endpoints and lanes per rank, RSS growth per
rank (from before the first connection to after the traffic; the benchmark's own buffers are
made before), what each peer beyond the first adds (the slope from N = 2), and setup time per
peer. Prints a Markdown table, then loom's figures projected to 256 and 1024 ranks.

  bench/scripts/ranks_table.py [--build build] [--providers tcp,shm] [--ranks 2,4,8,16,32]
                               [--json-dir DIR]

Every rank holds a send and a receive communicator and a one-sided initiator and target per
peer (--pattern alltoall,ep) and moves 4 KiB and 64 KiB all-to-alls and a dispatch/combine
over them. Bandwidth on an oversubscribed host means nothing; the per-peer costs do.
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
               OMPI_MCA_pml="ob1", OMPI_MCA_btl="self,vader,tcp")
    if provider != "shm":
        env["LOOM_NICS"] = "lo"
    return env


def run(args, provider, ranks, path):
    tool = os.path.join(args.build, "bench", "p2p_alltoall", "fi_p2p_alltoall")
    command = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(ranks), tool,
               "--pattern", "alltoall,ep", "-S", "l:4k,64k", "-I", "20", "--tokens", "32",
               "--timeout", "120", "-q", "--json", path]
    checked(command, provider_env(provider))
    with open(path) as f:
        doc = json.load(f)
    per_rank = doc["ranks"]

    def median(key):
        return statistics.median(key(r) for r in per_rank)

    return {
        "ranks": ranks,
        "endpoints": max(r["after_traffic"]["endpoints"] for r in per_rank),
        "lanes": max(r["after_traffic"]["lanes"] for r in per_rank),
        "growth_kib": median(lambda r: r["after_traffic"]["rss_kib"] -
                             r["before_setup"]["rss_kib"]),
        "setup_growth_kib": median(lambda r: r["after_setup"]["rss_kib"] -
                                   r["before_setup"]["rss_kib"]),
        "peer_us": median(lambda r: r["setup"]["per_peer_us"]),
        "peer_cpu_us": median(lambda r: r["setup"]["per_peer_cpu_us"]),
        "peer_cpu_mean_us": median(lambda r: r["setup"]["per_peer_cpu_mean_us"]),
        "first_us": median(lambda r: r["setup"]["first_peer_us"]),
        "first_cpu_us": median(lambda r: r["setup"]["first_peer_cpu_us"]),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--providers", default="tcp,shm")
    parser.add_argument("--ranks", default="2,4,8,16,32")
    parser.add_argument("--json-dir", default=tempfile.gettempdir(),
                        help="where each run's --json goes (default: the temporary directory)")
    args = parser.parse_args()
    counts = [int(n) for n in args.ranks.split(",")]
    print("| provider | N | endpoints/rank | lanes | RSS growth/rank (MiB) | KiB per peer beyond "
          "the first | setup/peer: wall, CPU (median), CPU (mean) (us) | first peer: wall, CPU "
          "(ms) |")
    print("|---|---|---|---|---|---|---|---|")
    projections = []
    for provider in args.providers.split(","):
        rows = []
        for n in counts:
            path = os.path.join(args.json_dir, f"ranks-{provider.replace(';', '_')}-{n}.json")
            rows.append(run(args, provider, n, path))
            r, base = rows[-1], rows[0]
            slope = ((r["growth_kib"] - base["growth_kib"]) / (n - base["ranks"])
                     if n > base["ranks"] else float("nan"))
            print(f"| {provider} | {n} | {r['endpoints']} | {r['lanes']} | "
                  f"{r['growth_kib'] / 1024:.1f} | {slope:.0f} | {r['peer_us']:.0f}, "
                  f"{r['peer_cpu_us']:.0f}, {r['peer_cpu_mean_us']:.0f} | "
                  f"{r['first_us'] / 1000:.0f}, {r['first_cpu_us'] / 1000:.0f} |", flush=True)
        # The slope over the widest span, projected from the smallest run.
        first, last = rows[0], rows[-1]
        slope = (last["growth_kib"] - first["growth_kib"]) / (last["ranks"] - first["ranks"])
        for n in (256, 1024):
            projections.append((provider, n, last["endpoints"],
                                (first["growth_kib"] + (n - first["ranks"]) * slope) / 1024, slope))
    print()
    print("| provider | N | endpoints/rank | RSS growth/rank (MiB), projected | from KiB/peer |")
    print("|---|---|---|---|---|")
    for provider, n, endpoints, mib, slope in projections:
        print(f"| {provider} | {n} | {endpoints} | {mib:.0f} | {slope:.0f} |")


if __name__ == "__main__":
    main()
