#!/usr/bin/env python3
"""The profiler end to end: tests/prof_leak runs under `hakmem run` with
HAKMEM_PROF=file:PATH, and `hakmem prof PATH` must name leaky_function at the
top of its list, with an estimate of the leaked bytes within 20% of what the
program says it leaked, and must not list the functions whose blocks were
all freed.  Run at two sampling rates (the estimate's spread grows as
samples get fewer: about 2.5% and 5% at these rates and this leak of 42 MB,
so 20% is four standard deviations or more).  Then: `hakmem run --prof`
writes hakmem.PID.heap in the working directory, and the release library,
which has no profiler, says so when HAKMEM_PROF is set and writes nothing."""
import os
import re
import subprocess
import sys

hakmem, program, work, release_lib = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
os.makedirs(work, exist_ok=True)
failed = 0


def check(cond, what):
    global failed
    if not cond:
        print("FAIL: " + what)
        failed += 1


for rate in (16384, 65536):
    path = os.path.join(work, "leak-%d.heap" % rate)
    if os.path.exists(path):
        os.remove(path)
    run = subprocess.run([hakmem, "run", "--set", "PROF=file:" + path, "--set", "PROF_RATE=%d" % rate,
                          "--", program], capture_output=True, text=True, timeout=120)
    check(run.returncode == 0, "prof_leak exited %d: %s" % (run.returncode, run.stderr))
    m = re.search(r"leaked (\d+)", run.stdout)
    check(m is not None, "prof_leak did not say what it leaked: %r" % run.stdout)
    if m is None or not os.path.exists(path):
        check(False, "no profile at %s" % path)
        continue
    truth = int(m.group(1))
    prof = subprocess.run([hakmem, "prof", "--top", "5", path], capture_output=True, text=True, timeout=120)
    check(prof.returncode == 0, "hakmem prof exited %d: %s" % (prof.returncode, prof.stderr))
    rows = [l for l in prof.stdout.splitlines() if re.match(r"\s*\d+\s+\S+ \S+\s+[\d.]+%", l)]
    print("rate %d: truth %d bytes; hakmem prof says:\n  %s" % (rate, truth, "\n  ".join(rows[:3])))
    check(len(rows) > 0, "no allocation site listed:\n" + prof.stdout)
    if not rows:
        continue
    top = rows[0]
    check("leaky_function" in top, "the top site is not leaky_function: " + top)
    estimate = int(top.split()[0])
    check(0.8 * truth <= estimate <= 1.2 * truth,
          "estimate %d is not within 20%% of %d (%.1f%%)" % (estimate, truth, 100.0 * (estimate - truth) / truth))
    check("churn_function" not in prof.stdout, "churn_function's freed blocks are listed live")
    check("keeper_function" not in prof.stdout, "keeper_function's freed blocks are listed live")

for f in os.listdir(work):
    if f.endswith(".heap"):
        os.remove(os.path.join(work, f))
run = subprocess.run([hakmem, "run", "--prof", "--", program], cwd=work, capture_output=True, text=True, timeout=120)
written = [f for f in os.listdir(work) if re.match(r"hakmem\.\d+\.heap$", f)]
check(run.returncode == 0 and len(written) == 1, "hakmem run --prof: exit %d, profiles %s" % (run.returncode, written))
for f in written:
    os.remove(os.path.join(work, f))

env = dict(os.environ, LD_PRELOAD=release_lib, HAKMEM_PROF="on")
run = subprocess.run([program], cwd=work, env=env, capture_output=True, text=True, timeout=120)
check(run.returncode == 0, "prof_leak on the release library exited %d" % run.returncode)
check("HAKMEM_PROF needs the profiling library" in run.stderr, "no word from the release library: %r" % run.stderr)
check(not any(f.endswith(".heap") for f in os.listdir(work)), "the release library wrote a profile")

print("prof leak: %s" % ("FAIL" if failed else "ok"))
sys.exit(1 if failed else 0)
