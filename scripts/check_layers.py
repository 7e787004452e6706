#!/usr/bin/env python3
"""Keeps the kernel's includes pointing down its layers (docs/ARCHITECTURE.md).

framework/src/ has one folder per layer and framework/include/shardplan/ one
header per concept; LAYERS below gives each a rank. A file may include its
own folder and anything of a lower rank; folders of equal rank are siblings
and include neither each other nor anything above. A new folder or public
header must be given a layer here, so the map cannot drift from the tree.

  check_layers.py [--root DIR]   check DIR (default: the checkout); exit 1 on a violation
  check_layers.py --self-test    prove the check fails on a planted violation
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

# rank, folder under framework/src (or None), public headers under include/shardplan/
LAYERS = [
    (0, "abi", ["abi/comm.h", "abi/plugin.h", "comm_dtype.h", "comm_plugin.h", "comm_worker.h"]),
    (1, "base", ["error.h", "count_option.h"]),
    (2, "plan", ["plan.h", "mesh.h", "split.h"]),
    (3, "plugin", ["plugin_loader.h", "layer_plugin.h", "plugin_support.h"]),
    (4, "comm", ["communicator.h", "store.h", "threads.h", "world.h"]),
    (5, "mappings", ["mappings.h", "ring.h"]),
    (5, "random", ["random.h"]),
    # Between random (its streams are replayed) and nn (attention's core is a region).
    (5.5, "recompute", ["recompute.h"]),
    (6, "nn", ["nn/"]),
    (7, "parallel", ["parallelize.h", "shard.h", "agreement.h", "helpers.h", "tied.h", "tensor_parallel.h"]),
    (8, "script", ["script.h", "script_rewrite.h"]),
    (8, "auto_plan", ["auto_plan.h"]),
    (8, "data_parallel", ["data_parallel.h", "zero_optimizer.h"]),
    (9, "checkpoint", ["checkpoint.h", "checkpoint_meta.h"]),
    (9, "check", ["plan_check.h", "dry_run.h"]),
    # Above data_parallel and parallel: a stage composes with both (later sessions).
    (9, "pipeline", ["pipeline.h", "pipeline_schedule.h"]),
    # A stage's tensors in checkpoint's format: above both.
    (9.5, "pipeline_checkpoint", ["pipeline_checkpoint.h"]),
    (10, "training", ["optimizer.h", "training.h", "clip_grad.h", "replicas.h", "mixed_precision.h", "state_bytes.h"]),
    (10, "weights", ["weights.h"]),
]
RANK = {name: rank for rank, name, _ in LAYERS}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def public_layer(header):
    for _, name, headers in LAYERS:
        for h in headers:
            if header == h or (h.endswith("/") and header.startswith(h)):
                return name
    return None


def check(root):
    fw = os.path.join(root, "framework")
    src, inc = os.path.join(fw, "src"), os.path.join(fw, "include", "shardplan")
    problems = []
    files = []  # (path for messages, layer, directory of the file)
    for folder in sorted(os.listdir(src)):
        d = os.path.join(src, folder)
        if not os.path.isdir(d):
            problems.append(f"framework/src/{folder}: a file outside the layer folders")
            continue
        if folder not in RANK:
            problems.append(f"framework/src/{folder}/: a folder with no layer in scripts/check_layers.py")
            continue
        for dirpath, _, names in os.walk(d):
            files += [(os.path.join(dirpath, n), folder) for n in sorted(names)]
    for dirpath, _, names in os.walk(inc):
        for n in sorted(names):
            rel = os.path.relpath(os.path.join(dirpath, n), inc)
            layer = public_layer(rel)
            if layer is None:
                problems.append(f"framework/include/shardplan/{rel}: a public header with no layer in scripts/check_layers.py")
            else:
                files.append((os.path.join(dirpath, n), layer))
    for path, layer in files:
        text = open(path, encoding="utf-8").read()
        for m in INCLUDE.finditer(text):
            target = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            if target.startswith("shardplan/"):
                to = public_layer(target[len("shardplan/"):])
            elif os.path.exists(os.path.join(os.path.dirname(path), target)):
                to = layer if "/" not in target else None
                if to is None:  # e.g. "../x.h": resolve to its folder
                    full = os.path.normpath(os.path.join(os.path.dirname(path), target))
                    to = os.path.relpath(full, src).split(os.sep)[0]
            elif os.path.exists(os.path.join(src, target)):
                to = target.split("/")[0]
            else:
                continue  # not ours
            where = f"{os.path.relpath(path, root)}:{line}"
            if to not in RANK:
                problems.append(f"{where}: includes \"{target}\", which belongs to no layer")
            elif to != layer and RANK[to] >= RANK[layer]:
                kind = "a sibling" if RANK[to] == RANK[layer] else "a higher"
                problems.append(f"{where}: layer '{layer}' includes \"{target}\" of {kind} layer '{to}'"
                                f" (ranks {RANK[layer]} -> {RANK[to]}; docs/ARCHITECTURE.md)")
    return problems


def self_test(root):
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(root, "framework"), os.path.join(tmp, "framework"))
        victim = os.path.join(tmp, "framework", "src", "plan", "plan.cpp")
        with open(victim, "a", encoding="utf-8") as f:
            f.write('\n#include "shardplan/checkpoint.h"\n')
        r = subprocess.run([sys.executable, __file__, "--root", tmp], capture_output=True, text=True)
        out = r.stdout + r.stderr
        if r.returncode == 1 and "framework/src/plan/plan.cpp" in out and "'checkpoint'" in out:
            print("self-test: the planted include of checkpoint.h into plan/ was caught:\n" + out.strip())
            return 0
        print(f"self-test FAILED: exit {r.returncode}, output:\n{out}")
        return 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    if args.self_test:
        return self_test(root)
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        return 1
    print("layers: every include of framework/ points down the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
