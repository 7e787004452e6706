#!/usr/bin/env python3
"""The shared libraries a shardplan build needs on a machine without Debian's
packages (the lent GPU machine: Ubuntu, no libtorch), and stand-ins for the
ones it never calls.

    libs.py OUTDIR FILE...   # FILE: our binaries, libshardplan, plugins

Writes OUTDIR/keep.txt (the libraries to carry: the dependency closure of
FILE..., without glibc, CUDA and NCCL, which the machine has) and
OUTDIR/stubs/*.so. Debian's libtorch_cpu links OpenCV, FFmpeg, ZeroMQ,
LevelDB, LMDB, ONNX and OpenCL (about 300 MB with their own dependencies)
for Caffe2 operators shardplan never runs; it is linked with BIND_NOW, so
every symbol it imports must resolve at load. Each stub has the library's
soname and version nodes and exports exactly the symbols the kept libraries
import from it: functions trap (ud2), data is zero-filled.
"""
import collections
import os
import re
import subprocess
import sys

DROP = re.compile(r'^(libopencv_.*|libav(codec|format|util)\.so.*|libsw(scale|resample)\.so.*|libzmq\.so.*|'
                  r'libleveldb\.so.*|liblmdb\.so.*|libonnx.*|libOpenCL\.so.*|libsnappy\.so.*)$')
GLIBC = ['libc.so.6', 'libm.so.6', 'libpthread.so.0', 'libdl.so.2', 'librt.so.1', 'ld-linux-x86-64.so.2',
         'libresolv.so.2', 'libutil.so.1']
ON_MACHINE = re.compile(r'^(libcudart|libnccl)')


def ldconfig():
    found = {}
    for line in subprocess.check_output(['ldconfig', '-p'], text=True).splitlines()[1:]:
        m = re.match(r'\s*(\S+) \(libc6,x86-64.*\) => (\S+)', line)
        if m and m.group(1) not in found:
            found[m.group(1)] = m.group(2)
    return found


def needed(path):
    out = subprocess.check_output(['readelf', '-d', path], text=True)
    return re.findall(r'\(NEEDED\)\s+Shared library: \[(.+?)\]', out)


def dynsyms(path):
    """(name, version or None, size, type, bind, defined) per dynamic symbol."""
    out = subprocess.check_output(['readelf', '--dyn-syms', '-W', path], text=True)
    for line in out.splitlines():
        p = line.split()
        if len(p) < 8 or not p[0].endswith(':') or p[0] == 'Num:':
            continue
        size, typ, bind, ndx = p[2], p[3], p[4], p[6]
        name = re.sub(r' \(\d+\)$', '', ' '.join(p[7:]))
        sym, _, ver = name.replace('@@', '@').partition('@')
        yield sym, ver or None, int(size, 0), typ, bind, ndx != 'UND'


def main():
    outdir, files = sys.argv[1], sys.argv[2:]
    libs = ldconfig()
    keep, dropped, seen = [], set(), set()
    todo = list(files)
    ours = {os.path.basename(f) for f in files}
    while todo:
        path = todo.pop()
        for n in needed(path):
            if n in GLIBC or ON_MACHINE.match(n) or n in ours or n in seen:
                continue
            if DROP.match(n):
                dropped.add(n)
                continue
            seen.add(n)
            if n not in libs:
                sys.exit(f'libs.py: {n} (needed by {path}) is not in the loader cache')
            keep.append(libs[n])
            todo.append(libs[n])
    defined = set()
    for p in keep + files + [libs[n] for n in GLIBC if n in libs]:
        defined.update(s for s, _, _, _, _, d in dynsyms(p) if d)
    wanted = {}
    for p in keep + files:
        for s, v, _, _, bind, d in dynsyms(p):
            if not d and bind != 'WEAK' and s and s not in defined:
                wanted[s] = v
    os.makedirs(os.path.join(outdir, 'stubs'), exist_ok=True)
    with open(os.path.join(outdir, 'keep.txt'), 'w') as f:
        f.write(''.join(k + '\n' for k in keep))
    for soname in sorted(dropped):
        real = libs[soname]
        mine = {}
        for s, v, size, typ, _, d in dynsyms(real):
            if d and s in wanted and wanted[s] in (None, v):
                mine[s] = (v, typ, size)
        for s in mine:
            wanted.pop(s)
        asm, nodes = [], collections.defaultdict(list)
        for s, (v, typ, size) in sorted(mine.items()):
            nodes[v].append(s)
            if typ in ('FUNC', 'IFUNC'):
                asm.append(f'.text\n.globl "{s}"\n.type "{s}",@function\n"{s}":\n ud2\n')
            else:
                n = max(size, 8)
                asm.append(f'.data\n.balign 16\n.globl "{s}"\n.type "{s}",@object\n.size "{s}",{n}\n"{s}":\n .zero {n}\n')
        versions = subprocess.check_output(['readelf', '-V', '-W', real], text=True)
        defs = versions.split('Version needs section')[0]
        all_versions = set(re.findall(r'Name: (\S+)', defs)) - {soname} if 'Version definition' in defs else set()
        base = os.path.join(outdir, 'stubs', soname)
        with open(base + '.S', 'w') as f:
            f.write(''.join(asm) + '.section .note.GNU-stack,"",@progbits\n')
        cmd = ['gcc', '-shared', '-nostdlib', '-Wl,-soname,' + soname, base + '.S', '-o', base]
        named = sorted(all_versions | {v for v in nodes if v})
        if named:
            with open(base + '.map', 'w') as f:
                for v in named:
                    syms = ''.join(f'  "{s}";\n' for s in nodes.get(v, []))
                    f.write(f'{v} {{\n' + (f' global:\n{syms}' if syms else '') + '};\n')
            cmd.insert(3, '-Wl,--version-script=' + base + '.map')
        subprocess.check_call(cmd)
        os.remove(base + '.S')
        if named:
            os.remove(base + '.map')
    missing = {s: v for s, v in wanted.items() if not ON_MACHINE.match(v or '') and not s.startswith(('cuda', 'nccl'))}
    if missing:
        sys.exit('libs.py: no library provides ' + ', '.join(sorted(missing)[:10]))
    print(f'{len(keep)} libraries to carry, {len(dropped)} stubs')


if __name__ == '__main__':
    main()
