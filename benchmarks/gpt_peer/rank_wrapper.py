#!/usr/bin/python3
"""Runs one rank's program pinned to a core, optionally recording its threads'
CPU time.

  rank_wrapper.py [--pin] [--thread-times FILE] -- program [args...]

--pin: the rank runs on core LOCAL_RANK mod (cores available), so both sides
of a comparison are placed alike. --thread-times: polls
/proc/<pid>/task/*/stat every 50 ms and, when the program ends, writes one
line per thread that used CPU: `tid name utime_s stime_s` (threads in order
of creation; the first is the main, i.e. training, thread). Stdlib only.
"""

import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def read_threads(pid, seen):
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                s = f.read()
        except OSError:
            continue
        name = s[s.index("(") + 1:s.rindex(")")]
        fields = s[s.rindex(")") + 2:].split()
        # fields[0] is field 3 (state): utime and stime are fields 14 and 15.
        seen[int(tid)] = (name, int(fields[11]) / TICK, int(fields[12]) / TICK)


def main():
    args = sys.argv[1:]
    pin, out = False, None
    while args and args[0] != "--":
        if args[0] == "--pin":
            pin = True
            args = args[1:]
        elif args[0] == "--thread-times" and len(args) > 1:
            out = args[1]
            args = args[2:]
        else:
            sys.exit("rank_wrapper.py: unknown option %s" % args[0])
    if not args[1:]:
        sys.exit("usage: rank_wrapper.py [--pin] [--thread-times FILE] -- program [args...]")
    if pin:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[int(os.environ.get("LOCAL_RANK", "0")) % len(cores)]})
    child = subprocess.Popen(args[1:])
    if out is None:
        sys.exit(child.wait())
    seen = {}
    while child.poll() is None:
        read_threads(child.pid, seen)
        time.sleep(0.05)
    with open(out, "w") as f:
        for tid in sorted(seen):
            name, user, system = seen[tid]
            if user + system > 0:
                f.write("%d %s %.2f %.2f\n" % (tid, name.replace(" ", "_"), user, system))
    sys.exit(child.returncode)


if __name__ == "__main__":
    main()
