#!/usr/bin/env python3
"""A real NCCL (PyTorch's) loads loom's net plugin: one rank on GPU 0, an all-reduce checked.

Usage: nccl_one_rank.py PLUGIN_SO  (scripts/gpu_check.sh run calls it where torch imports)

One rank's NCCL moves nothing over the network, so this checks what a job's first minute
checks: that NCCL finds the plugin (NCCL_NET_PLUGIN), takes one of its ncclNet tables, calls
init with its logger (loom's "NET/loom" lines in NCCL's log) and asks its devices, and that
the communicator then works. Exit 0 only if all of that is in NCCL's own log.
"""
import glob
import os
import sys
import tempfile


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    log_dir = tempfile.mkdtemp(prefix="nccl-one-rank-")
    os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET",
                      NCCL_DEBUG_FILE=f"{log_dir}/nccl.%p.log", NCCL_NET_PLUGIN=sys.argv[1])
    import torch
    import torch.distributed as dist

    print(f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1,
                            device_id=torch.device("cuda:0"))
    values = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0") * 3 + 1
    expected = values.cpu()
    dist.all_reduce(values)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    log = "".join(open(path).read() for path in sorted(glob.glob(f"{log_dir}/nccl.*.log")))
    lines = [line for line in log.splitlines() if "loom" in line.lower() or "NET/Plugin" in line]
    print("\n".join(lines))
    if not torch.equal(values.cpu(), expected):
        print("FAILED: the one-rank all-reduce changed its values")
        return 1
    if not any("NET/loom" in line for line in lines):
        print("\n".join(log.splitlines()[-40:]))
        print("FAILED: NCCL's log has no NET/loom line: the plugin was not initialized by NCCL")
        return 1
    print("ok: NCCL initialized loom's plugin and the all-reduce kept every value")
    return 0


if __name__ == "__main__":
    sys.exit(main())
