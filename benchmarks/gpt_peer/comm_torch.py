#!/usr/bin/python3
"""PyTorch's ProcessGroupGloo all_reduce per call, at the sizes one GPT step
and one data-parallel bucket use: the Python peer's side of
benchmarks/comm_gloo's table (bench_comm_gloo --shm off: shardplan's gloo
plugin over TCP against raw gloo).

  /usr/bin/python3 benchmarks/gpt_peer/comm_torch.py [--sizes B,B,...] [--dtype float32,float64]
      [--scale S] [--pin] [--threads N] [--ranks N]
  shardplan launch -n 2 --master-port P -- /usr/bin/python3 benchmarks/gpt_peer/comm_torch.py ...

Without a launcher's RANK/WORLD_SIZE it starts --ranks processes itself
(torch.multiprocessing, MASTER_ADDR 127.0.0.1 and a free port). Gloo talks
TCP over loopback (GLOO_SOCKET_IFNAME=lo unless set), as bench_comm_gloo
does. Per size it times blocks of calls like tools/bench/comm/interleaved.cpp
(calls per block: 4 MiB / size, 1 to 20; blocks: 128 MiB x scale / the
block's bytes, 8 to 100 x scale; a barrier before each block; one untimed
block first) and rank 0 prints the median time per call over the blocks and
the payload bytes / that time. Default sizes: 4 KiB (the loss's [N]
reductions at batch 16), 512 KiB (one [N, E] activation all-reduce of the
GPT at batch 16), 1 MiB (DDP's first bucket cap), 1.88 MB and 3.76 MB (the
GPT's gradients, one bucket, float32 and float64). Sizes are bytes, with
optional suffix KiB, MiB, kB, MB. Every rank checks the sum once per size.
"""

import argparse
import os
import socket
import statistics
import sys
import time

try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("comm_torch.py: python3-torch is not installed (apt-get install python3-torch)", file=sys.stderr)
    sys.exit(77)

DEFAULT_SIZES = [4096, 512 << 10, 1 << 20, 1882112, 3764224]
DTYPES = {"float32": torch.float32, "float64": torch.float64}
SUFFIX = {"KiB": 1 << 10, "MiB": 1 << 20, "kB": 1000, "MB": 1000 ** 2, "B": 1}


def parse_size(text):
    for suffix, mult in SUFFIX.items():
        if text.endswith(suffix):
            number = text[: -len(suffix)]
            break
    else:
        number, mult = text, 1
    try:
        value = float(number) * mult
    except ValueError:
        raise argparse.ArgumentTypeError("'%s' is not a size (bytes, or a number with KiB, MiB, kB or MB)" % text)
    if value < 8 or value != int(value):
        raise argparse.ArgumentTypeError("'%s' is not a whole number of bytes >= 8" % text)
    return int(value)


def parse_sizes(text):
    return [parse_size(s.strip()) for s in text.split(",") if s.strip()]


def parse_dtypes(text):
    out = [s.strip() for s in text.split(",") if s.strip()]
    for d in out:
        if d not in DTYPES:
            raise argparse.ArgumentTypeError("unknown dtype '%s' (float32, float64)" % d)
    return out


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=parse_sizes, default=DEFAULT_SIZES, help="payload bytes per call, comma separated")
    p.add_argument("--dtype", type=parse_dtypes, default=["float32"], help="float32, float64 or both (comma separated)")
    p.add_argument("--scale", type=int, default=1, help="multiplies the blocks per size (as bench_comm_gloo --scale)")
    p.add_argument("--ranks", type=int, default=2, help="processes to start when no launcher started this one")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank")
    p.add_argument("--pin", action="store_true", help="pin rank r to core r mod cores (as rank_wrapper.py --pin)")
    a = p.parse_args(argv)
    if a.scale < 1 or a.ranks < 1 or a.threads < 1:
        p.error("--scale, --ranks and --threads must be >= 1")
    return a


def calls_per_block(nbytes):
    return max(1, min(20, (4 << 20) // nbytes))


def blocks_for(nbytes, scale):
    per_block = nbytes * calls_per_block(nbytes)
    return max(8, min(100 * scale, (128 << 20) * scale // per_block))


def human(nbytes):
    if nbytes >= 1 << 20:
        return "%.2f MiB" % (nbytes / (1 << 20)) if nbytes % (1 << 20) else "%d MiB" % (nbytes >> 20)
    if nbytes >= 1024:
        return "%.2f KiB" % (nbytes / 1024) if nbytes % 1024 else "%d KiB" % (nbytes >> 10)
    return "%d B" % nbytes


def time_block(t, calls):
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(t)
    return (time.perf_counter() - t0) / calls


def check_sum(dtype, rank, world):
    # 1027 elements, as interleaved.cpp: odd, no multiple of a ring's split.
    v = torch.full((1027,), float(rank + 1), dtype=dtype)
    dist.all_reduce(v)
    want = world * (world + 1) / 2
    if not bool((v == want).all()):
        raise SystemExit("comm_torch.py: rank %d: all_reduce gave %s, expected %s" % (rank, v[0].item(), want))


def measure(a, rank, world):
    """Rank 0's rows: (dtype, bytes, calls, blocks, median seconds per call)."""
    rows = []
    for dname in a.dtype:
        dtype = DTYPES[dname]
        check_sum(dtype, rank, world)
        esize = torch.tensor([], dtype=dtype).element_size()
        for nbytes in a.sizes:
            t = torch.zeros(max(1, nbytes // esize), dtype=dtype)
            calls, blocks = calls_per_block(nbytes), blocks_for(nbytes, a.scale)
            time_block(t, calls)  # warm-up: first touch, socket buffers
            times = [time_block(t, calls) for _ in range(blocks)]
            rows.append((dname, t.numel() * esize, calls, blocks, statistics.median(times)))
    return rows


def print_table(rows, world):
    print("all_reduce sum in place, %d ranks (processes), PyTorch %s ProcessGroupGloo, TCP over loopback"
          % (world, torch.__version__))
    print("%8s %9s %9s %5s %6s %14s %10s" % ("dtype", "bytes", "size", "calls", "blocks", "torch (us)", "torch GB/s"))
    for dname, nbytes, calls, blocks, sec in rows:
        print("%8s %9d %9s %5d %6d %14.1f %10.3f" % (dname, nbytes, human(nbytes), calls, blocks, sec * 1e6,
                                                    nbytes / sec / 1e9))
    sys.stdout.flush()


def rank_main(rank, world, a):
    if a.pin:
        cores = sorted(os.sched_getaffinity(0))
        local = int(os.environ.get("LOCAL_RANK", rank))
        os.sched_setaffinity(0, {cores[local % len(cores)]})
    torch.set_num_threads(a.threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    rows = measure(a, rank, world)
    if rank == 0:
        print_table(rows, world)
    dist.barrier()
    dist.destroy_process_group()


def spawned(rank, world, a, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    rank_main(rank, world, a)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    a = parse()
    if "RANK" in os.environ:
        rank_main(int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "1")), a)
        return
    import torch.multiprocessing as mp
    mp.spawn(spawned, args=(a.ranks, a, free_port()), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
