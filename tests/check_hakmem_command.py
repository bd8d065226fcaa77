#!/usr/bin/env python3
"""The hakmem command (tools/hakmem, copied into the build directory):

- run: preloads the library (hakmem_probe finds malloc in it and reads
  options with hak_option_get), prepends to LD_PRELOAD, passes --set and
  --stats on, refuses unknown names and invalid values, --secure loads
  libhakmem-secure.so, exit status and signals pass through, and the library
  is found beside the script, through HAKMEM_LIBDIR and in a prefix's lib
  directories;
- config lists every option of the table in src/policy.c (as
  `test_memory --print-options` prints it) and the environment's values;
- stats reads the JSON of a real run;
- prof reads profiles written by prof_synth (PIE and not): the top site's
  function and unsampled bytes, --alloc, --cum, --folded, --all-frames;
- --version agrees with include/hakmem.h; help for every command."""
import argparse
import math
import os
import re
import shutil
import signal
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--hakmem", required=True)
ap.add_argument("--source", required=True)
ap.add_argument("--lib", required=True)
ap.add_argument("--secure-lib", required=True)
ap.add_argument("--probe", required=True)
ap.add_argument("--options", required=True, help="test_memory, which prints the options table")
ap.add_argument("--prof-synth", action="append", required=True)
ap.add_argument("--work", required=True)
a = ap.parse_args()

failures = []


def check(cond, what, detail=""):
    if not cond:
        failures.append(what + ("\n    " + detail.replace("\n", "\n    ") if detail else ""))
    return cond


base_env = {k: v for k, v in os.environ.items() if not k.startswith("HAKMEM_") and k != "LD_PRELOAD"}


def hakmem(*args, env=None, exe=None):
    e = dict(base_env)
    e.update(env or {})
    return subprocess.run([exe or a.hakmem] + list(args), capture_output=True, text=True, env=e)


def probe_out(r):
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line and not line.startswith("option"))


def same_file(a_, b_):
    return a_ is not None and b_ is not None and os.path.realpath(a_) == os.path.realpath(b_)


def malloc_object(r):
    m = re.search(r"^malloc-object (.*)$", r.stdout, re.M)
    return m.group(1) if m else None


os.makedirs(a.work, exist_ok=True)

# ---- help and version ----------------------------------------------------------
for args in (["--help"], ["help"], ["-h"]):
    r = hakmem(*args)
    check(r.returncode == 0 and all(c in r.stdout for c in ("run", "config", "stats", "prof")),
          "hakmem %s lists the commands" % " ".join(args), r.stdout + r.stderr)
for cmd in ("run", "config", "stats", "prof"):
    for args in (["help", cmd], [cmd, "--help"]):
        r = hakmem(*args)
        check(r.returncode == 0 and r.stdout.startswith("usage: hakmem %s" % cmd),
              "hakmem %s: its usage" % " ".join(args), r.stdout + r.stderr)
check("--all-frames" in hakmem("help", "prof").stdout, "prof's help names --all-frames")
check(hakmem("nonsense").returncode != 0, "an unknown command fails")

header = open(os.path.join(a.source, "include", "hakmem.h")).read()
version = "%s.%s" % (re.search(r"#define HAKMEM_VERSION_MAJOR (\d+)", header).group(1),
                     re.search(r"#define HAKMEM_VERSION_MINOR (\d+)", header).group(1))
r = hakmem("--version")
check(r.returncode == 0 and r.stdout.startswith("hakmem %s " % version), "--version: hakmem %s" % version,
      r.stdout + r.stderr)

# ---- run -----------------------------------------------------------------------
r = hakmem("run", "--", a.probe, "--option", "PURGE_DELAY_MS")
out = probe_out(r)
check(r.returncode == 0 and same_file(malloc_object(r), a.lib), "run: malloc is hakmem's", r.stdout + r.stderr)
check(re.search(r"^option PURGE_DELAY_MS=-?\d+$", r.stdout, re.M) is not None,
      "run: hak_option_get is there", r.stdout)
check(same_file(out.get("LD_PRELOAD"), a.lib), "run: LD_PRELOAD is the library", r.stdout)
check(out.get("HAKMEM_LIBDIR") == "(unset)", "run: HAKMEM_LIBDIR not passed on", r.stdout)

# Prepended to what is preloaded already (the probe itself is a valid object to name).
other = os.path.join(a.work, "other_preload.so")
shutil.copy(a.lib, other)
r = hakmem("run", a.probe, env={"LD_PRELOAD": other})
pre = probe_out(r).get("LD_PRELOAD", "").split(":")
check(len(pre) == 2 and same_file(pre[0], a.lib) and pre[1] == other, "run: prepended to LD_PRELOAD",
      r.stdout + r.stderr)
check(same_file(malloc_object(r), a.lib), "run: hakmem's malloc comes first", r.stdout)

# --set, with and without the prefix, names and numbers; the environment's own.
r = hakmem("run", "--set", "PURGE_DELAY_MS=20", "--set=HAKMEM_THP=off", "--set", "purge=1", "--",
           a.probe, "--option", "PURGE_DELAY_MS", "--option", "THP", "--option", "PURGE", "--option", "LEARN",
           env={"HAKMEM_LEARN": "on"})
for want in ("option PURGE_DELAY_MS=20", "option THP=2", "option PURGE=1", "option LEARN=1"):
    check(want in r.stdout.splitlines(), "run --set: %s" % want, r.stdout + r.stderr)
r = hakmem("run", "--set", "VERBOSE=on", "--", a.probe)
check(re.search(r"^hakmem: HAKMEM_VERBOSE=on\t", r.stderr, re.M) is not None, "run --set VERBOSE=on: the listing",
      r.stderr)
check(r.returncode == 0 and "unknown option" not in r.stderr, "run --set VERBOSE=on: no warning", r.stderr)

# Refused before the program runs.
marker = os.path.join(a.work, "ran")
for bad, say in ((["--set", "NO_SUCH_OPTION=1"], "unknown option"),
                 (["--set", "PURGE_DELAY_MS=soon"], "invalid value"),
                 (["--set", "THP=sometimes"], "system, on, off"),
                 (["--set", "PURGE_DELAY_MS"], "NAME=VALUE"),
                 (["--set", "=1"], "NAME=VALUE")):
    if os.path.exists(marker):
        os.unlink(marker)
    r = hakmem("run", *bad, "--", "sh", "-c", "touch " + marker)
    check(r.returncode != 0 and say in r.stderr and not os.path.exists(marker),
          "run %s: refused (%s)" % (" ".join(bad), say), r.stderr)
check("PURGE_DELAY_MS" in hakmem("run", "--set", "NO_SUCH_OPTION=1", "--", "true").stderr,
      "run --set with an unknown name lists the options")
# HAKMEM_PROF in the environment picks the profiling library, as --prof does.
r = hakmem("run", "--", a.probe, env={"HAKMEM_PROF": "file:" + os.path.join(a.work, "env.heap")})
out = probe_out(r)
check(r.returncode == 0 and "hakmem-prof" in os.path.basename(out.get("LD_PRELOAD") or ""),
      "run with HAKMEM_PROF set: the profiling library", r.stdout + r.stderr)
check(hakmem("run").returncode != 0, "run without a program fails")
check(hakmem("run", "--", "/nonexistent/program").returncode == 127, "run: a missing program: 127")

# Exit status and signals are the program's.
check(hakmem("run", "--", a.probe, "--exit", "7").returncode == 7, "run: exit status 7 passes through")
check(hakmem("run", "--", a.probe, "--kill", str(int(signal.SIGTERM))).returncode == -signal.SIGTERM,
      "run: SIGTERM passes through")

# --stats: the report on stderr.
r = hakmem("run", "--stats", "--", a.probe)
check(re.search(r"^hakmem: stats segments=\d+", r.stderr, re.M) is not None, "run --stats: the report", r.stderr)

# --secure: the hardened library.
r = hakmem("run", "--secure", "--", a.probe)
check(same_file(malloc_object(r), a.secure_lib), "run --secure: libhakmem-secure.so", r.stdout + r.stderr)
r = hakmem("config", "--secure")
check(r.returncode == 0 and "secure" in r.stdout.splitlines()[0], "config --secure: a secure build", r.stdout)

# Where the library is found: HAKMEM_LIBDIR, a prefix's lib directories.
tools_copy = os.path.join(a.source, "tools", "hakmem")
r = hakmem("run", "--", a.probe, exe=tools_copy, env={"HAKMEM_LIBDIR": os.path.dirname(a.lib)})
check(same_file(malloc_object(r), a.lib) and probe_out(r).get("HAKMEM_LIBDIR") == "(unset)"
      and "unknown option" not in r.stderr, "run through HAKMEM_LIBDIR", r.stdout + r.stderr)
r = hakmem("run", "--", a.probe, exe=tools_copy, env={"HAKMEM_LIBDIR": os.path.join(a.work, "nothing-here")})
check(r.returncode != 0 and "libhakmem.so not found" in r.stderr, "HAKMEM_LIBDIR without the library: an error",
      r.stderr)
triplet = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_config_var('MULTIARCH') or '')"],
                         capture_output=True, text=True).stdout.strip() or os.uname().machine + "-linux-gnu"
for sub in ("lib", "lib64", os.path.join("lib", triplet)):
    prefix = os.path.join(a.work, "prefix-" + sub.replace("/", "-"))
    shutil.rmtree(prefix, ignore_errors=True)
    os.makedirs(os.path.join(prefix, "bin"))
    os.makedirs(os.path.join(prefix, sub))
    shutil.copy(tools_copy, os.path.join(prefix, "bin", "hakmem"))
    os.symlink(os.path.abspath(a.lib), os.path.join(prefix, sub, "libhakmem.so"))
    r = hakmem("run", "--", a.probe, exe=os.path.join(prefix, "bin", "hakmem"))
    check(probe_out(r).get("LD_PRELOAD") == os.path.join(prefix, sub, "libhakmem.so")
          and same_file(malloc_object(r), a.lib),
          "run from <prefix>/bin finds <prefix>/%s/libhakmem.so" % sub, r.stdout + r.stderr)

# ---- config ----------------------------------------------------------------------
rows = subprocess.run([a.options, "--print-options"], capture_output=True, text=True, check=True).stdout.splitlines()
table = [re.match(r"\| `(HAKMEM_\w+)` \| `([^`]*)` \| ([^|]*) \|", row).groups() for row in rows]
r = hakmem("config", env={"HAKMEM_PURGE_DELAY_MS": "20", "HAKMEM_NO_SUCH_OPTION": "1"})
check(r.returncode == 0 and r.stdout.startswith("hakmem %s" % version), "config: version first", r.stdout + r.stderr)
for name, default, values in table:
    m = re.search(r"^%s = (.*)\n    values: (.*)$" % name, r.stdout, re.M)
    if check(m is not None, "config lists %s" % name, r.stdout):
        check(values.strip() == m.group(2), "config: %s's values" % name, m.group(0))
        if name == "HAKMEM_PURGE_DELAY_MS":
            check(m.group(1) == "20, set by the environment (default %s)" % default, "config: the value in force",
                  m.group(0))
        else:
            check(m.group(1) == "%s (default)" % default, "config: %s's default" % name, m.group(0))
check(len(re.findall(r"^HAKMEM_\w+ = ", r.stdout, re.M)) == len(table), "config: the options, no more")
check("unknown option: HAKMEM_NO_SUCH_OPTION=1" in r.stdout, "config: the environment's unknown variable", r.stdout)
stats_file = os.path.join(a.work, "keep.json")
open(stats_file, "w").write("keep")
r = hakmem("config", env={"HAKMEM_STATS": "json:" + stats_file})
check("HAKMEM_STATS = json:%s, set by the environment" % stats_file in r.stdout, "config: STATS=json:PATH shown",
      r.stdout)
check(open(stats_file).read() == "keep", "config does not write the environment's statistics file")

# ---- stats -----------------------------------------------------------------------
json_path = os.path.join(a.work, "stats.json")
if os.path.exists(json_path):
    os.unlink(json_path)
r = hakmem("run", "--stats-json", json_path, "--", a.probe, "--hold", "50", "3000")
check(r.returncode == 0 and os.path.exists(json_path), "run --stats-json writes the file", r.stdout + r.stderr)
r = hakmem("stats", json_path)
check(r.returncode == 0, "stats: reads the file", r.stdout + r.stderr)
for word in ("OS calls", "reserved", "committed", "peak", "fragmentation", "RSS", "faults", "purge", "learner"):
    check(word in r.stdout, "stats: shows %s" % word, r.stdout)
m = re.search(r"^\s+\d+\s+(\d+)\s+(\d+)\s", "\n".join(l for l in r.stdout.splitlines() if " 3072 " in l), re.M)
check(m is not None and int(m.group(2)) >= 50, "stats: the class of 3000-byte blocks holds the 50 blocks",
      r.stdout)
check(hakmem("stats", os.path.join(a.work, "missing.json")).returncode != 0, "stats: a missing file fails")

# ---- prof ------------------------------------------------------------------------


def estimate(count, size, rate):
    avg = size / count
    scale = 1 / (1 - math.exp(-avg / rate))
    return count * scale, size * scale


for synth in a.prof_synth:
    tag = os.path.basename(synth)
    prof = os.path.join(a.work, tag + ".heap")
    s = subprocess.run([synth, prof], capture_output=True, text=True, env=base_env)
    if not check(s.returncode == 0, "%s ran" % tag, s.stdout + s.stderr):
        continue
    rate = int(re.search(r"^rate (\d+)$", s.stdout, re.M).group(1))
    sites = {m.group(1): [int(x) for x in m.groups()[1:]]
             for m in re.finditer(r"^site (\w+) (\d+) (\d+) (\d+) (\d+)$", s.stdout, re.M)}
    live = {n: estimate(v[0], v[1], rate) for n, v in sites.items() if v[0]}
    alloc = {n: estimate(v[2], v[3], rate) for n, v in sites.items() if v[2]}
    top_live = max(live, key=lambda n: live[n][1])
    top_alloc = max(alloc, key=lambda n: alloc[n][1])
    row = re.compile(r"^\s*(\d+)\s+[\d.]+ \w+\s+([\d.]+)%\s+(\d+)\s+(\S+)(?: \((.*)\))?$")

    r = hakmem("prof", prof)
    rows_ = [row.match(l) for l in r.stdout.splitlines() if row.match(l)]
    if check(r.returncode == 0 and rows_, "%s: prof prints sites" % tag, r.stdout + r.stderr):
        first = rows_[0]
        check(first.group(4) == top_live, "%s: the top site is %s" % (tag, top_live), r.stdout)
        check(int(first.group(1)) == round(live[top_live][1]),
              "%s: its bytes unsampled: %d" % (tag, round(live[top_live][1])), r.stdout)
        check(int(first.group(3)) == round(live[top_live][0]), "%s: its objects unsampled" % tag, r.stdout)
        check(first.group(5) is not None and os.path.basename(first.group(5)).startswith("prof_synth.c:"),
              "%s: its file:line" % tag, r.stdout)
        check({m.group(4) for m in rows_} == set(live), "%s: the sites with live bytes, no others" % tag, r.stdout)
        total = sum(v[1] for v in live.values())
        check(re.search(r"^live: %d bytes .* sampling rate %d bytes" % (round(total), rate), r.stdout, re.M)
              is not None, "%s: the header: %d bytes, rate %d" % (tag, round(total), rate), r.stdout)
    r = hakmem("prof", prof, "--alloc", "--top", "1")
    rows_ = [row.match(l) for l in r.stdout.splitlines() if row.match(l)]
    check(len(rows_) == 1 and rows_[0].group(4) == top_alloc
          and int(rows_[0].group(1)) == round(alloc[top_alloc][1]),
          "%s: --alloc --top 1: %s" % (tag, top_alloc), r.stdout + r.stderr)
    r = hakmem("prof", prof, "--cum")
    rows_ = [row.match(l) for l in r.stdout.splitlines() if row.match(l)]
    check(bool(rows_) and rows_[0].group(4) == "main" and rows_[0].group(2) == "100.0",
          "%s: --cum: main holds everything" % tag, r.stdout + r.stderr)
    r = hakmem("prof", prof, "--folded")
    folded = dict(l.rsplit(" ", 1) for l in r.stdout.splitlines())
    check(folded.get("main;" + top_live) == str(round(live[top_live][1])),
          "%s: --folded: main;%s %d" % (tag, top_live, round(live[top_live][1])), r.stdout + r.stderr)
    r = hakmem("prof", prof, "--folded", "--all-frames")
    check(any(k.endswith(";%s;malloc;hak_test_sampler" % top_live) for k in
              (l.rsplit(" ", 1)[0] for l in r.stdout.splitlines())),
          "%s: --all-frames keeps malloc and the hak_ frame" % tag, r.stdout + r.stderr)

if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("hakmem command: ok")
