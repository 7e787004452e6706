"""The Python peer's per-call communication trace, in the format of
shardplan's SHARDPLAN_COMM_TRACE (framework/src/comm/comm_trace.h), so that
benchmarks/gpt_peer/timeline_summary.py lays both sides' steps side by side.

With SHARDPLAN_COMM_TRACE=DIR, start(rank, world_size) opens DIR/rank<N>.jsonl
(DIR made if missing, one level; a bad value is a one-line SystemExit naming it); lines
are kept in memory and written past 1 MiB at a step marker, past 8 MiB at
once, and at exit. Without the variable every function here is the plain
call, so a program may call them unconditionally:

  import timeline
  timeline.start(rank, world)                 # after init_process_group
  timeline.step(step)                         # at the top of each step
  timeline.traced_all_reduce(t, op, "model")  # instead of dist.all_reduce(t, op=op)
  timeline.register_ddp_hook(ddp_model)       # DDP: its buckets' all-reduces (trace on only)

Times are µs on the monotonic clock (CLOCK_MONOTONIC, as steady_clock) from
start(). A synchronous call's caller waits from its issue; an asynchronous
call's line also has t_issue_end, when the issuing call returned. A DDP bucket's
all-reduce is issued by the reducer during backward and waited for when
backward's compute is over, which Python cannot see: the hook takes the issue
of the step's last bucket as that moment (the reducer launches it when the
last gradient is ready) and writes the step's buckets at the next marker, each
with t_wait_begin = that moment clamped to [t_issue, t_done].
"""

import atexit
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

FLUSH_AT = 1 << 20
HARD_LIMIT = 8 << 20


def _now_us(origin_ns):
    return (time.monotonic_ns() - origin_ns) / 1000.0


class Trace:
    def __init__(self, directory, rank, world_size, backend="gloo"):
        try:  # one level, as shardplan's
            if not os.path.exists(directory):
                os.mkdir(directory)
        except FileExistsError:  # another rank made it
            pass
        except OSError as e:
            raise SystemExit("SHARDPLAN_COMM_TRACE='%s' cannot be created: %s (it names a directory that gets one "
                             "rank<N>.jsonl per rank)" % (directory, e.strerror))
        if not os.path.isdir(directory):
            raise SystemExit("SHARDPLAN_COMM_TRACE='%s' is not a directory (it names a directory that gets one "
                             "rank<N>.jsonl per rank)" % directory)
        self.path = os.path.join(directory, "rank%d.jsonl" % rank)
        self.file = open(self.path, "w")
        self.origin_ns = time.monotonic_ns()
        origin_unix_us = time.time_ns() / 1000.0 - _now_us(self.origin_ns)
        self.lock = threading.Lock()
        self.lines = []
        self.size = 0
        self.current_step = 0
        self.ddp_pending = []  # (call fields, t_issue, t_done) of this step's buckets
        self._append({"meta": "comm_trace", "rank": rank, "world_size": world_size, "backend": backend,
                      "origin_unix_us": round(origin_unix_us, 1)})

    def now(self):
        return _now_us(self.origin_ns)

    def _append(self, record):
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self.lock:
            self.lines.append(line)
            self.size += len(line)
            if self.size >= HARD_LIMIT:
                self._flush_locked()

    def _flush_locked(self):
        self.file.write("".join(self.lines))
        self.file.flush()
        self.lines, self.size = [], 0

    def record(self, op, group, t, is_async, t_issue, t_wait_begin, t_done, step=None, t_issue_end=None):
        r = {"op": op, "group": group, "step": self.current_step if step is None else step, "async": is_async,
             "bytes": t.numel() * t.element_size(), "dtype": str(t.dtype).replace("torch.", ""),
             "t_issue": round(t_issue, 1)}
        if t_issue_end is not None:
            r["t_issue_end"] = round(t_issue_end, 1)
        r["t_wait_begin"] = None if t_wait_begin is None else round(t_wait_begin, 1)
        r["t_done"] = None if t_done is None else round(t_done, 1)
        self._append(r)

    def step(self, step):
        self._write_ddp()
        with self.lock:
            if self.size >= FLUSH_AT:  # between steps, not inside one
                self._flush_locked()
        self.current_step = step
        self._append({"op": "step", "step": step, "t": round(self.now(), 1)})

    def _write_ddp(self):
        with self.lock:
            pending, self.ddp_pending = self.ddp_pending, []
        if not pending:
            return
        compute_over = max(p[2] for p in pending)
        for tensor, group, t_issue, t_issue_end, t_done, step in pending:
            wait = t_done if t_done < compute_over else max(compute_over, t_issue_end)
            self.record("all_reduce", group, tensor, True, t_issue, wait, t_done, step, t_issue_end)

    def close(self):
        self._write_ddp()
        with self.lock:
            if not self.file.closed:
                self._flush_locked()
                self.file.close()


_trace = None


def start(rank, world_size, backend="gloo"):
    """Opens the trace SHARDPLAN_COMM_TRACE asks for; None when it is unset."""
    global _trace
    directory = os.environ.get("SHARDPLAN_COMM_TRACE", "")
    if not directory:
        return None
    _trace = Trace(directory, rank, world_size, backend)
    atexit.register(_trace.close)
    return _trace


def step(n):
    if _trace:
        _trace.step(n)


def traced_all_reduce(t, op=None, group="world"):
    """dist.all_reduce(t, op), recorded as one synchronous call of `group`."""
    op = dist.ReduceOp.SUM if op is None else op
    if not _trace:
        dist.all_reduce(t, op=op)
        return t
    t_issue = _trace.now()
    dist.all_reduce(t, op=op)
    t_done = _trace.now()
    _trace.record("all_reduce", group, t, False, t_issue, t_issue, t_done)
    return t


def traced_allreduce_hook(process_group, bucket):
    """torch 1.13's default allreduce_hook (sum, then divide by the group's
    size), its issue and completion recorded."""
    pg = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(pg.size())
    t_issue = _trace.now()
    fut = dist.all_reduce(tensor, group=pg, async_op=True).get_future()
    t_issue_end = _trace.now()
    step_at_issue = _trace.current_step

    def done(f):
        t_done = _trace.now()
        result = f.value()[0]
        with _trace.lock:
            _trace.ddp_pending.append((tensor, "data", t_issue, t_issue_end, t_done, step_at_issue))
        return result

    return fut.then(done)


def register_ddp_hook(ddp_model, process_group=None):
    """Installs traced_allreduce_hook on a DistributedDataParallel model when
    a trace is on; without one DDP keeps its built-in C++ hook, as an
    untimed run should (a Python hook costs the GIL per bucket)."""
    if _trace:
        ddp_model.register_comm_hook(process_group, traced_allreduce_hook)


if __name__ == "__main__":
    sys.exit("timeline.py is a module: import it (see its docstring)")
