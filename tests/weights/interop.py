#!/usr/bin/python3
"""Python side of tests/test_weights_python.cpp, written apart from the C++
reader and writer: safetensors here is struct + json by hand, torch.save is
PyTorch's own.

  interop.py write DIR SPEC   random tensors for every "name d0,d1,..." line of
                              SPEC: DIR/py.safetensors (F32), py_bf16.safetensors
                              (BF16), py.bin (torch.save of a state dict), with
                              the values as raw float64 in expected.f64 and
                              expected_bf16.f64; zoo.safetensors and zoo.bin hold
                              one tensor per dtype (zoo.f64 their values)
  interop.py check FILE SPEC EXPECTED
                              reads safetensors FILE and compares each SPEC
                              tensor with EXPECTED (raw float64): exit 0 if equal
"""
import collections
import json
import struct
import sys

import torch

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}
BY_NAME = {v: k for k, v in DTYPES.items()}


def raw(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        b = raw(t)
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        dtype = BY_NAME[e["dtype"]]
        buf = bytearray(data[8 + n + b:8 + n + end])
        view = torch.bfloat16 if dtype == torch.bfloat16 else dtype
        t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16) if view == torch.bfloat16 and buf else \
            torch.frombuffer(buf, dtype=view) if buf else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(e["shape"])
    return out


def read_spec(path):
    spec = []
    for line in open(path):
        name, dims = line.split()
        spec.append((name, [int(d) for d in dims.split(",") if d]))
    return spec


def expected_bytes(tensors):
    return b"".join(raw(t.to(torch.float64)) for t in tensors.values())


def write(out, spec_path):
    torch.manual_seed(1234)
    f32 = collections.OrderedDict((n, torch.randn(s)) for n, s in read_spec(spec_path))
    bf16 = collections.OrderedDict((n, t.to(torch.bfloat16)) for n, t in f32.items())
    write_safetensors(out + "/py.safetensors", f32)
    write_safetensors(out + "/py_bf16.safetensors", bf16)
    torch.save(f32, out + "/py.bin")
    open(out + "/expected.f64", "wb").write(expected_bytes(f32))
    open(out + "/expected_bf16.f64", "wb").write(expected_bytes(bf16))
    zoo = collections.OrderedDict([
        ("a", torch.tensor([1.5, -2.25, 1e-3], dtype=torch.float64)),
        ("b", torch.tensor([[0.5, -1.0], [3.0, 65504.0]], dtype=torch.float16)),
        ("c", torch.tensor([1.0 / 3, -7.5, 2.0 ** -20, 3e38], dtype=torch.bfloat16)),
        ("d", torch.tensor([3, 0, 255], dtype=torch.uint8)),
        ("i", torch.tensor([-5, 7, 2 ** 31 - 1], dtype=torch.int32)),
        ("j", torch.tensor([2 ** 40, -1], dtype=torch.int64)),
        ("m", torch.tensor([True, False, False, True])),
    ])
    write_safetensors(out + "/zoo.safetensors", zoo)
    torch.save(zoo, out + "/zoo.bin")
    open(out + "/zoo.f64", "wb").write(expected_bytes(zoo))


def check(path, spec_path, expected_path):
    got = read_safetensors(path)
    want = open(expected_path, "rb").read()
    at = 0
    for name, shape in read_spec(spec_path):
        n = 1
        for d in shape:
            n *= d
        w = torch.frombuffer(bytearray(want[at:at + 8 * n]), dtype=torch.float64).reshape(shape) if n else torch.empty(shape)
        at += 8 * n
        if name not in got:
            print(f"{path}: no tensor {name!r}")
            return 1
        if list(got[name].shape) != shape or not torch.equal(got[name].to(torch.float64), w):
            print(f"{path}: tensor {name!r} differs from what C++ wrote")
            return 1
    print(f"{path}: {len(got)} tensors equal C++'s values")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3])
    else:
        sys.exit(check(sys.argv[2], sys.argv[3], sys.argv[4]))
