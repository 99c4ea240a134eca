#!/usr/bin/env python3
"""Where a thread's time goes between the steps loom records in a -Dstep_trace=true build
(lib/util/step_trace.hpp): for each pair of consecutive steps, how often it occurred, the
median and p90 of the time between them, and the time it took per round (per occurrence of
--per, isend by default) and its share of the traced time.

  meson setup build-steps --buildtype=release -Dstep_trace=true -Dtests=disabled
  ninja -C build-steps bench/p2p_bw/fi_p2p_bw
  TMPDIR=/tmp/steps FI_PROVIDER=shm LOOM_PROVIDER=shm build-steps/bench/p2p_bw/fi_p2p_bw \\
      --loopback -S 8 --no-bw --lat-iters 20000 -w 1000 --pin-core 0,1
  bench/scripts/step_trace.py /tmp/steps/loom-steps.*

Each file is one thread's (loom-steps.<pid>.<tid>); threads with fewer than --min-steps steps
(a context's background progress) are left out. The first --skip of each thread's steps
(warmup, setup) are left out too. A step costs ~25 ns of clock reading, which the times hold.
"""
import argparse
import glob
import os
import statistics
import struct

# lib/util/step_trace.hpp's Step, by number.
STEPS = [None, "isend", "isend done", "irecv", "irecv done", "test", "test finished",
         "CQ entries", "send post", "send posted", "write post", "write posted", "recv post",
         "recv posted", "control in"]
STEP_NUMBER = {name: number for number, name in enumerate(STEPS) if name}


def read_steps(path):
    """The (ns, step) pairs of one file, up to its first empty entry."""
    with open(path, "rb") as f:
        data = f.read()
    out = []
    for (entry,) in struct.iter_unpack("<Q", data):
        if entry == 0:
            break
        out.append((entry >> 8, entry & 0xFF))
    return out


def name(step):
    return STEPS[step] if 0 < step < len(STEPS) else f"step {step}"


def report(path, steps, args):
    steps = steps[int(len(steps) * args.skip):]
    per = args.per
    rounds = sum(1 for _, s in steps if s == STEP_NUMBER[per]) or 1
    gaps = {}
    for (t0, a), (t1, b) in zip(steps, steps[1:]):
        gaps.setdefault((a, b), []).append(t1 - t0)
    traced = steps[-1][0] - steps[0][0] if len(steps) > 1 else 0
    print(f"# {os.path.basename(path)}: {len(steps)} steps, {rounds} x '{per}', "
          f"{traced / rounds:.0f} ns per '{per}'")
    print(f"{'from':<14} {'to':<14} {'count':>8} {'p50 ns':>8} {'p90 ns':>8} "
          f"{'ns/' + per:>10} {'share':>6}")
    rows = sorted(gaps.items(), key=lambda item: -sum(item[1]))
    shown = 0.0
    for (a, b), times in rows:
        share = sum(times) / traced if traced else 0
        if share < args.min_share:
            continue
        shown += share
        times.sort()
        print(f"{name(a):<14} {name(b):<14} {len(times):>8} {times[len(times) // 2]:>8} "
              f"{times[len(times) * 9 // 10]:>8} {sum(times) / rounds:>10.0f} {share:>6.1%}")
    print(f"# rows shown hold {shown:.1%} of the traced time")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*")
    parser.add_argument("--skip", type=float, default=0.25,
                        help="fraction of each thread's first steps left out (default 0.25)")
    parser.add_argument("--per", default="isend", choices=sorted(STEP_NUMBER),
                        help="the step that counts rounds (default isend)")
    parser.add_argument("--min-steps", type=int, default=1000)
    parser.add_argument("--min-share", type=float, default=0.005,
                        help="leave out pairs of steps under this share of the time (0.005)")
    args = parser.parse_args()
    files = args.files or sorted(glob.glob(os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                        "loom-steps.*")))
    for path in files:
        steps = read_steps(path)
        if len(steps) >= args.min_steps:
            report(path, steps, args)
            print()


if __name__ == "__main__":
    main()
