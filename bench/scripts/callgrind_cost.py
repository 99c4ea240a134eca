#!/usr/bin/env python3
"""Instructions per message from two callgrind profiles of fi_p2p_cost (scripts/cost.sh).

  callgrind_cost.py SHORT.out LONG.out ROUNDS [--idle] [--cache] [--label NAME] [--top N]
      [--against SHORT.out LONG.out --against-label NAME]

SHORT and LONG ran the same fi_p2p_cost with ROUNDS more timed rounds in LONG: their
difference is what those rounds cost, setup and teardown cancelled. A round moves two messages
(ping and reply), both ends of each in this one process, so the figures are per message: its
send, its receive and the tests that finish them. --idle: ROUNDS more tests of a receive
nothing fills (fi_p2p_cost --idle), and the figures are per such test. Printed by shared object (loom, libfabric,
libc, the rest), then loom's functions by their own instructions (inlined code counts where it
was inlined). --against adds another pair (an earlier libloom, say) as a second column.
--cache: the profiles were taken with --cache-sim=yes; the L1 misses per message follow
(instruction reads, data reads, data writes), by shared object. Both ends share one simulated
cache here, so the counts are a footprint's, not what either process of a ping-pong meets.
"""
import argparse
import re
import subprocess
import sys

COST = r'([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?'
MISSES = ['I1mr', 'D1mr', 'D1mw']


def profile(path, event):
    """{(object, function): self count of `event`} from callgrind_annotate."""
    out = subprocess.run(['callgrind_annotate', '--threshold=100', f'--show={event}',
                          f'--sort={event}', path], check=True, capture_output=True,
                         text=True).stdout
    costs = {}
    for line in out.splitlines():
        m = re.match(r'^\s*' + COST + r'(\S.*)$', line)
        if not m or '=>' in line or 'PROGRAM TOTALS' in line or 'events annotated' in line:
            continue
        name = m.group(2)
        obj = re.search(r'\[([^\]]*)\]\s*$', name)
        obj = obj.group(1).rsplit('/', 1)[-1] if obj else '?'
        function = re.sub(r'\s*\[[^\]]*\]\s*$', '', name)
        function = function.split(':', 1)[1] if ':' in function else function
        key = (obj, function)
        costs[key] = costs.get(key, 0) + int(m.group(1).replace(',', ''))
    return costs


def per_unit(short, long_, units, event='Ir'):
    a, b = profile(short, event), profile(long_, event)
    return {k: (b.get(k, 0) - a.get(k, 0)) / units for k in set(a) | set(b)}


def group(obj):
    if obj.startswith('libloom'):
        return 'loom'
    if obj.startswith('libfabric'):
        return 'libfabric'
    if obj.startswith('libc.'):
        return 'libc'
    return 'other (the bench, ld.so)'


def by_group(costs):
    groups = {}
    for (obj, _), v in costs.items():
        groups[group(obj)] = groups.get(group(obj), 0) + v
    return groups


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('short')
    ap.add_argument('long')
    ap.add_argument('rounds', type=int)
    ap.add_argument('--idle', action='store_true')
    ap.add_argument('--cache', action='store_true')
    ap.add_argument('--label', default='this build')
    ap.add_argument('--top', type=int, default=20)
    ap.add_argument('--against', nargs=2, metavar=('SHORT', 'LONG'))
    ap.add_argument('--against-label', default='before')
    args = ap.parse_args()
    units = args.rounds if args.idle else 2 * args.rounds
    unit = 'idle test' if args.idle else 'message'
    columns = [(args.label, per_unit(args.short, args.long, units))]
    if args.against:
        columns.append((args.against_label, per_unit(args.against[0], args.against[1], units)))
    head = ''.join(f'{label:>14}' for label, _ in columns)
    what = (f'{args.rounds} tests that find nothing' if args.idle
            else f'{args.rounds} rounds of two messages')
    print(f'instructions per {unit} (callgrind, {what})')
    print(f'{"":28}{head}')
    groups = [by_group(costs) for _, costs in columns]
    names = ['loom', 'libfabric', 'libc', 'other (the bench, ld.so)']
    for name in names:
        print(f'{name:28}' + ''.join(f'{g.get(name, 0):14.0f}' for g in groups))
    print(f'{"total":28}' + ''.join(f'{sum(g.values()):14.0f}' for g in groups))
    if args.cache:
        pairs = [(args.short, args.long)] + ([tuple(args.against)] if args.against else [])
        for event in MISSES:
            counts = [by_group(per_unit(a, b, units, event)) for a, b in pairs]
            print(f'\nL1 misses per {unit}, {event} (simulated)')
            for name in names:
                print(f'{name:28}' + ''.join(f'{c.get(name, 0):14.2f}' for c in counts))
            print(f'{"total":28}' + ''.join(f'{sum(c.values()):14.2f}' for c in counts))
    print(f'\nloom functions, own instructions per {unit} ({columns[0][0]} first)')
    first = columns[0][1]
    loom = sorted(((v, k) for k, v in first.items() if k[0].startswith('libloom')), reverse=True)
    # By function name alone: the other build's library may be a copy named libloom.so.0.
    by_function = [{k[1]: v for k, v in c.items() if k[0].startswith('libloom')}
                   for _, c in columns[1:]]
    for v, (_, function) in loom[:args.top]:
        others = ''.join(f'{c.get(function, 0):8.0f}' for c in by_function)
        short_name = re.sub(r'\(.*', '', function)
        print(f'{v:8.0f}{others}  {short_name}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
