#!/usr/bin/env python3
"""Thread churn (10,000 threads, each leaving blocks behind): hakmem's peak
RSS against glibc's (issue 4's target: no higher).  Runs one build of test_thread_churn.c
that is not linked with hakmem, on glibc and with libhakmem.so preloaded,
interleaved, RUNS times each, and compares the medians of the peak RSS each
run reports (VmHWM).  Also checks that each run used the allocator meant:
the program notes on stderr when malloc does not resolve into hakmem.

usage: churn_rss.py [build/tests/thread_churn_plain [build/libhakmem.so]]

Not in make test: the figures move with the machine's load (see
docs/BENCHMARKS.md, thread churn).
"""
import os
import re
import statistics
import subprocess
import sys

RUNS = 5


def run(prog, preload):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    p = subprocess.run([prog], env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit("FAIL: %s (%s) exited %d:\n%s%s" % (prog, "hakmem" if preload else "glibc",
                                                    p.returncode, p.stdout, p.stderr))
    on_hakmem = "not hakmem" not in p.stderr
    if on_hakmem != bool(preload):
        sys.exit("FAIL: the %s run did not use the allocator meant:\n%s"
                 % ("hakmem" if preload else "glibc", p.stderr))
    m = re.search(r"peak_rss_kib=(\d+)", p.stdout)
    if not m:
        sys.exit("FAIL: no peak_rss_kib in the output:\n" + p.stdout)
    return int(m.group(1))


def main():
    if len(sys.argv) > 3:
        sys.exit(__doc__)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    prog = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build/tests/thread_churn_plain")
    lib = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "build/libhakmem.so"))
    glibc, hakmem = [], []
    for _ in range(RUNS):
        glibc.append(run(prog, None))
        hakmem.append(run(prog, lib))
    g, h = statistics.median(glibc), statistics.median(hakmem)
    print("thread churn peak RSS, KiB: glibc %s (median %d), hakmem %s (median %d): %.2fx"
          % (glibc, g, hakmem, h, h / g))
    if h > g:
        print("FAIL: hakmem's peak RSS is above glibc's")
        return 1
    print("churn_rss: hakmem at or below glibc")
    return 0


if __name__ == "__main__":
    sys.exit(main())
