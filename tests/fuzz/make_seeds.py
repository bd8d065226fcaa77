#!/usr/bin/env python3
"""Writes the seed inputs of tests/fuzz/fuzz_hak.c: small programs in its
encoding, one or a few per opcode, each meant to reach one path of the
allocator (every size range, class boundaries, realloc chains across ranges,
alignments, remote frees both ways, worker restarts, options).

Usage: make_seeds.py OUTDIR   (the files are named seed-NN-what)

The seeds were the start of tests/fuzz/corpus, which is fuzzed and merged
since (make fuzz-merge); running this again is only needed when the encoding
changes.  The constants mirror fuzz_hak.c: keep them in step."""
import os
import random
import struct
import sys

KiB = 1024
MiB = 1024 * KiB

# Opcodes (fuzz_hak.c, enum OP_*).
MALLOC, FREE, CALLOC, REALLOC, ALIGNED, USABLE, CHECK, REWRITE = range(8)
REMOTE_FREE, REMOTE_ALLOC, REMOTE_REALLOC, SYNC, EDGE, BURST, OPTION, RESTART = range(8, 16)

# draw_size's boundary table: 16..256 by 16, four per doubling from 256 to
# 128 KiB, then the fixed ones, then the fifth classes (9/8 of each doubling
# from 1 KiB).
BOUNDARIES = list(range(16, 257, 16))
d = 256
while d < 128 * KiB:
    BOUNDARIES += [d * q // 4 for q in range(5, 9)]
    d *= 2
BOUNDARIES += [0, 1, 4 * KiB, 60 * KiB, 64 * KiB, 192 * KiB, 960 * KiB, MiB, MiB + 4 * KiB,
               2 * MiB - 4 * KiB, 2 * MiB, 2 * MiB + 4 * KiB, 4 * MiB, 6 * MiB]
BOUNDARIES += [d * 9 // 8 for d in (1 << k for k in range(10, 17))]
DELTAS = [-1, 0, 1, -16, 16, -4096, 4096, 15]


def sz(sel, v):
    return bytes([sel]) + struct.pack("<I", v)


def size(n):
    """The encoding of exactly n bytes, in the narrowest range holding it."""
    if n == 0:
        return sz(0, 0)
    if n <= 64:
        return sz(1, n - 1)
    if n <= 1024:
        return sz(5, n - 1)
    if n <= 128 * KiB:
        return sz(9, n - 1)
    if 64 * KiB <= n < MiB + 8 * KiB:
        return sz(13, n - 64 * KiB)
    if MiB <= n < 8 * MiB:
        return sz(15, n - MiB)
    raise ValueError(n)


def boundary(idx, delta):
    """Boundary idx plus DELTAS[delta]: v % len == idx and (v >> 16) & 7 == delta."""
    base = delta << 16
    x = (idx - base) % len(BOUNDARIES)
    return sz(11, base + x)


def op(code, *args):
    out = bytes([code])
    for a in args:
        out += bytes([a]) if isinstance(a, int) else a
    return out


def malloc(slot, s): return op(MALLOC, slot, s)
def free(slot): return op(FREE, slot)
def calloc(slot, split, s): return op(CALLOC, slot, split, s)
def realloc(slot, chain, s): return op(REALLOC, slot, chain, s)
def aligned(slot, a, s): return op(ALIGNED, slot, a, s)
def usable(slot, flags=0): return op(USABLE, slot, flags)
def check(slot): return op(CHECK, slot)
def rewrite(slot): return op(REWRITE, slot)
def remote_free(slot): return op(REMOTE_FREE, slot)
def remote_alloc(slot, kind, a, s): return op(REMOTE_ALLOC, slot, kind, a, s)
def remote_realloc(slot, s): return op(REMOTE_REALLOC, slot, s)
def sync(): return op(SYNC)
def edge(variant, slot, s=None): return op(EDGE, variant, slot, s if s is not None else size(0))
def burst(count, mode, s): return op(BURST, count - 1, mode, s)
def option(which, value): return op(OPTION, which, value)  # which 4: the statistics
def restart(): return op(RESTART)


def free_all(slots): return b"".join(free(i) for i in slots)


def seeds():
    out = {}
    out["tiny"] = b"".join(malloc(i, size(1 + i)) for i in range(64)) + free_all(range(0, 64, 2)) + \
        b"".join(malloc(i, size(64 - i)) for i in range(0, 64, 2))
    out["small"] = b"".join(malloc(i, size(65 + i * 15)) for i in range(64)) + free_all(range(64))
    out["mid"] = b"".join(malloc(i, size(1025 + i * 2011)) for i in range(64)) + free_all(range(63, -1, -1))
    out["large"] = b"".join(malloc(i, size(128 * KiB + 1 + i * 28 * KiB)) for i in range(32)) + free_all(range(0, 32, 3))
    out["huge"] = b"".join(malloc(i, size(MiB + 1 + i * 700 * KiB)) for i in range(8)) + free_all(range(8)) + \
        malloc(0, size(3 * MiB)) + malloc(1, size(MiB + 1))
    out["zero"] = b"".join(malloc(i, size(0)) for i in range(16)) + b"".join(usable(i) for i in range(16))
    out["boundaries"] = b"".join(malloc(i % 64, boundary(i, (i * 5) % 8)) for i in range(len(BOUNDARIES)))
    out["boundaries-exact"] = b"".join(malloc(i % 64, boundary(i, 1)) for i in range(len(BOUNDARIES)))
    out["calloc"] = b"".join(calloc(i, i % 16, size(1 + i * 997)) for i in range(40))
    # dirty blocks freed, then calloc of the same sizes (reused, must be zeroed)
    out["calloc-reuse"] = b"".join(malloc(i, size(s)) for i, s in enumerate([48, 1000, 20000, 200 * KiB, 3 * MiB])) + \
        free_all(range(5)) + b"".join(calloc(i, 0, size(s)) for i, s in enumerate([48, 1000, 20000, 200 * KiB, 3 * MiB]))
    out["calloc-huge-cache"] = malloc(0, size(6 * MiB)) + free(0) + calloc(1, 0, size(2 * MiB)) + \
        free(1) + calloc(2, 4, size(5 * MiB)) + malloc(3, size(7 * MiB - 1)) + free(3) + calloc(3, 9, size(MiB + 5))
    out["realloc-grow"] = b"".join(realloc(i, 0x07, size(1 + i)) for i in range(8)) + \
        realloc(0, 0x07, size(100 * KiB)) + realloc(0, 0x07, size(700 * KiB))
    out["realloc-shrink"] = realloc(0, 0x0F, size(7 * MiB)) + realloc(1, 0x0F, size(900 * KiB)) + \
        realloc(2, 0x0F, size(100 * KiB)) + realloc(3, 0x0F, size(1000)) + realloc(0, 0x0F, size(20 * KiB))
    out["realloc-alternate"] = b"".join(realloc(i, 0x17, size(s)) for i, s in
                                        enumerate([10, 300, 5000, 70 * KiB, 600 * KiB, 2 * MiB]))
    rnd = [size(s) for s in [5, 4000, 2 * MiB + 7, 100, 130 * KiB, MiB, MiB + 1, 64 * KiB]]
    out["realloc-random"] = realloc(0, 0x1F, rnd[0]) + b"".join(rnd[1:]) + realloc(1, 0x1F, rnd[7]) + b"".join(rnd[:7])
    out["realloc-zero"] = malloc(0, size(100)) + realloc(0, 0, size(0)) + malloc(1, size(5 * MiB)) + \
        realloc(1, 0, size(0)) + realloc(2, 0, size(30)) + realloc(2, 0, size(0))
    out["realloc-large-in-place"] = malloc(0, size(200 * KiB)) + realloc(0, 0, size(300 * KiB)) + \
        realloc(0, 0, size(520 * KiB)) + realloc(0, 0, size(MiB)) + realloc(0, 0, size(MiB + 4 * KiB)) + \
        realloc(0, 0, size(150 * KiB)) + free(0)
    out["realloc-huge"] = malloc(0, size(2 * MiB)) + realloc(0, 0, size(5 * MiB)) + realloc(0, 0, size(MiB + 512 * KiB)) + \
        realloc(0, 0, size(900 * KiB)) + realloc(0, 0, size(3 * MiB)) + realloc(0, 0, size(3 * MiB - 4 * KiB))
    out["aligned"] = b"".join(aligned(a, a, size(1 + a * 37)) for a in range(17)) + \
        b"".join(aligned(17 + a, a, size(100 * KiB + a)) for a in range(17))
    out["aligned-invalid"] = b"".join(aligned(a % 64, a, size(64)) for a in range(17, 24))
    out["aligned-big"] = b"".join(aligned(a, a, size(s)) for a, s in
                                  [(24, 5000), (27, 3000), (28, 10), (29, 300 * KiB), (30, 2 * MiB), (31, 100)])
    out["usable"] = b"".join(malloc(i, size(1 + i * 50)) + usable(i, 1) for i in range(30)) + \
        b"".join(realloc(i, 0, size(2 + i * 80)) for i in range(30))
    out["remote-free"] = b"".join(malloc(i, size(s)) for i, s in
                                  enumerate([8, 100, 1000, 10000, 100000, 500 * KiB, 2 * MiB, 0])) + \
        b"".join(remote_free(i) for i in range(8)) + sync() + \
        b"".join(malloc(i, size(s)) for i, s in enumerate([8, 100, 1000, 10000, 100000, 500 * KiB, 2 * MiB, 0]))
    out["remote-alloc"] = b"".join(remote_alloc(i, i % 3, 4 + i, size(s)) for i, s in
                                   enumerate([8, 100, 1000, 10000, 100000, 500 * KiB, 2 * MiB, 0, 64, 4096])) + \
        free_all(range(10))
    out["remote-realloc"] = b"".join(malloc(i, size(s)) + remote_realloc(i, size(s * 3 + 1)) for i, s in
                                     enumerate([8, 100, 1000, 10000, 100000, 400 * KiB])) + \
        b"".join(realloc(i, 0, size(5)) for i in range(6)) + remote_realloc(6, size(10))
    out["edges"] = malloc(0, size(100)) + malloc(1, size(3 * MiB)) + \
        b"".join(edge(v, v % 2, size(1000)) for v in range(12)) + edge(5 + 16, 1)
    out["burst"] = b"".join(burst(256, m, size(s)) for m, s in
                            [(0, 16), (1, 48), (2, 256), (3, 1000), (4, 4000), (8, 32), (9, 500), (10, 2000),
                             (24, 100), (28, 7000)])
    out["options"] = option(0, 0) + b"".join(malloc(i, size(70 * KiB)) for i in range(8)) + free_all(range(8)) + \
        option(0, 1) + option(1, 1) + b"".join(malloc(i, size(300 * KiB)) for i in range(8)) + free_all(range(8)) + \
        option(2, 1) + malloc(0, size(4 * MiB)) + free(0) + calloc(0, 0, size(4 * MiB)) + option(2, 2) + \
        option(0, 0) + burst(200, 0, size(3000)) + calloc(1, 0, size(3000))
    out["restart"] = b"".join(remote_alloc(i, 0, 4, size(s)) for i, s in enumerate([16, 200, 3000, 40000, 300 * KiB])) + \
        restart() + free_all(range(3)) + restart() + free_all(range(3, 5)) + \
        remote_alloc(5, 0, 4, size(100)) + burst(100, 8 + 4, size(64)) + restart() + malloc(6, size(64)) + free(5)
    out["purge-now-reuse"] = option(0, 0) + b"".join(malloc(i, size(40 * KiB)) for i in range(40)) + \
        free_all(range(40)) + b"".join(calloc(i, 0, size(40 * KiB)) for i in range(40))
    # a few random mixes of every opcode
    rng = random.Random(20240611)
    for n in range(6):
        prog = b""
        for _ in range(120):
            c = rng.randrange(16)
            slot = rng.randrange(16)
            s = sz(rng.choice([0, 1, 5, 5, 9, 11, 13, 15] if n % 2 else [1, 5, 5, 9, 11]), rng.getrandbits(32))
            if c == MALLOC: prog += malloc(slot, s)
            elif c == FREE: prog += free(slot)
            elif c == CALLOC: prog += calloc(slot, rng.randrange(16), s)
            elif c == REALLOC: prog += realloc(slot, rng.randrange(24), s)
            elif c == ALIGNED: prog += aligned(slot, rng.randrange(32), s)
            elif c == USABLE: prog += usable(slot, rng.randrange(2))
            elif c == CHECK: prog += check(slot)
            elif c == REWRITE: prog += rewrite(slot)
            elif c == REMOTE_FREE: prog += remote_free(slot)
            elif c == REMOTE_ALLOC: prog += remote_alloc(slot, rng.randrange(3), rng.randrange(17), s)
            elif c == REMOTE_REALLOC: prog += remote_realloc(slot, s)
            elif c == SYNC: prog += sync()
            elif c == EDGE: prog += edge(rng.randrange(12), slot, s)
            elif c == BURST: prog += burst(rng.randrange(1, 64), rng.randrange(32), s)
            elif c == OPTION: prog += option(rng.randrange(3), rng.randrange(4))
            else: prog += restart() if rng.randrange(4) == 0 else sync()
        out["mix%d" % n] = prog
    # aligned blocks at the large/huge threshold: size + alignment - 16 next
    # to 1 MiB (the secure build's canary once tipped them into huge blocks)
    out["aligned-threshold"] = b"".join(aligned(k % 64, a, size(MiB - (1 << (a - 28 + 19)) + 16 + d)) + free(k % 64)
                                        for k, (a, d) in enumerate((a, d) for a in (28, 29) for d in range(-9, 10)))
    # the learner on, and the statistics taken while the worker frees
    # (option 4, value 0) and with it idle, then reset (value 3)
    out["stats-learn"] = option(3, 1) + option(0, 2) + malloc(0, size(3 * MiB)) + \
        b"".join(malloc(i, size(70 * KiB)) for i in range(1, 9)) + b"".join(remote_free(i) for i in range(1, 9)) + \
        option(4, 0) + burst(200, 3, size(300)) + option(4, 3) + free(0) + malloc(1, size(70 * KiB)) + option(4, 2)
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    for k, (name, data) in enumerate(seeds().items()):
        with open(os.path.join(outdir, "seed-%02d-%s" % (k, name)), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
