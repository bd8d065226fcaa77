#!/usr/bin/env python3
"""Side-by-side benchmark of hakmem and its peers (`make bench`, `make bench-quick`).

The same benchmark binaries (bench/*.c; plain libc) run under each allocator
via LD_PRELOAD, interleaved:

    for run in 1..N:  for config:  for allocator:  run once

so slow drifts of the machine hit every allocator alike (the allocator order
is also rotated from one run to the next).  Every run is checked: the
benchmark reports which allocator it found mapped and which object its
`malloc` resolves to, and a mismatch aborts the whole comparison.

Each run is time-bounded: the benchmark repeats its operation for --seconds
(default 1.0; 0.5 with --quick), reading the clock every few thousand
operations, and reports how many it did.  Every allocator thus gets the same
timed window, even where they differ a hundredfold (big blocks, realloc), and
the time a comparison takes is known in advance.  --ops N runs a fixed
number of operations instead.

Per run it records the benchmark's own throughput (Mops/s over the timed
loop only) and, from wait4(), wall/user/sys time, peak RSS (the benchmark's
VmHWM) and page faults of the child.  Per (config, allocator) cell it reports
median, mean, min, max and coefficient of variation, and the ratio of
medians to mimalloc.  Then, unless --no-syscalls, one more run per cell
under `strace -f -c` counts mmap/munmap/madvise/mremap/brk (and mprotect),
with one zero-operation run whose counts are subtracted (start-up and exit).

Output in bench/results/: compare-<stamp>.csv (one row per run),
compare-<stamp>.json (settings, runs, per-cell statistics, syscalls),
compare-<stamp>.md (the report, also printed), syscalls-<stamp>.csv, PNG
charts compare-<stamp>-throughput.png (ratio to mimalloc) and
compare-<stamp>-rss.png (peak RSS), and latest.* copies.  Charts need
matplotlib, which is installed for this python3 if missing (pip --user, or
apt for Debian's own python3); without it the tables are still written.
A full run (not --quick) covering every config and allocator without failure
also updates the "Latest results" section of bench/README.md and
bench/latest/ (--no-publish to skip, --publish to force).

Examples:
    python3 bench/compare.py                      # 10 runs of 1 s, everything
    python3 bench/compare.py --quick              # 3 runs of 0.5 s
    python3 bench/compare.py --quick --configs mixed,larson-2t --only hakmem,mimalloc
    python3 bench/compare.py --runs 5 --ops 5e6   # fixed work instead of fixed time
Environment: HAKMEM_BENCH_RUNS (default run count), HAKMEM_LIB (hakmem .so),
HAKMEM_BENCH_NO_INSTALL=1 (never install matplotlib).
"""

import argparse
import atexit
import csv
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import allocators as A  # noqa: E402


def realloc_calls(start, maxsize):
    """Calls per realloc_growth cycle: malloc + the 1.5x reallocs + free."""
    steps, s = 0, start
    while s < maxsize:
        s = min(s + s // 2, maxsize)
        steps += 1
    return steps + 2


class Config:
    """One benchmark configuration.

    `threads` is the number of threads doing allocation work.  In --ops mode
    the total operation count is turned into the program's --iters:
    ops // (units * ops_per_iter), where `units` is what --iters counts per
    (threads for random_mixed and larson, producer/consumer pairs for
    xthread, 1 otherwise)."""

    def __init__(self, name, program, args, threads=1, ops_per_iter=1, units=None,
                 thread_flag=False, what=""):
        self.name = name
        self.program = program
        self.args = list(args)
        self.threads = threads
        self.ops_per_iter = ops_per_iter
        self.units = units or (threads if thread_flag else 1)
        self.thread_flag = thread_flag
        self.what = what

    def base_argv(self, bench_dir):
        cmd = [os.path.join(bench_dir, self.program)] + self.args
        if self.thread_flag:
            cmd += ["--threads", str(self.threads)]
        return cmd

    def iters_for(self, ops):
        return max(0, int(ops) // (self.units * self.ops_per_iter))

    def argv(self, bench_dir, seconds=None, ops=None):
        """Command for one run: for `seconds` (time-bounded) or `ops` operations."""
        cmd = self.base_argv(bench_dir)
        if ops is not None:
            return cmd + ["--iters", str(self.iters_for(ops))]
        return cmd + ["--seconds", "%g" % seconds]

    def zero_argv(self, bench_dir):
        return self.base_argv(bench_dir) + ["--iters", "0"]

    def shown(self):
        return " ".join([self.program] + self.args
                        + (["--threads", str(self.threads)] if self.thread_flag else []))


def _rm(name, preset, threads=1, what=""):
    return Config(name, "random_mixed", ["--preset", preset], threads=threads, thread_flag=True,
                  what=what)


CONFIGS = [
    _rm("mixed", "mixed", what="random_mixed 16-1024 B, ws=400 (the headline)"),
    _rm("mixed-8k", "mixed-8k", what="16-1024 B, ws=8192"),
    _rm("c6-heavy", "c6-heavy", what="257-768 B"),
    _rm("c7-only", "c7-only", what="1024 B only"),
    _rm("tiny", "tiny", what="16-64 B"),
    _rm("mixed-2t", "mixed", threads=2, what="mixed, 2 threads"),
    _rm("mixed-8k-2t", "mixed-8k", threads=2, what="mixed-8k, 2 threads"),
    _rm("mid_large", "mid_large", what="mid_large_mt: 1-64 KiB, ws=400, 1 thread"),
    _rm("mid_large-2t", "mid_large", threads=2, what="mid_large_mt, 2 threads"),
    _rm("mid_large-8t", "mid_large", threads=8, what="mid_large_mt, 8 threads (oversubscribed)"),
    Config("string_builder", "string_builder", [], ops_per_iter=8,
           what="malloc 8/16/32/64 B, fill, free the four"),
    Config("larson-1t", "larson", [], threads=1, ops_per_iter=2, thread_flag=True,
           what="server simulation, 8-1000 B, 5000 blocks/thread, 1 chain"),
    Config("larson-2t", "larson", [], threads=2, ops_per_iter=2, thread_flag=True,
           what="larson, 2 chains"),
    Config("larson-8t", "larson", [], threads=8, ops_per_iter=2, thread_flag=True,
           what="larson, 8 chains (oversubscribed)"),
    Config("xthread", "xthread", ["--pairs", "1"], threads=2, ops_per_iter=2, units=1,
           what="producer/consumer, every free remote, 16-1024 B"),
    Config("xthread-8t", "xthread", ["--pairs", "4"], threads=8, ops_per_iter=2, units=4,
           what="xthread, 4 pairs (8 threads, oversubscribed)"),
    Config("realloc-1m", "realloc_growth", ["--max", "1M"],
           ops_per_iter=realloc_calls(16, 1 << 20), what="realloc x1.5 from 16 B to 1 MiB"),
    Config("realloc-64k", "realloc_growth", ["--max", "64k"],
           ops_per_iter=realloc_calls(16, 64 << 10), what="realloc x1.5 from 16 B to 64 KiB"),
    Config("big", "big", ["--mode", "mixed"],
           what="64 KiB-16 MiB blocks (log-uniform), ws=8, every page touched"),
    Config("big-8m", "big", ["--mode", "fixed", "--size", "8M"], ops_per_iter=2,
           what="malloc, touch every page, free one 8 MiB block"),
]

SYSCALLS = ["mmap", "munmap", "madvise", "mremap", "brk", "mprotect"]
ROW_FIELDS = ["stamp", "run", "config", "allocator", "threads", "ops", "mops", "bench_seconds",
              "wall_seconds", "user_seconds", "sys_seconds", "peak_rss_kib", "ru_maxrss_kib",
              "minflt", "majflt", "nvcsw", "nivcsw", "status"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run_once(cmd, env, timeout):
    """Runs cmd; returns (returncode, stdout, stderr, wall seconds, rusage)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        try:
            _, status, ru = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (proc.returncode, out.read().decode(errors="replace"),
                err.read().decode(errors="replace"), wall, ru)


def describe_failure(rc, stderr, timeout):
    if rc < 0:
        what = "killed by signal %d" % -rc
        if rc == -9:
            what += " (timeout %ss?)" % timeout
    else:
        what = "exit status %d" % rc
    tail = " | ".join(stderr.strip().splitlines()[-3:])
    return what + ((": " + tail) if tail else "")


def csv_list(s):
    return [x.strip() for x in s.split(",") if x.strip()] if s else None


def machine_info():
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info["cpus"] = os.cpu_count()
    info["kernel"] = platform.release()
    info["python"] = platform.python_version()
    try:
        info["loadavg"] = " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        pass
    try:
        rev = subprocess.run(["git", "-C", A.ROOT, "rev-parse", "--short", "HEAD"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        info["git"] = rev.stdout.strip() or "(no commit)"
        dirty = subprocess.run(["git", "-C", A.ROOT, "status", "--porcelain", "--", "src", "include"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if dirty.stdout.strip():
            info["git"] += " (src/include modified)"
    except OSError:
        info["git"] = "?"
    pkgs = []
    for pkg in ("libc6", "libmimalloc2.0", "libjemalloc2", "libtcmalloc-minimal4", "libtbbmalloc2"):
        try:
            r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            if r.returncode == 0 and r.stdout.strip():
                pkgs.append("%s %s" % (pkg, r.stdout.strip()))
        except OSError:
            break
    info["packages"] = ", ".join(pkgs)
    return info


def loadavg():
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except (OSError, ValueError):
        return None


def stats(values):
    if not values:
        return None
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {
        "n": len(values),
        "median": statistics.median(values),
        "mean": mean,
        "min": min(values),
        "max": max(values),
        "cv": (100.0 * sd / mean) if mean else 0.0,
    }


def fmt(v, digits=1):
    return "-" if v is None else ("%.*f" % (digits, v))


def tp(v):
    """A throughput in Mops/s, with about three significant digits."""
    if v is None:
        return "-"
    a = abs(v)
    if a >= 100:
        return "%.0f" % v
    if a >= 10:
        return "%.1f" % v
    if a >= 1:
        return "%.2f" % v
    if a == 0:
        return "0"
    return "%.3g" % v


def hms(seconds):
    seconds = int(round(seconds))
    return "%d:%02d" % (seconds // 60, seconds % 60)


# ---------------------------------------------------------------- strace

def strace_base():
    """The strace command prefix: with --seccomp-bpf when this strace and
    kernel support it (only the traced calls stop the tracee, so
    futex-heavy benchmarks are not slowed down), else without."""
    base = ["strace", "-f", "-c"]
    try:
        r = subprocess.run(["strace", "-f", "-c", "--seccomp-bpf", "-e", "trace=brk", "-o",
                            os.devnull, "true"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, timeout=30)
        if r.returncode == 0 and "seccomp" not in r.stderr:
            base.append("--seccomp-bpf")
    except (OSError, subprocess.TimeoutExpired):
        pass
    return base


def parse_strace(path):
    counts = {}
    try:
        with open(path) as f:
            for line in f:
                tok = line.split()
                if len(tok) < 5 or tok[-1] == "total" or tok[-1] == "syscall":
                    continue
                try:
                    float(tok[0])
                    counts[tok[-1]] = int(tok[3])
                except ValueError:
                    continue
    except OSError:
        pass
    return counts


def strace_run(prefix, what, program, alloc, cmd, timeout, syscalls=SYSCALLS):
    """One run of cmd (a run of `program`) under strace counting `syscalls`:
    (counts, benchmark fields, wall seconds), or (None, failure message, None).
    Also used by bench/memory.py."""
    fd, path = tempfile.mkstemp(prefix="hakmem-strace-")
    os.close(fd)
    try:
        full = prefix + ["-o", path, "-e", "trace=" + ",".join(syscalls)]
        if alloc.preload:
            full += ["-E", "LD_PRELOAD=" + alloc.preload]
        full += ["--"] + cmd
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)  # for the tracee only, via -E: strace runs on glibc
        rc, out, err, wall, _ = run_once(full, env, timeout)
        if rc != 0:
            return None, describe_failure(rc, err, timeout), None
        fields = A.parse_line(out, program)
        problem = alloc.check(fields or {})
        if problem:
            sys.exit("FATAL (%s under strace): %s" % (what, problem))
        return parse_strace(path), fields, wall
    finally:
        os.unlink(path)


# ---------------------------------------------------------------- charts

def matplotlib_pyplot(allow_install):
    """matplotlib.pyplot for this interpreter, installing matplotlib if it
    is missing (and allowed).  Returns (pyplot or None, message or None)."""
    def load():
        import warnings
        # A pip matplotlib beside Debian's own one warns about Axes3D; no matter here.
        warnings.filterwarnings("ignore", message=".*Axes3D.*")
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    try:
        return load(), None
    except Exception as e:  # ImportError, or a broken install
        first_error = e
    exe = sys.executable or "python3"
    hint = ("install it with `%s -m pip install --user matplotlib` (or `apt-get install "
            "python3-matplotlib` for Debian's own python3)" % exe)
    if not allow_install:
        return None, "matplotlib is not importable by %s (%s); %s" % (exe, first_error, hint)
    in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    debian_python = os.path.realpath(exe).startswith("/usr/bin/")
    attempts = []
    if debian_python and os.geteuid() == 0 and shutil.which("apt-get"):
        attempts.append(["apt-get", "install", "-y", "-qq", "python3-matplotlib"])
    pip = [exe, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    attempts.append(pip + ([] if in_venv else ["--user"]) + ["matplotlib"])
    errors = []
    for cmd in attempts:
        log("charts: matplotlib is missing for %s; running: %s" % (exe, " ".join(cmd)))
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            errors.append("%s: %s" % (cmd[0], e))
            continue
        if r.returncode != 0:
            tail = " | ".join(r.stdout.strip().splitlines()[-2:])
            errors.append("%s exited %d: %s" % (" ".join(cmd[:4]), r.returncode, tail))
            continue
        # A user site directory created just now is not on sys.path yet.
        try:
            import importlib
            import site
            user_site = site.getusersitepackages()
            if os.path.isdir(user_site) and user_site not in sys.path:
                site.addsitedir(user_site)
            importlib.invalidate_caches()
            return load(), "installed matplotlib for %s" % exe
        except Exception as e:
            errors.append("installed, but import still fails: %s" % e)
    return None, ("could not install matplotlib for %s (%s); %s"
                  % (exe, "; ".join(errors) or first_error, hint))


def grouped_bars(plt, configs, allocs, values, ylabel, title, path, log_scale=True,
                 hline=None):
    """One group of bars per config, one bar per allocator; None values are skipped."""
    n = max(1, len(allocs))
    width = 0.84 / n
    fig, ax = plt.subplots(figsize=(min(16, max(7, 0.14 * len(configs) * (n + 1.5))), 5.6))
    colors = {"hakmem": "#d62728", "glibc": "#7f7f7f", "mimalloc": "#1f77b4",
              "jemalloc": "#2ca02c", "tcmalloc": "#ff7f0e", "tbbmalloc": "#9467bd"}
    for i, a in enumerate(allocs):
        xs, ys = [], []
        for j, cfg in enumerate(configs):
            v = values.get((cfg.name, a.name))
            if v is not None and v > 0:
                xs.append(j - 0.42 + width * (i + 0.5))
                ys.append(v)
        ax.bar(xs, ys, width, label=a.name, color=colors.get(a.name))
    if hline is not None:
        ax.axhline(hline, color="black", linewidth=0.8, linestyle="--")
    if log_scale:
        import matplotlib.ticker as ticker
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: "%g" % v))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels([c.name for c in configs], rotation=35, ha="right")
    ax.set_xlim(-0.6, len(configs) - 0.4)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize="medium")
    ax.grid(axis="y", which="major", alpha=0.3)
    ax.legend(fontsize="small", ncol=min(6, n), loc="upper center",
              bbox_to_anchor=(0.5, -0.28), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def charts(plt, configs, allocs, cell, ref_name, base, runs):
    """Writes base-throughput.png and base-rss.png; returns their paths."""
    ratio, rss = {}, {}
    for cfg in configs:
        ref = cell.get((cfg.name, ref_name), {}).get("mops")
        for a in allocs:
            c = cell[(cfg.name, a.name)]
            if c["mops"] and ref and ref["median"]:
                ratio[(cfg.name, a.name)] = c["mops"]["median"] / ref["median"]
            if c["rss"]:
                rss[(cfg.name, a.name)] = c["rss"]["median"]
    paths = []
    p = base + "-throughput.png"
    grouped_bars(plt, configs, allocs, ratio, "throughput / %s (median, log scale)" % ref_name,
                 "Throughput relative to %s (higher is better; %d runs per bar)"
                 % (ref_name, runs), p, hline=1.0)
    paths.append(p)
    p = base + "-rss.png"
    grouped_bars(plt, configs, allocs, rss, "peak RSS, MiB (median, log scale)",
                 "Peak resident memory (VmHWM; lower is better)", p)
    paths.append(p)
    return paths


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="configs: " + ", ".join(c.name for c in CONFIGS)
                                 + "\nallocators: " + ", ".join(a.name for a in A.all_allocators()))
    ap.add_argument("--runs", type=int, default=int(os.environ.get("HAKMEM_BENCH_RUNS", "10")),
                    help="runs per cell (default 10, or $HAKMEM_BENCH_RUNS)")
    ap.add_argument("--quick", action="store_true",
                    help="3 runs per cell of 0.5 s each (make bench-quick)")
    ap.add_argument("--only", help="comma-separated allocators (default: all available)")
    ap.add_argument("--configs", help="comma-separated configs (default: all)")
    ap.add_argument("--seconds", type=float,
                    help="timed seconds per run (default 1.0; 0.5 with --quick)")
    ap.add_argument("--ops", type=float,
                    help="fixed work instead: total operations per run for every config (e.g. 5e6)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply the duration (or --ops) of every run")
    ap.add_argument("--warmup", type=int, default=0,
                    help="unrecorded rounds before the measured runs (default 0)")
    ap.add_argument("--syscalls", dest="syscalls", action="store_true", default=True,
                    help="one extra run per cell under strace -f -c (the default)")
    ap.add_argument("--no-syscalls", dest="syscalls", action="store_false",
                    help="skip the strace runs")
    ap.add_argument("--no-charts", action="store_true", help="do not draw PNG charts")
    ap.add_argument("--no-install", action="store_true",
                    help="do not install matplotlib when it is missing")
    ap.add_argument("--publish", dest="publish", action="store_true", default=None,
                    help="update bench/README.md's latest results and bench/latest/ "
                    "(default: a run without --quick of every config and allocator, no failure)")
    ap.add_argument("--no-publish", dest="publish", action="store_false")
    A.add_run_args(ap, timeout=300, snapshot=True)
    ap.add_argument("--list", action="store_true", help="list configs and allocators, then exit")
    args = ap.parse_args()

    if args.list:
        for c in CONFIGS:
            print("config    %-15s %-50s %s" % (c.name, c.shown(), c.what))
        for a in A.all_allocators(args.hakmem):
            print("allocator %-10s %s%s" % (a.name, a.preload or "(no preload)",
                                           "" if a.available() else "  [missing]"))
        return 0

    runs = 3 if args.quick else args.runs
    if runs < 1:
        sys.exit("--runs must be at least 1")
    seconds = (args.seconds if args.seconds else (0.5 if args.quick else 1.0)) * args.scale
    fixed_ops = args.ops * args.scale if args.ops else None
    if fixed_ops is None and seconds <= 0:
        sys.exit("--seconds must be positive")
    want = csv_list(args.configs)
    by_name = {c.name: c for c in CONFIGS}
    if want:
        for n in want:
            if n not in by_name:
                sys.exit("unknown config '%s' (known: %s)" % (n, ", ".join(by_name)))
        configs = [by_name[n] for n in want]
    else:
        configs = list(CONFIGS)
    allocs, notes = A.select_allocators(csv_list(args.only), args.hakmem)
    for n in notes:
        log("note: " + n)
    if not allocs:
        sys.exit("no allocator to run")
    strace_prefix = None
    if args.syscalls:
        if shutil.which("strace"):
            strace_prefix = strace_base()
        else:
            msg = "syscall counts skipped: strace not found (bash scripts/install-deps.sh bench)"
            log("note: " + msg)
            notes = notes + [msg]
    bench_dir = A.find_benchmarks(args.bench_dir, log)
    shown_bench_dir = bench_dir
    if not args.no_snapshot:
        snap, bench_dir = A.snapshot(bench_dir, allocs, log)
        atexit.register(shutil.rmtree, snap, True)

    plt = None
    if not args.no_charts:
        plt, msg = matplotlib_pyplot(not args.no_install
                                     and not os.environ.get("HAKMEM_BENCH_NO_INSTALL"))
        if msg:
            log(("note: " if plt else "warning: charts will be skipped: ") + msg)
            if not plt:
                notes = notes + ["charts skipped: " + msg]

    def argv(cfg):
        return cfg.argv(bench_dir, seconds=seconds, ops=fixed_ops)

    info = machine_info()
    la = loadavg()
    if la and os.cpu_count() and la[0] > 0.5 * os.cpu_count():
        warn = ("machine busy: 1-minute load average %.2f on %d CPUs at start; expect "
                "noisy results (high CV)" % (la[0], os.cpu_count()))
        log("warning: " + warn)
        notes = notes + [warn]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, "compare-%s" % stamp)
    csv_path = base + ".csv"

    mode = ("fixed work, %g operations per run" % fixed_ops if fixed_ops
            else "%g s per run" % seconds)
    ncells = len(configs) * len(allocs)
    log("hakmem compare: %d run(s) x %d config(s) x %d allocator(s) [%s], %s%s; binaries in %s"
        % (runs, len(configs), len(allocs), ", ".join(a.name for a in allocs), mode,
           ", + strace pass" if strace_prefix else "", bench_dir))

    results = {}   # (config, allocator) -> list of row dicts (successful runs)
    failures = {}  # (config, allocator) -> list of messages
    all_rows = []
    t_start = time.time()
    done_runs = 0
    total_runs = (args.warmup + runs) * ncells
    # The strace pass costs about one more round, plus short zero-op runs.
    planned = total_runs + (ncells * 1.15 if strace_prefix else 0)
    with open(csv_path, "w", newline="") as fcsv:
        writer = csv.DictWriter(fcsv, fieldnames=ROW_FIELDS)
        writer.writeheader()
        total_rounds = args.warmup + runs
        for rnd in range(total_rounds):
            warm = rnd < args.warmup
            run_no = rnd - args.warmup + 1
            k = rnd % len(allocs)
            order = allocs[k:] + allocs[:k]
            for cfg in configs:
                parts = []
                for alloc in order:
                    cmd = argv(cfg)
                    rc, out, err, wall, ru = run_once(cmd, alloc.env(), args.timeout)
                    done_runs += 1
                    key = (cfg.name, alloc.name)
                    if rc != 0:
                        msg = describe_failure(rc, err, args.timeout)
                        parts.append("%s FAILED" % alloc.name)
                        log("  %s/%s run %d FAILED: %s" % (cfg.name, alloc.name, run_no, msg))
                        if not warm:
                            failures.setdefault(key, []).append(msg)
                            row = {"stamp": stamp, "run": run_no, "config": cfg.name,
                                   "allocator": alloc.name, "threads": cfg.threads,
                                   "status": msg}
                            writer.writerow(row)
                            all_rows.append(row)
                        continue
                    f = A.parse_line(out, cfg.program)
                    if f is None or "mops" not in f:
                        msg = "printed no result line: %s" % " | ".join(
                            (out + err).strip().splitlines()[-3:])
                        parts.append("%s FAILED" % alloc.name)
                        log("  %s/%s run %d FAILED: %s" % (cfg.name, alloc.name, run_no, msg))
                        if not warm:
                            failures.setdefault(key, []).append(msg)
                        continue
                    problem = alloc.check(f)
                    if problem:
                        sys.exit("FATAL (%s): %s" % (cfg.name, problem))
                    row = {
                        "stamp": stamp, "run": run_no, "config": cfg.name,
                        "allocator": alloc.name, "threads": cfg.threads,
                        "ops": int(f.get("ops", 0)),
                        "mops": float(f["mops"]), "bench_seconds": float(f.get("seconds", 0)),
                        "wall_seconds": round(wall, 6), "user_seconds": round(ru.ru_utime, 6),
                        "sys_seconds": round(ru.ru_stime, 6),
                        # VmHWM reported by the benchmark itself; wait4's ru_maxrss
                        # also counts the forked Python before exec.
                        "peak_rss_kib": int(f.get("peak_rss_kib", 0)) or ru.ru_maxrss,
                        "ru_maxrss_kib": ru.ru_maxrss,
                        "minflt": ru.ru_minflt, "majflt": ru.ru_majflt,
                        "nvcsw": ru.ru_nvcsw, "nivcsw": ru.ru_nivcsw, "status": "ok",
                    }
                    parts.append("%s %s" % (alloc.name, tp(row["mops"])))
                    if not warm:
                        results.setdefault(key, []).append(row)
                        writer.writerow(row)
                        all_rows.append(row)
                fcsv.flush()
                tag = "warmup %d/%d" % (rnd + 1, args.warmup) if warm else "run %d/%d" % (run_no, runs)
                el = time.time() - t_start
                eta = el / done_runs * (planned - done_runs) if done_runs else 0
                log("[%s] %-14s %s  (Mops/s)  [%s elapsed, ~%s left]"
                    % (tag, cfg.name, "  ".join(parts), hms(el), hms(eta)))

    sys_rows = []
    if strace_prefix:
        log("syscall counts under %s (one run per cell, plus a zero-operation baseline)"
            % " ".join(strace_prefix))
        for cfg in configs:
            for alloc in allocs:
                full = strace_run(strace_prefix, cfg.name, cfg.program, alloc, argv(cfg),
                                  args.timeout)
                basel = strace_run(strace_prefix, cfg.name, cfg.program, alloc,
                                   cfg.zero_argv(bench_dir), args.timeout)
                for r in (full, basel):
                    if r[0] is None:
                        log("  strace %s/%s failed: %s" % (cfg.name, alloc.name, r[1]))
                if full[0] is None or basel[0] is None:
                    sys_rows.append({"config": cfg.name, "allocator": alloc.name,
                                     "ops": None, "total": None, "startup": None})
                    failures.setdefault((cfg.name, alloc.name), []).append(
                        "run under strace failed")
                    continue
                counts, fields, _ = full
                row = {"config": cfg.name, "allocator": alloc.name,
                       "ops": int(fields.get("ops", 0)), "total": counts, "startup": basel[0]}
                sys_rows.append(row)
                log("  %-14s %-10s ops=%-11d %s" % (cfg.name, alloc.name, row["ops"], " ".join(
                    "%s=%d" % (s, counts.get(s, 0)) for s in SYSCALLS)))
        with open(os.path.join(args.out, "syscalls-%s.csv" % stamp), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["stamp", "config", "allocator", "ops"]
                       + ["%s_total" % s for s in SYSCALLS] + ["%s_startup" % s for s in SYSCALLS])
            for r in sys_rows:
                if r["total"] is None:
                    w.writerow([stamp, r["config"], r["allocator"], "FAILED"])
                    continue
                w.writerow([stamp, r["config"], r["allocator"], r["ops"]]
                           + [r["total"].get(s, 0) for s in SYSCALLS]
                           + [r["startup"].get(s, 0) for s in SYSCALLS])

    elapsed = time.time() - t_start
    la = loadavg()
    if la:
        info["loadavg_end"] = "%.2f %.2f %.2f" % tuple(la)
    cell = cells(configs, allocs, results)
    ref_name = "mimalloc" if any(a.name == "mimalloc" for a in allocs) else allocs[0].name

    chart_paths = []
    if plt is not None:
        try:
            chart_paths = charts(plt, configs, allocs, cell, ref_name, base, runs)
        except Exception as e:  # a chart must never cost the tables
            msg = "charts failed: %s" % e
            log("warning: " + msg)
            notes = notes + [msg]

    md = report(configs, allocs, cell, failures, sys_rows, runs, info, notes, stamp,
                elapsed, shown_bench_dir, mode, ref_name, chart_paths, args.out)
    with open(base + ".md", "w") as f:
        f.write(md)
    doc = {
        "stamp": stamp, "machine": info, "notes": notes, "runs": runs,
        "mode": "ops" if fixed_ops else "seconds", "seconds": None if fixed_ops else seconds,
        "ops": fixed_ops, "elapsed_seconds": round(elapsed, 1), "reference": ref_name,
        "configs": [{"name": c.name, "command": c.shown(), "threads": c.threads,
                     "what": c.what} for c in configs],
        "allocators": [{"name": a.name, "preload": a.origin} for a in allocs],
        "cells": [dict({"config": cn, "allocator": an,
                        "failures": failures.get((cn, an), [])}, **v)
                  for (cn, an), v in cell.items()],
        "syscalls": sys_rows, "raw": all_rows,
    }
    with open(base + ".json", "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
    for ext in (".md", ".csv", ".json"):
        shutil.copyfile(base + ext, os.path.join(args.out, "latest" + ext))
    for p in chart_paths:
        shutil.copyfile(p, os.path.join(args.out, "latest" + p[len(base):]))

    complete = (not want or set(want) == set(by_name)) and (
        sorted(a.name for a in allocs) == sorted(a.name for a in A.all_allocators() if not a.optional))
    publish = (args.publish if args.publish is not None
               else complete and not failures and not args.quick)
    if publish:
        publish_latest(md, chart_paths, base, cell, configs, allocs, ref_name, failures,
                       runs, mode, info, stamp)
    print(md)
    log("wrote %s.{csv,json,md}%s; %s total" % (
        base, "".join(" " + os.path.basename(p) for p in chart_paths), hms(elapsed)))
    if failures:
        log("FAILED: " + "; ".join("%s/%s (%d)" % (cn, an, len(m))
                                   for (cn, an), m in sorted(failures.items())))
    return 1 if failures else 0


def cells(configs, allocs, results):
    cell = {}
    for cfg in configs:
        for a in allocs:
            rows = results.get((cfg.name, a.name), [])
            cell[(cfg.name, a.name)] = {
                "mops": stats([r["mops"] for r in rows]),
                "ops": stats([float(r["ops"]) for r in rows]),
                "bench_seconds": stats([r["bench_seconds"] for r in rows]),
                "wall": stats([r["wall_seconds"] for r in rows]),
                "rss": stats([r["peak_rss_kib"] / 1024.0 for r in rows]),
                "minflt": stats([float(r["minflt"]) for r in rows]),
                "user": stats([r["user_seconds"] for r in rows]),
                "sys": stats([r["sys_seconds"] for r in rows]),
            }
    return cell


def ratio_of(cell, cfg_name, a_name, ref_name):
    me = cell[(cfg_name, a_name)]["mops"]
    ref = cell.get((cfg_name, ref_name), {}).get("mops")
    if not me or not ref or not ref["median"]:
        return None
    return me["median"] / ref["median"]


def ratio_str(r):
    if r is None:
        return "-"
    if r >= 10:
        return "%.1f" % r
    if r >= 0.1:
        return "%.2f" % r
    return "%.2g" % r


def summary_table(configs, allocs, cell, failures, ref_name):
    L = ["| config | " + " | ".join(a.name for a in allocs) + " |",
         "|---|" + "---:|" * len(allocs)]
    for cfg in configs:
        row = []
        for a in allocs:
            s = cell[(cfg.name, a.name)]["mops"]
            if s is None:
                row.append("FAILED" if (cfg.name, a.name) in failures else "-")
                continue
            r = ratio_of(cell, cfg.name, a.name, ref_name)
            row.append(tp(s["median"]) + (" (%s×)" % ratio_str(r) if r is not None else ""))
        L.append("| %s | %s |" % (cfg.name, " | ".join(row)))
    return L


def report(configs, allocs, cell, failures, sys_rows, runs, info, notes, stamp,
           elapsed, bench_dir, mode, ref_name, chart_paths, out_dir):
    L = []
    L.append("# hakmem vs peers — %s" % stamp)
    L.append("")
    L.append("%d run(s) per cell, interleaved, %s; throughput in million operations/s "
             "(one malloc, free or realloc = one operation), timed inside the benchmark. "
             "Ratios are of medians, against %s." % (runs, mode, ref_name))
    L.append("")
    L.append("- machine: %s, %s CPUs, Linux %s; load average at start %s, at end %s" % (
        info.get("cpu", "?"), info.get("cpus", "?"), info.get("kernel", "?"),
        info.get("loadavg", "?"), info.get("loadavg_end", "?")))
    if info.get("packages"):
        L.append("- peers: %s" % info["packages"])
    L.append("- hakmem tree: %s; benchmarks: %s; total time %s" % (
        info.get("git", "?"), os.path.relpath(bench_dir, A.ROOT), hms(elapsed)))
    for n in notes:
        L.append("- note: %s" % n)
    L.append("")

    L.append("## Median throughput (Mops/s; ×%s)" % ref_name)
    L.append("")
    L.extend(summary_table(configs, allocs, cell, failures, ref_name))
    L.append("")
    for p in chart_paths:
        L.append("![%s](%s)" % (os.path.basename(p), os.path.relpath(p, out_dir)))
    if chart_paths:
        L.append("")

    L.append("## Detail")
    L.append("")
    L.append("| config | allocator | n | median | mean | min | max | CV %% | ×%s "
             "| ops/run | timed s | peak RSS MiB | minor faults | user s | sys s |" % ref_name)
    L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    short = []
    for cfg in configs:
        for a in allocs:
            c = cell[(cfg.name, a.name)]
            s = c["mops"]
            nfail = len(failures.get((cfg.name, a.name), []))
            if s is None:
                L.append("| %s | %s | 0 | FAILED ×%d | | | | | | | | | | | |"
                         % (cfg.name, a.name, nfail))
                continue
            if c["bench_seconds"]["median"] < 0.5:
                short.append("%s/%s (%.2f s)" % (cfg.name, a.name, c["bench_seconds"]["median"]))
            L.append("| %s | %s | %d%s | %s | %s | %s | %s | %.1f | %s | %.3g | %.2f | %.1f | %.0f "
                     "| %.3f | %.3f |" % (
                         cfg.name, a.name, s["n"], (" (+%d failed)" % nfail) if nfail else "",
                         tp(s["median"]), tp(s["mean"]), tp(s["min"]), tp(s["max"]), s["cv"],
                         ratio_str(ratio_of(cell, cfg.name, a.name, ref_name)),
                         c["ops"]["median"], c["bench_seconds"]["median"], c["rss"]["median"],
                         c["minflt"]["median"], c["user"]["median"], c["sys"]["median"]))
    L.append("")
    L.append("Configs: " + "; ".join("**%s** = `%s` (%s)" % (c.name, c.shown(), c.what)
                                     for c in configs) + ".")
    L.append("")
    L.append("`ops/run` and `timed s`: medians of the operations done and of the timed "
             "loop's length; peak RSS is the benchmark's VmHWM; minor faults, user and "
             "sys time are the whole process's (wait4).")
    if short:
        L.append("")
        L.append("Timed loops shorter than 0.5 s (start-up weighs more there): "
                 + ", ".join(short) + ".")
    L.append("")

    if failures:
        L.append("## Failures")
        L.append("")
        for (cn, an), msgs in sorted(failures.items()):
            L.append("- **%s / %s**: %d failed run(s); first: %s" % (cn, an, len(msgs), msgs[0]))
        L.append("")

    if sys_rows:
        L.append("## System calls (strace -f -c; one run per cell)")
        L.append("")
        L.append("Each cell: whole-process count (and `loop`: minus a run with zero operations, "
                 "i.e. without start-up, set-up and exit). The last two columns add up the "
                 "`loop` counts of all the calls traced, and scale them per 10^8 operations "
                 "(hakmem's target: at most 1 per 10^8 in steady state).")
        L.append("")
        L.append("| config | allocator | ops | " + " | ".join(SYSCALLS)
                 + " | loop, all | per 1e8 ops |")
        L.append("|---|---|---:|" + "---:|" * (len(SYSCALLS) + 2))
        for r in sys_rows:
            if r["total"] is None:
                L.append("| %s | %s | FAILED |%s" % (r["config"], r["allocator"],
                                                     " |" * (len(SYSCALLS) + 2)))
                continue
            full, base = r["total"], r["startup"]
            loop = sum(max(0, full.get(s, 0) - base.get(s, 0)) for s in SYSCALLS)
            per = loop * 1e8 / r["ops"] if r["ops"] else 0.0
            L.append("| %s | %s | %.3g | %s | %d | %.3g |" % (
                r["config"], r["allocator"], r["ops"],
                " | ".join("%d (loop %d)" % (full.get(s, 0), full.get(s, 0) - base.get(s, 0))
                           for s in SYSCALLS), loop, per))
        L.append("")
    return "\n".join(L) + "\n"


BEGIN = "<!-- latest-results:begin (written by bench/compare.py) -->"
END = "<!-- latest-results:end -->"


def publish_latest(md, chart_paths, base, cell, configs, allocs, ref_name, failures, runs,
                   mode, info, stamp):
    """Copies the report and charts to bench/latest/ and rewrites the section
    of bench/README.md between the BEGIN and END markers."""
    latest = os.path.join(A.BENCH_DIR, "latest")
    os.makedirs(latest, exist_ok=True)
    with open(os.path.join(latest, "report.md"), "w") as f:
        f.write(md.replace("](compare-%s-" % stamp, "](")
                .replace("(compare-%s-" % stamp, "("))
    imgs = []
    for p in chart_paths:
        name = p[len(base) + 1:]  # throughput.png, rss.png
        shutil.copyfile(p, os.path.join(latest, name))
        imgs.append(name)
    readme = os.path.join(A.BENCH_DIR, "README.md")
    try:
        text = open(readme).read()
    except OSError:
        return
    if BEGIN not in text or END not in text:
        log("note: %s has no latest-results markers; not updated" % readme)
        return
    S = [BEGIN, ""]
    S.append("%s, %d run(s) per cell, %s; %s, %s CPUs, load average %s at start; "
             "hakmem %s. Median Mops/s (×%s). Full report with detail and system calls: "
             "[latest/report.md](latest/report.md)." % (
                 stamp, runs, mode, info.get("cpu", "?"), info.get("cpus", "?"),
                 info.get("loadavg", "?"), info.get("git", "?"), ref_name))
    S.append("")
    S.extend(summary_table(configs, allocs, cell, failures, ref_name))
    S.append("")
    for name in imgs:
        S.append("![%s](latest/%s)" % (name[:-4], name))
    if imgs:
        S.append("")
    S.append(END)
    start = text.index(BEGIN)
    end = text.index(END) + len(END)
    with open(readme, "w") as f:
        f.write(text[:start] + "\n".join(S) + text[end:])
    log("published: bench/README.md (latest results) and bench/latest/")


if __name__ == "__main__":
    sys.exit(main())
