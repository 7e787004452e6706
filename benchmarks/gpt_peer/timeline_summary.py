#!/usr/bin/env python3
"""Where a training step's communication time goes, from per-call traces:
shardplan's (SHARDPLAN_COMM_TRACE=DIR, framework/src/comm/comm_trace.h) and
the Python peer's (benchmarks/gpt_peer/timeline.py), one rank<N>.jsonl per
rank in each DIR.

  timeline_summary.py [--rank R] [--steps A:B] [--detail N] LABEL=DIR [LABEL=DIR ...]

For each side and step (from its step marker to the next) it prints, per
call in order of issue: the issue offset from the step's start, how long an
asynchronous call's issue took to return ("-" for a synchronous one), the call's
duration (issue to completion), how long the caller waited for it (from
t_wait_begin, its issue for a synchronous call or its Work::wait() for an
asynchronous one, to completion), bytes and dtype. Then the totals per step:
the step's length (to the next marker; a last step without one is left
out unless it is alone), calls, bytes, time in communication (the union of the
calls' [issue, done] intervals), time the caller waited (the union of their
[wait begin, done] intervals), and overlap (communication the caller did not
wait for: the first minus the second), with the median over the steps.
Markdown tables, the form docs/BENCHMARKS.md carries ("Where the time goes
over TCP"). When every side has the same number of calls in a step, the
per-call rows are joined into one table, side by side.

--steps A:B: the steps summed (default: all but the first, which carries
warm-up); --detail N: the step whose calls are listed (default: the last one
every side completed; 0 for none). Stdlib only.
"""

import argparse
import json
import os
import statistics
import sys


def load(path):
    """[(step, t_start, [call, ...])] in step order; calls sorted by issue."""
    steps, current = [], None
    try:
        f = open(path)
    except OSError as e:
        raise SystemExit("timeline_summary.py: cannot read %s: %s" % (path, e.strerror))
    with f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError:
                raise SystemExit("timeline_summary.py: %s:%d is not a JSON line" % (path, n))
            if "meta" in r:
                continue
            if r.get("op") == "step":
                current = (r["step"], r["t"], [])
                steps.append(current)
            elif current is not None and r.get("t_done") is not None:
                current[2].append(r)
    for s in steps:
        s[2].sort(key=lambda c: c["t_issue"])
    return steps


def union(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def step_totals(steps):
    """{step: dict of totals}; a step ends at the next one's marker (the last
    at its last completion)."""
    out = {}
    for i, (step, t0, calls) in enumerate(steps):
        if i + 1 < len(steps):
            t1 = steps[i + 1][1]
        else:
            t1 = max([c["t_done"] for c in calls], default=t0)
        comm = union([(c["t_issue"], c["t_done"]) for c in calls])
        wait = union([(c["t_wait_begin"], c["t_done"]) for c in calls])
        out[step] = {"complete": i + 1 < len(steps), "length": t1 - t0, "calls": len(calls), "bytes": sum(c["bytes"] for c in calls),
                     "comm": comm, "wait": wait, "overlap": comm - wait}
    return out


def call_cells(c, t0):
    issue_call = "%.0f" % (c["t_issue_end"] - c["t_issue"]) if "t_issue_end" in c else "-"
    return ["%.0f" % (c["t_issue"] - t0), issue_call, "%.0f" % (c["t_done"] - c["t_issue"]),
            "%.0f" % (c["t_done"] - c["t_wait_begin"])]


def call_name(c):
    return "%s %s%s" % (c["op"], c["group"], " async" if c.get("async") else "")


def print_table(header, rows):
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    print()


def detail(sides, step):
    found = [(label, dict((s[0], s) for s in steps).get(step)) for label, steps in sides]
    found = [(label, s) for label, s in found if s is not None]
    if not found:
        return
    print("Step %d, per call (µs; issue: from the step's start; issue call: until an asynchronous issue returned; "
          "duration: issue to completion; wait: the caller's)\n" % step)
    counts = {len(s[2]) for _, s in found}
    if len(found) > 1 and len(counts) == 1:
        header = ["#", "call", "bytes", "dtype"]
        for label, _ in found:
            header += ["%s issue" % label, "%s issue call" % label, "%s duration" % label, "%s wait" % label]
        rows = []
        for i in range(counts.pop()):
            c0 = found[0][1][2][i]
            row = [i + 1, call_name(c0), c0["bytes"], c0["dtype"]]
            for _, s in found:
                row += call_cells(s[2][i], s[1])
            rows.append(row)
        print_table(header, rows)
        return
    for label, s in found:
        print("%s:\n" % label)
        print_table(["#", "call", "bytes", "dtype", "issue", "issue call", "duration", "wait"],
                    [[i + 1, call_name(c), c["bytes"], c["dtype"]] + call_cells(c, s[1]) for i, c in enumerate(s[2])])


def totals(sides, lo, hi):
    keys = ["length", "comm", "wait", "overlap"]
    header = ["side", "step", "step µs", "calls", "bytes", "in comm µs", "caller waited µs", "overlap µs"]
    rows = []
    for label, steps in sides:
        t = step_totals(steps)
        chosen = [s for s in sorted(t) if lo <= s <= hi]
        # The last step has no end marker: its length stops at its last call.
        if len(chosen) > 1 and not t[chosen[-1]]["complete"]:
            chosen.pop()
        for s in chosen:
            v = t[s]
            rows.append([label, s, "%.0f" % v["length"], v["calls"], v["bytes"]] +
                        ["%.0f" % v[k] for k in keys[1:]])
        if chosen:
            med = {k: statistics.median(t[s][k] for s in chosen) for k in keys}
            rows.append(["**%s**" % label, "median of %d" % len(chosen), "%.0f" % med["length"], t[chosen[-1]]["calls"],
                         t[chosen[-1]]["bytes"]] + ["%.0f" % med[k] for k in keys[1:]])
    print("Per step (in comm: the union of the calls' issue-to-done; overlap: in comm minus waited)\n")
    print_table(header, rows)


def parse_steps(text):
    a, sep, b = text.partition(":")
    try:
        return int(a) if a else 0, int(b) if sep and b else (int(a) if not sep else 1 << 30)
    except ValueError:
        raise argparse.ArgumentTypeError("--steps wants A:B, A: or A, not '%s'" % text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sides", nargs="+", metavar="LABEL=DIR")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--steps", type=parse_steps, default=None, help="A:B, the steps summed (default: 2:)")
    p.add_argument("--detail", type=int, default=None, help="the step listed call by call (0: none)")
    a = p.parse_args(argv)
    sides = []
    for s in a.sides:
        label, sep, d = s.partition("=")
        if not sep:
            label, d = os.path.basename(os.path.normpath(s)), s
        sides.append((label, load(os.path.join(d, "rank%d.jsonl" % a.rank))))
    lo, hi = a.steps if a.steps else (2, 1 << 30)
    # Steps every side completed (followed by a marker), else any.
    complete = [{s[0] for s in steps[:-1] if lo <= s[0] <= hi} for _, steps in sides]
    step_ids = sorted(set.intersection(*complete)) or sorted({s[0] for _, steps in sides for s in steps
                                                               if lo <= s[0] <= hi})
    if not step_ids:
        raise SystemExit("timeline_summary.py: no step in %d:%d in the traces (the trainers mark steps; "
                         "see docs/BENCHMARKS.md)" % (lo, hi))
    which = step_ids[-1] if a.detail is None else a.detail
    if which:
        detail(sides, which)
    totals(sides, lo, hi)


if __name__ == "__main__":
    sys.exit(main())
