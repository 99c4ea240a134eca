#!/usr/bin/python3
"""Plots bandwidth against message size from fi_p2p_bw --json files, one curve per file.

  bench/scripts/plot_bw.py out.png run-efa.json run-tcp.json ...  (Debian's python3: matplotlib)

Needs matplotlib (Debian: scripts/deps.sh python3-matplotlib).
"""
import json
import os
import sys


def label(path, config):
    name = config.get("provider", "?")
    extra = f", {config['data_rails']} rail(s), {config['comms']} comm(s)"
    return f"{os.path.basename(path)}: {name}{extra}"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_bw: needs matplotlib (scripts/deps.sh python3-matplotlib)")
    out, inputs = sys.argv[1], sys.argv[2:]
    fig, ax = plt.subplots(figsize=(8, 5))
    for path in inputs:
        with open(path) as f:
            run = json.load(f)
        points = [(r["bytes"], r["gb_per_sec"]) for r in run["results"] if r["bytes"] > 0]
        if not points:
            continue
        sizes, rates = zip(*sorted(points))
        ax.plot(sizes, rates, marker="o", markersize=3, label=label(path, run["config"]))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bandwidth (GB/s)")
    ax.set_title("fi_p2p_bw (loom)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"plot_bw: wrote {out}")


if __name__ == "__main__":
    main()
