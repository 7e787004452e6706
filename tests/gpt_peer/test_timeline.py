#!/usr/bin/python3
"""benchmarks/gpt_peer's timeline tools: timeline_summary.py's numbers on a
made-up trace pair, and timeline.py's lines from 2 gloo processes (a traced
all-reduce and a DDP model's buckets through its comm hook). Exits 77 (a
skip) without python3-torch, for the part that needs it."""

import contextlib
import faulthandler
import io
import json
import os
import socket
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmarks", "gpt_peer"))
import timeline_summary  # noqa: E402

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import timeline  # noqa: E402
except ImportError:
    torch = None


def write(directory, rank, records):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "rank%d.jsonl" % rank), "w") as f:
        f.write(json.dumps({"meta": "comm_trace", "rank": rank, "world_size": 2}) + "\n")
        for r in records:
            f.write(json.dumps(r) + "\n")


def call(op, t_issue, t_wait, t_done, nbytes=4096, is_async=False):
    r = {"op": op, "group": "model", "step": 0, "async": is_async, "bytes": nbytes, "dtype": "float32",
         "t_issue": t_issue, "t_wait_begin": t_wait, "t_done": t_done}
    if is_async:
        r["t_issue_end"] = t_issue + 3
    return r


class Summary(unittest.TestCase):
    def test_totals_and_detail(self):
        with tempfile.TemporaryDirectory() as d:
            # Step 2: a synchronous call [110, 130] and an async one issued at
            # 120, waited from 150, done at 160: in comm [110, 160] = 50,
            # waited [110, 130] + [150, 160] = 30, overlap 20.
            write(os.path.join(d, "a"), 0, [
                {"op": "step", "step": 1, "t": 0.0}, call("all_reduce", 10, 10, 20),
                {"op": "step", "step": 2, "t": 100.0}, call("all_reduce", 110, 110, 130),
                call("all_reduce", 120, 150, 160, 8192, True),
                {"op": "step", "step": 3, "t": 200.0}, call("all_reduce", 210, 210, 215)])
            write(os.path.join(d, "b"), 0, [
                {"op": "step", "step": 2, "t": 0.0}, call("all_reduce", 5, 5, 45),
                call("all_reduce", 50, 50, 60, 8192), {"op": "step", "step": 3, "t": 90.0}])
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                timeline_summary.main(["a=" + os.path.join(d, "a"), "b=" + os.path.join(d, "b")])
            text = out.getvalue()
        # Step 2 is the last that both completed; the rows are joined.
        self.assertIn("| 1 | all_reduce model | 4096 | float32 | 10 | - | 20 | 20 | 5 | - | 40 | 40 |", text)
        self.assertIn("| 2 | all_reduce model async | 8192 | float32 | 20 | 3 | 40 | 10 | 50 | - | 10 | 10 |", text)
        self.assertIn("| a | 2 | 100 | 2 | 12288 | 50 | 30 | 20 |", text)
        self.assertIn("| b | 2 | 90 | 2 | 12288 | 50 | 50 | 0 |", text)
        # a's step 3 has no end marker: left out of the totals.
        self.assertNotIn("| a | 3 |", text)


def traced_rank(rank, port, directory):
    # A rank that hangs says where instead of holding ctest to its timeout.
    faulthandler.dump_traceback_later(60, exit=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                      SHARDPLAN_COMM_TRACE=directory)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    timeline.start(rank, 2)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
    timeline.register_ddp_hook(model)
    for step in (1, 2):
        timeline.step(step)
        x = torch.full((3,), float(rank + 1), dtype=torch.float64)
        timeline.traced_all_reduce(x, group="model")
        assert x.tolist() == [3.0] * 3
        model(torch.ones(2, 8)).sum().backward()
    timeline.step(3)
    timeline._trace.close()
    dist.barrier()


@unittest.skipIf(torch is None, "python3-torch is not installed")
class PeerTrace(unittest.TestCase):
    def test_lines_of_two_ranks(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with tempfile.TemporaryDirectory() as d:
            mp.spawn(traced_rank, args=(port, d), nprocs=2, join=True)
            for rank in (0, 1):
                with open(os.path.join(d, "rank%d.jsonl" % rank)) as f:
                    lines = [json.loads(x) for x in f]
                self.assertEqual(lines[0]["rank"], rank)
                calls = [x for x in lines[1:] if x["op"] != "step"]
                self.assertEqual([(c["step"], c["group"], c["async"], c["bytes"], c["dtype"]) for c in calls],
                                 [(1, "model", False, 24, "float64"), (1, "data", True, 36 * 4, "float32"),
                                  (2, "model", False, 24, "float64"), (2, "data", True, 36 * 4, "float32")])
                for c in calls:
                    self.assertEqual("t_issue_end" in c, c["async"])
                    self.assertLessEqual(c["t_issue"], c.get("t_issue_end", c["t_issue"]))
                    self.assertLessEqual(c["t_issue"], c["t_wait_begin"])
                    self.assertLessEqual(c["t_wait_begin"], c["t_done"])
                self.assertEqual([x["step"] for x in lines[1:] if x["op"] == "step"], [1, 2, 3])

    def test_bad_directory(self):
        with tempfile.NamedTemporaryFile() as f:
            os.environ["SHARDPLAN_COMM_TRACE"] = f.name
            try:
                with self.assertRaises(SystemExit) as e:
                    timeline.start(0, 1)
            finally:
                del os.environ["SHARDPLAN_COMM_TRACE"]
            self.assertIn("SHARDPLAN_COMM_TRACE='%s' is not a directory" % f.name, str(e.exception))


if __name__ == "__main__":
    unittest.main()
