#!/usr/bin/python3
"""All_reduce per call over TCP, shardplan's gloo plugin against PyTorch's
ProcessGroupGloo, interleaved, at the sizes one GPT step and one DP bucket
use; one table with ratios.

  benchmarks/gpt_peer/comm_side_by_side.py [--build build] [--reps 3] [--sizes B,B,...]
      [--dtype float32,float64] [--scale S]

Per repetition and size it runs both sides one after the other, the order
alternating (ours, peer; peer, ours; ...), 2 ranks each:
  ours, float32: build/bin/bench_comm_gloo --shm off --min-bytes B --max-bytes B
    (the plugin through the C ABI with raw gloo::allreduce interleaved in the
    same processes; both over TCP on 127.0.0.1);
  ours, float64: SHARDPLAN_GLOO_SHM=off build/bin/shardplan bench comm
    --backends gloo --refs none --collectives all_reduce --dtype float64
    --sizes B (in-place p50; bench_comm_gloo is float32 only);
  peer: /usr/bin/python3 benchmarks/gpt_peer/comm_torch.py --sizes B --dtype D.
The table gives each side's median over the repetitions of its per-call
time (µs), and peer/ours (> 1: ours is faster) and raw gloo/ours. Timing on
a shared machine is noisy: read the ratios, and rerun on a quiet one.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PYTHON = os.environ.get("SHARDPLAN_PEER_PYTHON", "/usr/bin/python3")
sys.path.insert(0, HERE)
from comm_torch import DEFAULT_SIZES, human, parse_dtypes, parse_sizes  # noqa: E402  (stdlib-only parts)

# bench_comm_gloo: size calls blocks raw_us plugin_us raw_GB/s plugin_GB/s plugin/raw
GLOO_ROW = re.compile(r"^\s*\d+(?:\.\d+)? (?:B|KiB|MiB)\s+\d+\s+\d+\s+(\S+)\s+(\S+)\s+\S+\s+\S+\s+\S+\s*$")
TORCH_ROW = re.compile(r"^\s*(float32|float64)\s+(\d+)\s+.*\s(\S+)\s+\S+\s*$")


def run(cmd, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit("comm_side_by_side.py: %s failed (exit %d):\n%s" % (" ".join(cmd), p.returncode,
                                                                           p.stdout[-2000:]))
    return p.stdout


def ours_float32(a, nbytes):
    """(plugin µs, raw gloo µs) per call."""
    out = run([os.path.join(a.build, "bin", "bench_comm_gloo"), "--shm", "off", "--min-bytes", str(nbytes),
               "--max-bytes", str(nbytes), "--scale", str(a.scale)])
    for line in out.splitlines():
        m = GLOO_ROW.match(line)
        if m:
            return float(m.group(2)), float(m.group(1))
    raise SystemExit("comm_side_by_side.py: no row in bench_comm_gloo's output:\n" + out)


def ours_bench_comm(a, nbytes, dtype):
    """(plugin µs, None): `shardplan bench comm`'s in-place p50."""
    env = dict(os.environ, SHARDPLAN_GLOO_SHM="off")
    iters = max(20, min(200, (64 << 20) * a.scale // nbytes))
    out = run([os.path.join(a.build, "bin", "shardplan"), "bench", "comm", "--backends", "gloo", "--refs", "none",
               "--collectives", "all_reduce", "--dtype", dtype, "--sizes", "%dB" % nbytes, "--iters", str(iters),
               "--warmup", "5"], env)
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 18 and f[0] == "gloo" and f[1] == str(nbytes):
            return float(f[16]), None
    raise SystemExit("comm_side_by_side.py: no gloo row in `shardplan bench comm`'s output:\n" + out)


def peer(a, nbytes, dtype):
    out = run([PYTHON, os.path.join(HERE, "comm_torch.py"), "--sizes", str(nbytes), "--dtype", dtype, "--scale",
               str(a.scale)] + (["--pin"] if a.pin else []))
    for line in out.splitlines():
        m = TORCH_ROW.match(line)
        if m and m.group(1) == dtype:
            return float(m.group(3))
    raise SystemExit("comm_side_by_side.py: no row in comm_torch.py's output:\n" + out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--sizes", type=parse_sizes, default=DEFAULT_SIZES)
    p.add_argument("--dtype", type=parse_dtypes, default=["float32"])
    p.add_argument("--scale", type=int, default=1)
    p.add_argument("--pin", action="store_true", help="pin the peer's ranks (bench_comm_gloo does not pin)")
    a = p.parse_args()
    rows = []
    for dtype in a.dtype:
        for nbytes in a.sizes:
            ours, raw, theirs = [], [], []
            for rep in range(a.reps):
                sides = ["ours", "peer"] if rep % 2 == 0 else ["peer", "ours"]
                for side in sides:
                    if side == "peer":
                        theirs.append(peer(a, nbytes, dtype))
                        continue
                    o, r = ours_float32(a, nbytes) if dtype == "float32" else ours_bench_comm(a, nbytes, dtype)
                    ours.append(o)
                    if r is not None:
                        raw.append(r)
                print("  %s %s: ours %s  peer %s" % (dtype, human(nbytes), ours[-1], theirs[-1]), file=sys.stderr,
                      flush=True)
            o, t = statistics.median(ours), statistics.median(theirs)
            r = statistics.median(raw) if raw else None
            rows.append((dtype, nbytes, o, r, t))
    print("all_reduce over TCP (127.0.0.1), 2 ranks, median per-call µs over %d interleaved reps" % a.reps)
    print("| dtype | bytes | size | shardplan gloo plugin µs | raw gloo µs | PyTorch ProcessGroupGloo µs | "
          "peer/ours | raw/ours | ours GB/s | peer GB/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dtype, nbytes, o, r, t in rows:
        print("| %s | %d | %s | %.1f | %s | %.1f | %.2f | %s | %.3f | %.3f |" % (
            dtype, nbytes, human(nbytes), o, "%.1f" % r if r else "-", t, t / o, "%.2f" % (r / o) if r else "-",
            nbytes / o / 1e3, nbytes / t / 1e3))


if __name__ == "__main__":
    main()
