#!/usr/bin/env python3
"""Runs loom's fi_p2p_bw and fabtests' fi_rdm_tagged_bw and fi_rma_bw -o writedata on the same
provider, interleaved, server pinned to one core and client to another, and prints the
loom/fabtests ratio per size: of the medians of the repetitions, of the best runs, and the
median of each repetition's own ratio ("paired": the three runs of a repetition follow each
other, so a slow period of the machine weighs on all three). Every
tool runs the same iterations, enough to move about 2 GiB (100000 messages at 4 KiB): on a
virtual machine whole runs slow down by half now and then, and a short run is all one or the
other.

  FABTESTS_BIN=/tmp/fabtests/bin bench/scripts/compare_fabtests.py [--providers tcp,shm] [--reps 3]
  FABTESTS_BIN=... bench/scripts/compare_fabtests.py --latency [--lat-sizes 8,256,4k,8k,16k] [--show-runs]

--latency prints one-way latency instead, against fi_rdm_tagged_pingpong: both tools run the
same untimed warmup rounds (-w) and timed rounds (-I / fi_p2p_bw --lat-iters), and both report
the timed rounds' total time / rounds / 2 (fabtests' usec/xfer; fi_p2p_bw's lat(us)). loom's
p50 and p99 of single rounds follow (fabtests prints none). "fast" is the ratio of the medians
of each tool's fast-mode runs (fast_runs): where a VM switches between two speeds from run to
run, the one ratio that compares like with like; the runs are printed whenever a tool's spread
over two modes. On TCP a line follows each size with the TCP segments the kernel sent per
message meanwhile (OutSegs): above 1, pure acknowledgements, which cost the receiving core
microseconds on loopback.

Both tables start with the machine: CPU, cores, kernel, libfabric, hypervisor, and what a core
that only spins reading the clock loses to interruptions (the spin probe, on each of the two
cores the tools are pinned to). On a virtual machine that is the floor under every p99: a round
trip that meets one takes microseconds longer, in either tool. Then the kernel's transparent
huge page mode: fabtests' large malloc'd buffers get huge pages only in mode `always`, where
fi_p2p_bw's advised ones (its default) get them in `madvise` too, and with them shm moves 1 MiB
twice as fast (process_vm_readv walks fewer page tables). So where the mode is not `always`
fi_p2p_bw runs with --host-pages malloc, allocating as fabtests does; --host-pages huge keeps
its default for every run (to compare with a --before build older than the option).

--before PATH adds another fi_p2p_bw (a build of an earlier commit, say) to the same
interleaved runs, with its figures and loom/before (paired) beside them: a change's effect and
fabtests' ratio from one run of the machine. --before-env VAR=VALUE (repeatable) sets a variable
for the before runs only: the same build with LOOM_PROGRESS_THREAD=0, say.

fabtests are not part of loom: build them from libfabric's source (matching the installed
libfabric) into a directory of your own and point FABTESTS_BIN at its bin/.
"""
import argparse
import functools
import json
import os
import platform
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


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def virtualization():
    """What systemd-detect-virt says (a container shows as such), and whether the CPU reports a
    hypervisor underneath."""
    try:
        detected = subprocess.run(["systemd-detect-virt"], capture_output=True,
                                  text=True).stdout.strip() or "none"
    except OSError:
        detected = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            flag = " hypervisor" in f.read()
    except OSError:
        flag = False
    return f"{detected}{', under a hypervisor' if flag else ''}"


def libfabric_version():
    try:
        out = subprocess.run(["fi_info", "--version"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("libfabric:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def spin_probe(core, seconds=0.5, gap_ns=2000):
    """Spins on `core` reading the clock: interruptions longer than gap_ns per second, and the
    share of the time they took."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        clock = time.perf_counter_ns
        start = previous = clock()
        end = start + int(seconds * 1e9)
        gaps = lost = 0
        while previous < end:
            now = clock()
            if now - previous > gap_ns:
                gaps += 1
                lost += now - previous
            previous = now
    finally:
        os.sched_setaffinity(0, before)
    elapsed = previous - start
    return gaps / (elapsed / 1e9), 100.0 * lost / elapsed


def thp_mode():
    """The kernel's transparent huge page mode (always, madvise, never), or None."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


# --host-pages: auto (page_args), or huge / malloc for every fi_p2p_bw run.
HOST_PAGES = {"choice": "auto"}


@functools.cache
def page_args(binary):
    """fi_p2p_bw's buffers get pages as fabtests' malloc'd ones do: advised huge pages (its
    default) match them only where the kernel backs every large mapping with huge pages
    (`always`); elsewhere fi_p2p_bw allocates as fabtests does. An older build without the
    option keeps its default (print_machine says so)."""
    choice = HOST_PAGES["choice"]
    if choice == "huge" or (choice == "auto" and thp_mode() in (None, "always")):
        return []
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    return ["--host-pages", "malloc"] if "--host-pages" in help_text else []


def print_machine(binaries):
    print(f"# machine: {cpu_model()}, {os.cpu_count()} cores, kernel {platform.release()}, "
          f"libfabric {libfabric_version()}, virtualization: {virtualization()}")
    mode = thp_mode()
    fabtests_pages = "huge pages" if mode == "always" else "small pages"
    advised = [b for b in binaries if not page_args(b)]
    if len(advised) == len(binaries):
        loom_pages = "fi_p2p_bw's buffers are advised huge pages"
    else:
        loom_pages = "fi_p2p_bw allocates as fabtests does (--host-pages malloc)" + (
            f", but not {', '.join(advised)}, which lacks the option: its buffers are advised "
            "huge pages" if advised else "")
    print(f"# transparent huge pages: {mode} (fabtests' buffers get {fabtests_pages}); "
          + loom_pages)
    probes = []
    for core in (0, 1):
        try:
            rate, lost = spin_probe(core)
        except OSError:
            continue
        probes.append(f"core {core}: {rate:.0f}/s over 2 us, {lost:.1f}% of the time")
    if probes:
        print("# spin probe (a core spinning on the clock, interrupted): " + "; ".join(probes))


def fabtests_args(provider):
    # tcp must bind 127.0.0.1 explicitly: with -d lo alone the server listens on eth0's address.
    if provider == "shm":
        return ["-p", "shm", "-e", "rdm", "-s", "127.0.0.1"]
    return ["-p", provider, "-e", "rdm", "-d", "lo", "-s", "127.0.0.1"]


def run_fabtests_pair(binary, args, port):
    """Runs a fabtests server on core 0 and its client on core 1; returns the client's last line."""
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
    return out.strip().splitlines()[-1].split()


def run_fabtests(binary, extra, provider, size, port):
    args = fabtests_args(provider) + extra + ["-S", str(to_bytes(size)), "-I",
                                             str(iterations(size))]
    fields = run_fabtests_pair(binary, args, port)
    return float(fields[4]), float(fields[6])  # MB/sec, Mxfers/sec


def run_pingpong(binary, provider, size, port, rounds, warmup):
    args = fabtests_args(provider) + ["-S", str(to_bytes(size)), "-I", str(rounds), "-w",
                                      str(warmup)]
    return float(run_fabtests_pair(binary, args, port)[5])  # usec/xfer: one-way


def loom_env(provider, extra=()):
    env = dict(os.environ, LOOM_PROVIDER=provider, FI_PROVIDER=provider)
    if provider != "shm":
        env["LOOM_NICS"] = "lo"
    env.update(setting.split("=", 1) for setting in extra)
    return env


def run_loom_latency(binary, provider, size, json_path, rounds, warmup, extra_env=()):
    subprocess.run([binary, "--loopback", "--pin-core", "0,1", "-S", f"l:{size}", "--no-bw",
                    "--lat-iters", str(rounds), "-w", str(warmup), "--json", json_path] +
                   page_args(binary),
                   env=loom_env(provider, extra_env), check=True, capture_output=True,
                   timeout=300)
    with open(json_path) as f:
        row = json.load(f)["results"][0]
    return row["latency_avg_us"], row["latency_p50_us"], row["latency_p99_us"]


def tcp_out_segments():
    """The kernel's count of TCP segments sent (all sockets), or None where it cannot be read."""
    try:
        with open("/proc/net/snmp") as f:
            rows = [line.split() for line in f if line.startswith("Tcp:")]
        return int(rows[1][rows[0].index("OutSegs")])
    except (OSError, IndexError, ValueError):
        return None


def counting_segments(run, messages, into):
    """Runs `run` and appends the TCP segments sent per message meanwhile to `into`."""
    before = tcp_out_segments()
    run()
    after = tcp_out_segments()
    if before is not None and after is not None:
        into.append((after - before) / messages)


def fast_runs(runs):
    """The runs of the machine's fast mode. Some virtual machines switch between two speeds
    (2-3x apart, for both tools alike: shm 8 B one-way 0.3 or 0.9 us) from one run to the next;
    a median of a few runs then picks a mode per tool by chance. Where a tool's runs spread
    over more than 1.8x, those below the geometric middle of its range; else all of them."""
    low, high = min(runs), max(runs)
    if high <= 1.8 * low:
        return runs
    return [r for r in runs if r < (low * high) ** 0.5]


def latency_tables(args, fabtests, tmp):
    pingpong = os.path.join(fabtests, "fi_rdm_tagged_pingpong")
    port = PORT + 5000
    for provider in args.providers.split(","):
        print(f"\n## {provider} one-way latency (loopback, server on core 0, client on core 1; "
              f"{args.lat_iters} timed rounds after {args.lat_warmup}; median of {args.reps}, "
              f"interleaved)")
        print(f"{'size':>6} {'loom us':>8} {'pingpong us':>12} {'loom/pingpong':>14} "
              f"{'paired':>7} {'fast':>6} {'loom p50':>9} {'loom p99':>9}" +
              (f" {'before us':>10} {'loom/before':>12} {'paired':>7}" if args.before else ""))
        for size in args.lat_sizes.split(","):
            loom, ft, before = [], [], []
            loom_segs, ft_segs = [], []
            messages = 2 * (args.lat_iters + args.lat_warmup)
            for rep in range(args.reps):
                runs = [lambda p: counting_segments(
                            lambda: ft.append(run_pingpong(pingpong, provider, size, p,
                                                           args.lat_iters, args.lat_warmup)),
                            messages, ft_segs),
                        lambda p: counting_segments(
                            lambda: loom.append(run_loom_latency(args.loom, provider, size,
                                                                 f"{tmp}/l.json", args.lat_iters,
                                                                 args.lat_warmup)),
                            messages, loom_segs)]
                if args.before:
                    runs.append(lambda p: before.append(run_loom_latency(
                        args.before, provider, size, f"{tmp}/b.json", args.lat_iters,
                        args.lat_warmup, args.before_env)))
                for k in range(len(runs)):
                    port += 1
                    runs[(rep + k) % len(runs)](port)
            l, f = statistics.median(r[0] for r in loom), statistics.median(ft)
            p50, p99 = (statistics.median(r[i] for r in loom) for i in (1, 2))
            paired = statistics.median(a[0] / b for a, b in zip(loom, ft))
            fast_loom, fast_ft = fast_runs([r[0] for r in loom]), fast_runs(ft)
            fast = statistics.median(fast_loom) / statistics.median(fast_ft)
            line = (f"{size:>6} {l:8.2f} {f:12.2f} {l / f:14.2f} {paired:7.2f} {fast:6.2f} "
                    f"{p50:9.2f} {p99:9.2f}")
            if args.before:
                b = statistics.median(r[0] for r in before)
                line += (f" {b:10.2f} {l / b:12.2f} "
                         f"{statistics.median(x[0] / y[0] for x, y in zip(loom, before)):7.2f}")
            print(line, flush=True)
            if provider != "shm" and loom_segs and ft_segs:
                print(f"         TCP segments sent per message (loopback, every socket): loom "
                      f"{statistics.median(loom_segs):.2f}, pingpong "
                      f"{statistics.median(ft_segs):.2f}", flush=True)
            if args.show_runs or len(fast_loom) < len(loom) or len(fast_ft) < len(ft):
                print("         runs (loom/pingpong us): " +
                      " ".join(f"{a[0]:.2f}/{b:.2f}" for a, b in zip(loom, ft)), flush=True)


def run_loom(binary, provider, size, json_path, extra_env=()):
    subprocess.run([binary, "--loopback", "--pin-core", "0,1", "-S", size, "-I",
                    str(iterations(size)), "--no-pingpong", "--json", json_path] +
                   page_args(binary),
                   env=loom_env(provider, extra_env), check=True, capture_output=True,
                   timeout=300)
    with open(json_path) as f:
        result = json.load(f)["results"][0]
    return result["mb_per_sec"], result["mxfers_per_sec"]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--providers", default="tcp,shm")
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--loom", default="build-release/bench/p2p_bw/fi_p2p_bw")
    parser.add_argument("--before", help="another fi_p2p_bw to compare with (an earlier build)")
    parser.add_argument("--before-env", action="append", default=[], metavar="VAR=VALUE",
                        help="a variable set for the --before runs only (repeatable)")
    parser.add_argument("--latency", action="store_true",
                        help="one-way latency against fi_rdm_tagged_pingpong instead")
    parser.add_argument("--lat-sizes", default="8,256,4k,8k,16k")
    parser.add_argument("--lat-iters", type=int, default=10000)
    parser.add_argument("--lat-warmup", type=int, default=100)
    parser.add_argument("--show-runs", action="store_true",
                        help="--latency: also print every repetition's figures (this VM's slow "
                             "periods show as runs far from the others)")
    parser.add_argument("--host-pages", choices=["auto", "huge", "malloc"], default="auto",
                        help="fi_p2p_bw's buffers: auto (malloc'd as fabtests' where the "
                             "kernel's THP mode is not always, else advised huge pages), or "
                             "one for every run (huge: to compare with a --before build "
                             "that lacks the option)")
    args = parser.parse_args()
    HOST_PAGES["choice"] = args.host_pages
    fabtests = os.environ.get("FABTESTS_BIN")
    if not fabtests:
        sys.exit("compare_fabtests: set FABTESTS_BIN to fabtests' bin directory")
    print_machine([args.loom] + ([args.before] if args.before else []))
    if args.latency:
        with tempfile.TemporaryDirectory() as tmp:
            latency_tables(args, fabtests, tmp)
        return
    tagged = os.path.join(fabtests, "fi_rdm_tagged_bw")
    rma = os.path.join(fabtests, "fi_rma_bw")
    port = PORT
    with tempfile.TemporaryDirectory() as tmp:
        for provider in args.providers.split(","):
            print(f"\n## {provider} (loopback, 1 rail, window 64, server on core 0, client on "
                  f"core 1; median of {args.reps}, interleaved)")
            print(f"{'size':>6} {'loom MB/s':>10} {'tagged MB/s':>12} {'writedata MB/s':>15} "
                  f"{'loom/tagged':>12} {'loom/writedata':>15} {'loom/best':>10} "
                  f"{'best runs':>10} {'paired':>7} {'loom Mxfer/s':>13} {'tagged Mxfer/s':>15}" +
                  (f" {'before MB/s':>12} {'loom/before':>12} {'paired':>7}"
                   if args.before else ""))
            for size in args.sizes.split(","):
                loom, tag, wd, before = [], [], [], []
                runs = [lambda p: tag.append(run_fabtests(tagged, [], provider, size, p)),
                        lambda p: wd.append(run_fabtests(rma, ["-o", "writedata"], provider,
                                                         size, p)),
                        lambda p: loom.append(run_loom(args.loom, provider, size,
                                                       f"{tmp}/r.json"))]
                if args.before:
                    runs.append(lambda p: before.append(run_loom(args.before, provider, size,
                                                                 f"{tmp}/b.json",
                                                                 args.before_env)))
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
                line = (f"{size:>6} {l:10.1f} {t:12.1f} {w:15.1f} {l / t:12.2f} {l / w:15.2f} "
                        f"{l / max(t, w):10.2f} {best:10.2f} {paired:7.2f} {med(loom, 1):13.3f} "
                        f"{med(tag, 1):15.3f}")
                if args.before:
                    b = med(before, 0)
                    line += (f" {b:12.1f} {l / b:12.2f} "
                             f"{statistics.median(x[0] / y[0] for x, y in zip(loom, before)):7.2f}")
                print(line, flush=True)


if __name__ == "__main__":
    main()
