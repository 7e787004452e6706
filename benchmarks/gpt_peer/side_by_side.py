#!/usr/bin/python3
"""shardplan's GPT example over gloo against the same model in PyTorch with
ProcessGroupGloo, side by side.

Both run as N processes started by `shardplan launch`, with the same threads
(--threads for torch and OpenBLAS alike), the same placement (each rank pinned
to its own core, unless --no-pin) and the same model, data and steps. The runs
alternate (ours, peer; peer, ours; ...) so that load from other jobs hits both
alike. Per repetition it prints each side's tokens/s (over the logged steps
after the first, which includes warm-up), the ratio ours/peer, and checks that
the two sides' losses agree (same initial weights and data: they should, to
float32 rounding) and that they communicate the same bytes in the same calls.

  benchmarks/gpt_peer/side_by_side.py --build build --reps 3

--ddp compares data parallelism instead: train_gpt under plans/data_parallel.yaml
against torch's DistributedDataParallel (gpt_tp_torch.py --ddp); --dtype float64
runs both sides in float64. --with-tcp adds ours with SHARDPLAN_GLOO_SHM=off (gloo's
TCP path, what ranks on different hosts use), --baseline-build DIR another build
of ours (e.g. before a change) in the same interleaved run, --baseline-env
NAME=VALUE that baseline's environment (alone: this build with the variable set).

--thread-times also records per-thread user and system CPU seconds of every
rank (benchmarks/gpt_peer/rank_wrapper.py) and prints them per side.
Without python3-torch the peer's rows are skipped with a message (exit
status --skip-status, 0 unless given; ctest's smoke passes 77).
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
# Debian's, where python3-torch lives; the variable lets a test see the skip.
PYTHON = os.environ.get("SHARDPLAN_PEER_PYTHON", "/usr/bin/python3")
STEP = re.compile(r"^\[rank 0\] step\s+(\d+)\s+loss (\S+)\s+mean \S+\s+tokens/s (\d+)")
GRAD = re.compile(r"^\[rank 0\] plan: .*DistributedDataParallel over \d+ ranks \((\d+) gradient bytes\)")
COMM = re.compile(r"^\[rank 0\] communicated in step 1 \(forward \+ backward\) on rank 0: (\d+) bytes in (\d+) calls")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory (bin/shardplan, examples/train_gpt)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--config", default="", help="model config KEY=VALUE,... for both sides")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op and OpenBLAS threads per rank (both sides)")
    p.add_argument("--no-pin", action="store_true", help="do not pin each rank to a core")
    p.add_argument("--thread-times", action="store_true", help="record per-thread CPU time of every rank")
    p.add_argument("--master-port", type=int, default=0, help="the peer's TCPStore port (0: a free one)")
    p.add_argument("--skip-status", type=int, default=0,
                   help="exit status when python3-torch is missing (ctest uses 77 to mark a skip)")
    p.add_argument("--only", choices=["ours", "peer"], help="run one side only")
    p.add_argument("--ddp", action="store_true",
                   help="data parallel instead of tensor parallel: ours under plans/data_parallel.yaml against "
                        "torch's DistributedDataParallel (gpt_tp_torch.py --ddp)")
    p.add_argument("--max-loss-diff", type=float, default=1e-2,
                   help="largest difference of the two sides' printed losses that passes")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32", help="both sides' --dtype")
    p.add_argument("--baseline-build", default="",
                   help="also run ours from this other build directory (e.g. before a change), shm=off with --with-tcp")
    p.add_argument("--baseline-env", action="append", default=[], metavar="NAME=VALUE",
                   help="the baseline's environment on top of the others' (repeatable); without --baseline-build "
                        "the baseline is --build itself, e.g. SHARDPLAN_GLOO_SPIN_US=0 for ours before a change "
                        "that the variable undoes")
    p.add_argument("--comm-trace", metavar="DIR",
                   help="each run writes its per-call trace to SHARDPLAN_COMM_TRACE=DIR/<side>.<rep> "
                        "(benchmarks/gpt_peer/timeline_summary.py reads them)")
    p.add_argument("--with-tcp", action="store_true",
                   help="also run ours with SHARDPLAN_GLOO_SHM=off (gloo's TCP path for same-host ranks too)")
    return p.parse_args()


def peer_available():
    try:
        return subprocess.run([PYTHON, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    except OSError:
        return False


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def baseline_dir(a):
    return a.baseline_build or a.build


def command(a, side, times_dir, rep):
    launcher = [os.path.join(a.build, "bin", "shardplan"), "launch", "-n", str(a.ranks)]
    common = ["--steps", str(a.steps), "--log-every", str(a.log_every), "--batch", str(a.batch),
              "--threads", str(a.threads), "--dtype", a.dtype]
    if a.config:
        common += ["--config", a.config]
    if side != "peer":
        launcher = [os.path.join(baseline_dir(a) if side == "base" else a.build, "bin", "shardplan"), "launch", "-n",
                    str(a.ranks), "--backend", "gloo"]
        plan = "data_parallel.yaml" if a.ddp else "gpt.yaml"
        program = [os.path.join(baseline_dir(a) if side == "base" else a.build, "examples", "train_gpt"), "--plan",
                   os.path.join(ROOT, "plans", plan)]
    else:
        launcher += ["--master-port", str(a.master_port or free_port())]
        program = [PYTHON, os.path.join(HERE, "gpt_tp_torch.py")] + (["--ddp"] if a.ddp else [])
    wrapper = []
    if not a.no_pin or times_dir:
        wrapper = [sys.executable, os.path.join(HERE, "rank_wrapper.py")]
        if not a.no_pin:
            wrapper.append("--pin")
        if times_dir:
            # Each rank's file is named after its LOCAL_RANK, which only the rank's shell knows.
            wrapper = ["/bin/sh", "-c",
                       'f="%s/%s.%d.$LOCAL_RANK"; exec %s %s %s --thread-times "$f" -- "$@"' %
                       (times_dir, side, rep, sys.executable, os.path.join(HERE, "rank_wrapper.py"),
                        "" if a.no_pin else "--pin"), "sh"]
        else:
            wrapper.append("--")
    return launcher + ["--"] + wrapper + program + common


def run(a, side, times_dir, rep):
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(a.threads)
    env["OPENBLAS_NUM_THREADS"] = str(a.threads)
    if side == "ours_tcp" or (side == "base" and a.with_tcp):
        env["SHARDPLAN_GLOO_SHM"] = "off"
    if side == "base":
        for kv in a.baseline_env:
            name, _, value = kv.partition("=")
            env[name] = value
    if a.comm_trace:
        os.makedirs(a.comm_trace, exist_ok=True)
        env["SHARDPLAN_COMM_TRACE"] = os.path.join(a.comm_trace, "%s.%d" % (side, rep))
    cmd = command(a, side, times_dir, rep)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout)
        sys.exit("side_by_side.py: %s failed (exit %d): %s" % (side, p.returncode, " ".join(cmd)))
    steps, comm = [], None
    for line in p.stdout.splitlines():
        m = STEP.match(line)
        if m:
            steps.append((int(m.group(1)), float(m.group(2)), float(m.group(3))))
        m = COMM.match(line) or GRAD.match(line)
        if m:  # DDP: its gradient bytes, in its buckets (calls unknown)
            comm = (int(m.group(1)), int(m.group(2)) if m.re is COMM else None)
    if len(steps) < 2:
        sys.stderr.write(p.stdout)
        sys.exit("side_by_side.py: %s logged fewer than two steps" % side)
    # tokens/s over the logged intervals after the first line (step 1 pays the
    # warm-up): total steps over total time, each interval's time being its
    # steps over its rate (tokens per step cancel).
    dsteps = [b[0] - a_[0] for a_, b in zip(steps, steps[1:])]
    secs = sum(d / s[2] for d, s in zip(dsteps, steps[1:]))
    return {"rate": sum(dsteps) / secs, "losses": {s[0]: s[1] for s in steps}, "comm": comm, "cmd": cmd}


def thread_rows(times_dir, side, reps, ranks):
    """Per rank, per thread (by creation order): mean user and system seconds over the repetitions."""
    acc = {}
    for rep in range(reps):
        for r in range(ranks):
            path = os.path.join(times_dir, "%s.%d.%d" % (side, rep, r))
            if not os.path.exists(path):
                continue
            with open(path) as f:
                for i, line in enumerate(f):
                    _, name, user, system = line.split()
                    key = (r, i, name)
                    u, s_ = acc.get(key, (0.0, 0.0))
                    acc[key] = (u + float(user) / reps, s_ + float(system) / reps)
    return acc


def main():
    a = parse()
    have_peer = a.only != "ours" and peer_available()
    if a.only != "ours" and not have_peer:
        print("side_by_side.py: %s cannot import torch.distributed with gloo (apt-get install python3-torch): "
              "the PyTorch ProcessGroupGloo reference row is skipped" % PYTHON)
    sides = [s for s in ("ours", "peer") if (s == "ours" and a.only != "peer") or (s == "peer" and have_peer)]
    if a.with_tcp and a.only != "peer":
        sides.insert(1, "ours_tcp")
    if (a.baseline_build or a.baseline_env) and a.only != "peer":
        sides.insert(1, "base")
    if not sides:
        return a.skip_status
    times_dir = tempfile.mkdtemp(prefix="gpt_peer_times.") if a.thread_times else None
    print("GPT example, %s, %d ranks, %d steps of batch %d, %s, %d thread(s) per rank, %s; interleaved, %d repetitions" %
          ("data parallel against DDP" if a.ddp else "tensor parallel against Megatron-style by hand", a.ranks,
           a.steps, a.batch, a.dtype, a.threads, "unpinned" if a.no_pin else "each rank pinned to one core", a.reps),
          flush=True)
    results = {s: [] for s in sides}
    for rep in range(a.reps):
        order = sides if rep % 2 == 0 else sides[::-1]
        for side in order:
            results[side].append(run(a, side, times_dir, rep))
    for side in sides:
        print("%s: %s" % (side, " ".join(results[side][0]["cmd"])))
    print()
    names = {"ours": "shardplan gloo", "ours_tcp": "shardplan gloo shm=off",
             "base": ("baseline build" if a.baseline_build else "baseline") + (" shm=off" if a.with_tcp else "") +
             "".join(" " + kv for kv in a.baseline_env)}
    cols = [x for x in ("ours", "ours_tcp", "base") if x in results]
    print("| rep | PyTorch %s tokens/s (reference) |%s" % ("DDP (gloo)" if a.ddp else "ProcessGroupGloo", "".join(
        " %s tokens/s | ratio |" % names[x] for x in cols)))
    print("|---|---|%s" % ("---|---|" * len(cols)))
    ratios = {x: [] for x in cols}
    for rep in range(a.reps):
        peer = results["peer"][rep]["rate"] if "peer" in results else None
        row = ""
        for x in cols:
            r = results[x][rep]["rate"]
            if peer:
                ratios[x].append(r / peer)
            row += " %.0f | %s |" % (r, "%.3f" % (r / peer) if peer else "-")
        print("| %d | %s |%s" % (rep + 1, "%.0f" % peer if peer else "skipped", row))
    for x in cols:
        if ratios[x]:
            v = sorted(ratios[x])
            print("%sratio %s / PyTorch: median %.3f (min %.3f, max %.3f)" % ("\n" if x == cols[0] else "", names[x],
                                                                             v[len(v) // 2], v[0], v[-1]))
    status = 0
    if "ours" in results and "peer" in results:
        o, p = results["ours"][0], results["peer"][0]
        common = sorted(set(o["losses"]) & set(p["losses"]))
        diff = max(abs(o["losses"][s] - p["losses"][s]) for s in common)
        print("losses at steps %s: largest difference %.2e (ours %s, peer %s at step %d)" %
              (",".join(map(str, common[:3] + (["..."] if len(common) > 3 else []))), diff,
               o["losses"][common[-1]], p["losses"][common[-1]], common[-1]))
        print("communicated per rank in step 1: ours %s bytes in %s calls, peer %s bytes in %s calls" %
              (o["comm"][0] if o["comm"] else "?", o["comm"][1] if o["comm"] else "?",
               p["comm"][0] if p["comm"] else "?", p["comm"][1] if p["comm"] and p["comm"][1] is not None
               else "its buckets'"))
        # DDP moves its gradients only; ours adds the used-parameter flags (4 bytes each) and the loss.
        same_bytes = o["comm"] == p["comm"] if not a.ddp else (
            o["comm"] and p["comm"] and 0 <= o["comm"][0] - p["comm"][0] <= 4096)
        if diff > a.max_loss_diff or not same_bytes:
            print("side_by_side.py: the two sides do not train the same model the same way")
            status = 1
    if times_dir:
        print("\nper-thread CPU seconds (user / system), mean over repetitions; thread 0 is the training thread")
        for side in sides:
            for (r, i, name), (u, s_) in sorted(thread_rows(times_dir, side, a.reps, a.ranks).items()):
                print("  %s rank %d thread %d (%s): user %.2f  system %.2f" % (side, r, i, name, u, s_))
    if not have_peer and a.only != "ours":
        return a.skip_status
    return status


if __name__ == "__main__":
    sys.exit(main())
