#!/usr/bin/env python3
"""Runs a real program with and without LD_PRELOAD=libhakmem.so: its stdout
must be byte-identical and both runs must succeed; a third run with
HAKMEM_STATS=1 must print hakmem's statistics line on stderr with pages>0
(proof that hakmem served the program), and the run without HAKMEM_STATS
must not print it.

Usage: run_real.py --lib LIBHAKMEM --work DIR CASE [ARGS]
  python SCRIPT      the interpreter running this driver, PYTHONMALLOC=malloc
  sort               GNU sort (LC_ALL=C) on a generated multi-megabyte file
  cxx BINARY         a C++ program built without hakmem
"""
import argparse
import hashlib
import os
import random
import re
import subprocess
import sys

TIMEOUT = 150


def generate_sort_input(path):
    """About 12 MB of lines, the same on every run."""
    rng = random.Random(20240607)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "
    pool = "".join(rng.choices(alphabet, k=1 << 20))
    lines = []
    for _ in range(250000):
        off = rng.randrange(len(pool) - 64)
        word = pool[off:off + rng.randint(1, 60)]
        lines.append("%08x\t%d\t%s\n" % (rng.getrandbits(32), rng.randint(-10**6, 10**6), word))
    with open(path, "w", encoding="ascii") as f:
        f.write("".join(lines))


def run(cmd, env, label):
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        print("FAIL: %s: timed out after %d s" % (label, TIMEOUT))
        return None
    if p.returncode != 0:
        print("FAIL: %s: exit status %d" % (label, p.returncode))
        sys.stdout.write(p.stderr.decode(errors="replace")[-4000:])
        return None
    return p


def check_program(name, cmds, base_env, lib):
    failures = 0
    plain_env = dict(base_env)
    plain_env.pop("LD_PRELOAD", None)
    plain_env.pop("HAKMEM_STATS", None)
    pre_env = dict(plain_env, LD_PRELOAD=lib)
    stats_env = dict(pre_env, HAKMEM_STATS="1")
    for i, cmd in enumerate(cmds):
        tag = "%s[%d] %s" % (name, i, " ".join(os.path.basename(c) if j == 0 else c
                                                 for j, c in enumerate(cmd)))
        base = run(cmd, plain_env, tag + " without hakmem")
        pre = run(cmd, pre_env, tag + " with LD_PRELOAD")
        stats = run(cmd, stats_env, tag + " with LD_PRELOAD and HAKMEM_STATS=1")
        if base is None or pre is None or stats is None:
            failures += 1
            continue
        digest = hashlib.sha256(base.stdout).hexdigest()[:16]
        print("%s: %d bytes of output, sha256 %s" % (tag, len(base.stdout), digest))
        if len(base.stdout) == 0:
            print("FAIL: %s: no output" % tag)
            failures += 1
        for label, p in (("LD_PRELOAD", pre), ("LD_PRELOAD + HAKMEM_STATS", stats)):
            if p.stdout != base.stdout:
                failures += 1
                a, b = base.stdout, p.stdout
                k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
                print("FAIL: %s: stdout with %s differs (%d vs %d bytes, first difference at %d)"
                      % (tag, label, len(a), len(b), k))
                print("  without: %r" % a[max(0, k - 60):k + 60])
                print("  with:    %r" % b[max(0, k - 60):k + 60])
        if b"hakmem: stats" in pre.stderr:
            print("FAIL: %s: statistics printed without HAKMEM_STATS" % tag)
            failures += 1
        lines = [l for l in stats.stderr.decode(errors="replace").splitlines()
                 if l.startswith("hakmem: stats ")]
        if len(lines) != 1:
            print("FAIL: %s: expected one 'hakmem: stats' line on stderr with HAKMEM_STATS=1, got %d"
                  % (tag, len(lines)))
            sys.stdout.write(stats.stderr.decode(errors="replace")[-2000:])
            failures += 1
            continue
        kv = dict(re.findall(r"(\w+)=(\S+)", lines[0]))
        print("  " + lines[0])
        try:
            pages = int(kv.get("pages", "-1"))
        except ValueError:
            pages = -1
        if pages <= 0:
            print("FAIL: %s: stats line shows pages=%s, want > 0" % (tag, kv.get("pages")))
            failures += 1
        if "segments" not in kv:
            print("FAIL: %s: stats line has no segments=" % tag)
            failures += 1
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("case", choices=["python", "sort", "cxx"])
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    lib = os.path.abspath(a.lib)
    if not os.path.exists(lib):
        print("FAIL: %s does not exist" % lib)
        return 1
    os.makedirs(a.work, exist_ok=True)
    env = dict(os.environ, LC_ALL="C")

    if a.case == "python":
        env.update(PYTHONMALLOC="malloc", PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
        cmds = [[sys.executable, "-I", a.args[0]]]
    elif a.case == "sort":
        data = os.path.join(a.work, "sort_input.txt")
        generate_sort_input(data)
        tmp = os.path.join(a.work, "sort_tmp")
        os.makedirs(tmp, exist_ok=True)
        cmds = [
            ["sort", data],
            ["sort", "-t", "\t", "-k2,2n", "-k3", data],
            # Small buffer and several threads: temporary files, merges.
            ["sort", "--parallel=4", "-S", "1M", "-T", tmp, "-k3", "-s", data],
        ]
    else:
        cmds = [[os.path.abspath(a.args[0])]]

    failures = check_program(a.case, cmds, env, lib)
    if failures:
        print("real_%s: %d failure(s)" % (a.case, failures))
        return 1
    print("real_%s: ok" % a.case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
