#!/usr/bin/env python3
"""Real programs under each allocator (`make bench-real`): whole-process wall
and CPU time and peak RSS, the allocators interleaved run by run.

Workloads (inputs generated into --work once, the same on every run:
delete the directory after changing a generator; a workload whose program
is missing is skipped with a note):
  python   tests/real/py_workload.py under this interpreter, PYTHONMALLOC=malloc
  gcc      `gcc -O2 -c` of a generated C file of 250 functions with switches
  sqlite3  the sqlite3 shell on tests/real/run_real.py's script, 200k rows
  sort     `LC_ALL=C sort` of 50 MB of generated lines, with its default
           buffer and with `-S 8M` (merging through temporary files)
  cxx      tests/real/cxx_workload.cpp (built with g++ -O2), 5 times in a row

Every run's standard output must be the same as glibc's (a digest is
compared); a run that differs or fails is reported and counted.  The times
and the peak RSS come from GNU time (/usr/bin/time, Debian's `time`; the
peak is the largest process of the tree: cc1 for gcc).  Ratios are
hakmem's median over each peer's.

Examples:
    python3 bench/real.py                       # every workload, every peer
    python3 bench/real.py --only hakmem,glibc,mimalloc --runs 3 --workloads sort,sqlite3
"""

import argparse
import hashlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import allocators  # noqa: E402

ROOT = allocators.ROOT
sys.path.insert(0, os.path.join(ROOT, "tests", "real"))
import run_real  # noqa: E402  (its SQL script)


def gen_c(path):
    rng = random.Random(12345)
    out = ["#include <stddef.h>"]
    for i in range(250):
        fields = " ".join("int f%d; double d%d;" % (k, k) for k in range(rng.randint(2, 6)))
        out.append("struct s%d { %s };" % (i, fields))
    for i in range(250):
        cases = "\n".join(
            "    case %d: acc = acc %s (x * %d + p->f%d); if (acc > %d) acc -= p->d0; break;"
            % (c, rng.choice("+-*^|&"), rng.randint(1, 999), rng.randint(0, 1), rng.randint(100, 100000))
            for c in range(rng.randint(4, 16)))
        call = "f%d((struct s%d *)p, x + 1, n - 1)" % (i - 1, i - 1) if i else "0"
        out.append("static int g%d(int x) { int r = 0; for (int k = 0; k < x %% 17; k++) r += k * %d; return r; }\n"
                   "int f%d(struct s%d *p, int x, int n) {\n  int acc = %d;\n"
                   "  for (int i = 0; i < n; i++) {\n    switch ((x + i) %% 17) {\n%s\n"
                   "    default: acc += g%d(i); break;\n    }\n  }\n"
                   "  if (n > 0 && acc %% 3 == 0) acc += %s;\n  return acc;\n}"
                   % (i, rng.randint(1, 50), i, i, rng.randint(0, 1000), cases, i, call))
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def gen_lines(path, megabytes=50):
    rng = random.Random(20240607)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "
    pool = "".join(rng.choices(alphabet, k=1 << 20))
    with open(path, "w") as f:
        written = 0
        while written < megabytes << 20:
            off = rng.randrange(len(pool) - 64)
            line = "%08x\t%d\t%s\n" % (rng.getrandbits(32), rng.randint(-10**6, 10**6),
                                       pool[off:off + rng.randint(1, 60)])
            f.write(line)
            written += len(line)


def workloads(work):
    """name -> (argv, extra environment), or a string saying why it is skipped."""
    w = {}
    w["python"] = ([sys.executable, os.path.join(ROOT, "tests", "real", "py_workload.py")],
                   {"PYTHONMALLOC": "malloc", "PYTHONHASHSEED": "0"})
    if shutil.which("gcc"):
        src = os.path.join(work, "gen.c")
        if not os.path.exists(src):
            gen_c(src)
        w["gcc"] = (["gcc", "-O2", "-c", src, "-o", os.devnull], {})
    else:
        w["gcc"] = "gcc not found"
    if shutil.which("sqlite3"):
        script = os.path.join(work, "workload.sql")
        with open(script, "w") as f:
            f.write(run_real.SQLITE_SCRIPT.replace("i < 60000", "i < 200000"))
        w["sqlite3"] = (["sqlite3", "-batch", ":memory:", ".read '%s'" % script], {})
    else:
        w["sqlite3"] = "sqlite3 not found (apt install sqlite3)"
    lines = os.path.join(work, "lines.txt")
    if not os.path.exists(lines):
        gen_lines(lines)
    tmp = os.path.join(work, "sorttmp")
    os.makedirs(tmp, exist_ok=True)
    w["sort"] = (["sort", lines], {"LC_ALL": "C"})
    w["sort-8M"] = (["sort", "-t", "\t", "-k2,2n", "-k3", "-S", "8M", "-T", tmp, lines], {"LC_ALL": "C"})
    cxx = os.path.join(work, "cxx_workload")
    if shutil.which("g++"):
        if not os.path.exists(cxx):
            subprocess.run(["g++", "-O2", "-pthread", "-o", cxx,
                            os.path.join(ROOT, "tests", "real", "cxx_workload.cpp")], check=True)
        w["cxx"] = (["sh", "-c", "for i in 1 2 3 4 5; do \"$0\"; done", cxx], {})
    else:
        w["cxx"] = "g++ not found"
    return w


def run_once(argv, env, work):
    """Runs argv under GNU time, its output to a file.  Returns (exit status,
    digest of the output, (wall s, CPU s, peak RSS MiB)).  (wait4 from this
    process would count the Python parent's own RSS: a child keeps the high
    water mark of the memory it was forked from.)"""
    out_path = os.path.join(work, "out.txt")
    time_path = os.path.join(work, "time.txt")
    if os.path.exists(time_path):
        os.unlink(time_path)
    with open(out_path, "wb") as out:
        t0 = time.perf_counter()  # (GNU time's own wall clock has 10 ms steps)
        rc = subprocess.call(["/usr/bin/time", "-f", "%U %S %M", "-o", time_path] + argv, env=env,
                             stdout=out, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
    h = hashlib.sha256()
    with open(out_path, "rb") as out:
        for chunk in iter(lambda: out.read(1 << 20), b""):
            h.update(chunk)
    with open(time_path) as f:
        user, sys_s, rss_kib = f.read().split()[-3:]
    return rc, h.hexdigest(), (wall, float(user) + float(sys_s), int(rss_kib) / 1024.0)


def preloaded(alloc):
    """None if a program started with alloc's environment maps its library
    (or alloc is glibc), else a message: a preload the loader refused would
    measure glibc under another name."""
    if alloc.preload is None:
        return None
    maps = subprocess.run(["cat", "/proc/self/maps"], env=alloc.env(), capture_output=True, text=True).stdout
    name = os.path.basename(os.path.realpath(alloc.preload))
    return None if name in maps else "%s: %s is not mapped under LD_PRELOAD" % (alloc.name, alloc.preload)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7, help="runs per allocator and workload (7)")
    ap.add_argument("--only", help="comma-separated allocators (default: hakmem and the peers)")
    ap.add_argument("--workloads", help="comma-separated workloads (default: all)")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "real_bench"),
                    help="where the generated inputs go (build/real_bench)")
    ap.add_argument("--hakmem", help="path of libhakmem.so (default build/libhakmem.so)")
    args = ap.parse_args()
    if not os.path.exists("/usr/bin/time"):
        sys.exit("GNU time not found (apt install time)")
    names = args.only.split(",") if args.only else None
    allocs, notes = allocators.select_allocators(names, args.hakmem)
    for a in allocs:
        problem = preloaded(a)
        if problem:
            sys.exit(problem)
    os.makedirs(args.work, exist_ok=True)
    loads = workloads(args.work)
    wanted = args.workloads.split(",") if args.workloads else list(loads)
    failures = 0
    print("| workload | allocator | wall s | CPU s | peak RSS MiB | hakmem / it (wall) | hakmem / it (RSS) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in wanted:
        if name not in loads:
            sys.exit("unknown workload '%s' (known: %s)" % (name, ", ".join(loads)))
        if isinstance(loads[name], str):
            notes.append("%s skipped: %s" % (name, loads[name]))
            continue
        argv, extra = loads[name]
        results = {a.name: [] for a in allocs}
        digests = {a.name: [] for a in allocs}
        for r in range(args.runs + 1):  # the first round warms the page cache, not counted
            order = allocs[r % len(allocs):] + allocs[:r % len(allocs)]
            for a in order:
                env = a.env()
                env.update(extra)
                rc, digest, figures = run_once(argv, env, args.work)
                if rc != 0:
                    failures += 1
                    print("FAIL %s under %s: exit status %d" % (name, a.name, rc), file=sys.stderr)
                    continue
                digests[a.name].append(digest)
                if r > 0:
                    results[a.name].append(figures)
        # The reference output: glibc's, else the first allocator's.
        ref_name = "glibc" if digests.get("glibc") else allocs[0].name
        reference = digests[ref_name][0] if digests[ref_name] else None
        for a in allocs if reference is not None else []:
            bad = sum(d != reference for d in digests[a.name])
            if bad:
                failures += 1
                print("FAIL %s under %s: output differs from %s's in %d runs" % (name, a.name, ref_name, bad),
                      file=sys.stderr)
        med = {n: tuple(statistics.median(x[k] for x in v) for k in range(3))
               for n, v in results.items() if v}
        h = med.get("hakmem")
        for a in allocs:
            if a.name not in med:
                continue
            m = med[a.name]
            rw = "%.3f" % (h[0] / m[0]) if h and a.name != "hakmem" else "-"
            rr = "%.3f" % (h[2] / m[2]) if h and a.name != "hakmem" else "-"
            print("| %s | %s | %.3f | %.3f | %.1f | %s | %s |" % (name, a.name, m[0], m[1], m[2], rw, rr),
                  flush=True)
    for n in notes:
        print("note: " + n)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
