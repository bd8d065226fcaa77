#!/usr/bin/env python3
"""Side-by-side benchmark of hakmem and its peers (`make bench`).

The same benchmark binaries (bench/random_mixed, bench/string_builder; plain
libc) run under each allocator via LD_PRELOAD, interleaved:

    for run in 1..N:  for config:  for allocator:  run once

so slow drifts of the machine hit every allocator alike (the allocator order
is also rotated from one run to the next).  Every run is checked: the
benchmark reports which allocator it found mapped and which object its
`malloc` resolves to, and a mismatch aborts the whole comparison.

Per run it records the benchmark's own throughput (Mops/s, timed inside the
program around the operation loop only) and, from wait4(), wall/user/sys time,
peak RSS and page faults of the child.  Per (config, allocator) cell it
reports median, mean, min, max and coefficient of variation, and the ratio of
medians to mimalloc.  Raw runs go to bench/results/compare-<stamp>.csv, the
report to compare-<stamp>.md (also copied to latest.md), and the Markdown is
printed on stdout; progress goes to stderr.

--syscalls adds, after the timed runs, one run per cell under
`strace -f -c` counting mmap/munmap/madvise/mremap/brk (and mprotect), plus
one with zero operations so start-up can be subtracted.

Examples:
    python3 bench/compare.py                      # 10 runs, everything
    python3 bench/compare.py --quick --configs mixed --only glibc,mimalloc
    python3 bench/compare.py --runs 5 --syscalls --configs mixed,mid_large
Environment: HAKMEM_BENCH_RUNS (default run count), HAKMEM_LIB (hakmem .so).
"""

import argparse
import csv
import datetime
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


class Config:
    """One benchmark configuration.  `ops` is the total number of operations
    per run (an operation is one malloc or one free), split across threads."""

    def __init__(self, name, program, args, ops, threads=1, ops_per_iter=1):
        self.name = name
        self.program = program
        self.args = list(args)
        self.ops = int(ops)
        self.threads = threads
        self.ops_per_iter = ops_per_iter  # string_builder: 8 operations per iteration

    def argv(self, bench_dir, ops):
        iters = max(0, int(ops) // (self.threads * self.ops_per_iter))
        cmd = [os.path.join(bench_dir, self.program)] + self.args
        if self.program == "random_mixed":
            cmd += ["--threads", str(self.threads)]
        return cmd + ["--iters", str(iters)]

    def real_ops(self, ops):
        return (int(ops) // (self.threads * self.ops_per_iter)) * self.threads * self.ops_per_iter


# Sized so that one run takes at least ~0.5 s for the peers on a typical
# x86-64 machine.
CONFIGS = [
    Config("mixed", "random_mixed", ["--preset", "mixed"], 2e7),
    Config("mixed-8k", "random_mixed", ["--preset", "mixed-8k"], 2e7),
    Config("c6-heavy", "random_mixed", ["--preset", "c6-heavy"], 2e7),
    Config("c7-only", "random_mixed", ["--preset", "c7-only"], 2e7),
    Config("tiny", "random_mixed", ["--preset", "tiny"], 3e7),
    Config("mid_large", "random_mixed", ["--preset", "mid_large"], 1e7),
    Config("mixed-2t", "random_mixed", ["--preset", "mixed"], 4e7, threads=2),
    Config("string_builder", "string_builder", [], 8e7, ops_per_iter=8),
]

SYSCALLS = ["mmap", "munmap", "madvise", "mremap", "brk", "mprotect"]


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


def strace_run(cfg, alloc, bench_dir, ops, timeout):
    """Syscall counts of one run under strace -f -c; None on failure."""
    fd, path = tempfile.mkstemp(prefix="hakmem-strace-")
    os.close(fd)
    try:
        cmd = ["strace", "-f", "-c", "-o", path, "-e", "trace=" + ",".join(SYSCALLS)]
        if alloc.preload:
            cmd += ["-E", "LD_PRELOAD=" + alloc.preload]
        cmd += ["--"] + cfg.argv(bench_dir, ops)
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)  # for the tracee only, via -E
        rc, out, err, _, _ = run_once(cmd, env, timeout)
        if rc != 0:
            log("  strace %s/%s failed: %s" % (cfg.name, alloc.name,
                                              describe_failure(rc, err, timeout)))
            return None
        fields = A.parse_line(out, cfg.program)
        problem = alloc.check(fields or {})
        if problem:
            sys.exit("FATAL (%s under strace): %s" % (cfg.name, problem))
        return parse_strace(path)
    finally:
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="configs: " + ", ".join(c.name for c in CONFIGS)
                                 + "\nallocators: " + ", ".join(a.name for a in A.all_allocators()))
    ap.add_argument("--runs", type=int, default=int(os.environ.get("HAKMEM_BENCH_RUNS", "10")),
                    help="runs per cell (default 10, or $HAKMEM_BENCH_RUNS)")
    ap.add_argument("--quick", action="store_true", help="3 runs per cell")
    ap.add_argument("--only", help="comma-separated allocators (default: all available)")
    ap.add_argument("--configs", help="comma-separated configs (default: all)")
    ap.add_argument("--ops", type=float,
                    help="total operations per run for every config (e.g. 5e6)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply every config's default operation count")
    ap.add_argument("--warmup", type=int, default=0,
                    help="unrecorded rounds before the measured runs (default 0)")
    ap.add_argument("--syscalls", action="store_true",
                    help="one extra run per cell under strace -f -c")
    ap.add_argument("--out", default=os.path.join(A.BENCH_DIR, "results"),
                    help="results directory (default bench/results)")
    ap.add_argument("--bench-dir", help="directory holding the benchmark binaries")
    ap.add_argument("--hakmem", help="path of libhakmem.so (default build/libhakmem.so)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per run (default 300)")
    ap.add_argument("--list", action="store_true", help="list configs and allocators, then exit")
    args = ap.parse_args()

    if args.list:
        for c in CONFIGS:
            print("config    %-15s %s %s threads=%d ops=%g" % (
                c.name, c.program, " ".join(c.args), c.threads, c.ops))
        for a in A.all_allocators(args.hakmem):
            print("allocator %-10s %s%s" % (a.name, a.preload or "(no preload)",
                                           "" if a.available() else "  [missing]"))
        return 0

    runs = 3 if args.quick else args.runs
    if runs < 1:
        sys.exit("--runs must be at least 1")
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
    if args.syscalls and not shutil.which("strace"):
        sys.exit("--syscalls needs strace (bash scripts/install-deps.sh bench)")
    bench_dir = A.find_benchmarks(args.bench_dir, log)

    def ops_of(c):
        return args.ops if args.ops else c.ops * args.scale

    info = machine_info()
    la = loadavg()
    if la and os.cpu_count() and la[0] > 0.5 * os.cpu_count():
        warn = ("machine busy: 1-minute load average %.2f on %d CPUs at start; expect "
                "noisy results (high CV)" % (la[0], os.cpu_count()))
        log("warning: " + warn)
        notes = notes + [warn]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "compare-%s.csv" % stamp)
    md_path = os.path.join(args.out, "compare-%s.md" % stamp)

    log("hakmem compare: %d run(s) x %d config(s) x %d allocator(s) [%s]; binaries in %s"
        % (runs, len(configs), len(allocs), ", ".join(a.name for a in allocs), bench_dir))

    fields = ["stamp", "run", "config", "allocator", "ops", "mops", "bench_seconds",
              "wall_seconds", "user_seconds", "sys_seconds", "peak_rss_kib", "ru_maxrss_kib", "minflt",
              "majflt", "nvcsw", "nivcsw", "status"]
    results = {}   # (config, allocator) -> list of row dicts (successful runs)
    failures = {}  # (config, allocator) -> list of messages
    t_start = time.time()
    with open(csv_path, "w", newline="") as fcsv:
        writer = csv.DictWriter(fcsv, fieldnames=fields)
        writer.writeheader()
        total_rounds = args.warmup + runs
        for rnd in range(total_rounds):
            warm = rnd < args.warmup
            run_no = rnd - args.warmup + 1
            k = rnd % len(allocs)
            order = allocs[k:] + allocs[:k]
            for cfg in configs:
                ops = ops_of(cfg)
                parts = []
                for alloc in order:
                    cmd = cfg.argv(bench_dir, ops)
                    rc, out, err, wall, ru = run_once(cmd, alloc.env(), args.timeout)
                    key = (cfg.name, alloc.name)
                    if rc != 0:
                        msg = describe_failure(rc, err, args.timeout)
                        parts.append("%s FAILED" % alloc.name)
                        log("  %s/%s run %d FAILED: %s" % (cfg.name, alloc.name, run_no, msg))
                        if not warm:
                            failures.setdefault(key, []).append(msg)
                            writer.writerow({"stamp": stamp, "run": run_no, "config": cfg.name,
                                             "allocator": alloc.name, "status": msg})
                        continue
                    f = A.parse_line(out, cfg.program)
                    if f is None or "mops" not in f:
                        sys.exit("FATAL: %s/%s printed no result line:\n%s\n%s"
                                 % (cfg.name, alloc.name, out, err))
                    problem = alloc.check(f)
                    if problem:
                        sys.exit("FATAL (%s): %s" % (cfg.name, problem))
                    row = {
                        "stamp": stamp, "run": run_no, "config": cfg.name,
                        "allocator": alloc.name, "ops": int(f.get("ops", 0)),
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
                    parts.append("%s %.1f" % (alloc.name, row["mops"]))
                    if not warm:
                        results.setdefault(key, []).append(row)
                        writer.writerow(row)
                fcsv.flush()
                tag = "warmup %d/%d" % (rnd + 1, args.warmup) if warm else "run %d/%d" % (run_no, runs)
                log("[%s] %-14s %s  (Mops/s)" % (tag, cfg.name, "  ".join(parts)))

    sys_rows = []
    if args.syscalls:
        log("syscall counts under strace (one run per cell, plus a zero-operation baseline)")
        for cfg in configs:
            for alloc in allocs:
                full = strace_run(cfg, alloc, bench_dir, ops_of(cfg), args.timeout)
                base = strace_run(cfg, alloc, bench_dir, 0, args.timeout)
                if full is None or base is None:
                    sys_rows.append((cfg, alloc, None, None))
                    continue
                sys_rows.append((cfg, alloc, full, base))
                log("  %-14s %-10s %s" % (cfg.name, alloc.name, " ".join(
                    "%s=%d" % (s, full.get(s, 0)) for s in SYSCALLS)))
        sys_csv = os.path.join(args.out, "syscalls-%s.csv" % stamp)
        with open(sys_csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["stamp", "config", "allocator", "ops"]
                       + ["%s_total" % s for s in SYSCALLS] + ["%s_startup" % s for s in SYSCALLS])
            for cfg, alloc, full, base in sys_rows:
                if full is None:
                    w.writerow([stamp, cfg.name, alloc.name, "FAILED"])
                    continue
                w.writerow([stamp, cfg.name, alloc.name, cfg.real_ops(ops_of(cfg))]
                           + [full.get(s, 0) for s in SYSCALLS] + [base.get(s, 0) for s in SYSCALLS])

    elapsed = time.time() - t_start
    la = loadavg()
    if la:
        info["loadavg_end"] = "%.2f %.2f %.2f" % tuple(la)
    md = report(configs, allocs, results, failures, sys_rows, ops_of, runs, info, notes,
                stamp, elapsed, bench_dir)
    with open(md_path, "w") as f:
        f.write(md)
    shutil.copyfile(md_path, os.path.join(args.out, "latest.md"))
    shutil.copyfile(csv_path, os.path.join(args.out, "latest.csv"))
    plot(configs, allocs, results, os.path.join(args.out, "compare-%s.png" % stamp))
    print(md)
    log("wrote %s and %s" % (csv_path, md_path))
    return 1 if failures else 0


def report(configs, allocs, results, failures, sys_rows, ops_of, runs, info, notes, stamp,
           elapsed, bench_dir):
    L = []
    L.append("# hakmem vs peers — %s" % stamp)
    L.append("")
    L.append("%d run(s) per cell, interleaved; throughput in million operations/s "
             "(one malloc or one free = one operation), timed inside the benchmark. "
             "Ratios are of medians, against mimalloc." % runs)
    L.append("")
    L.append("- machine: %s, %s CPUs, Linux %s; load average at start %s, at end %s" % (
        info.get("cpu", "?"), info.get("cpus", "?"), info.get("kernel", "?"),
        info.get("loadavg", "?"), info.get("loadavg_end", "?")))
    if info.get("packages"):
        L.append("- peers: %s" % info["packages"])
    L.append("- hakmem tree: %s; benchmarks: %s; total time %.0f s" % (
        info.get("git", "?"), os.path.relpath(bench_dir, A.ROOT), elapsed))
    for n in notes:
        L.append("- note: %s" % n)
    L.append("")

    cell = {}
    for cfg in configs:
        for a in allocs:
            rows = results.get((cfg.name, a.name), [])
            cell[(cfg.name, a.name)] = {
                "mops": stats([r["mops"] for r in rows]),
                "rss": stats([r["peak_rss_kib"] / 1024.0 for r in rows]),
                "minflt": stats([float(r["minflt"]) for r in rows]),
                "user": stats([r["user_seconds"] for r in rows]),
                "sys": stats([r["sys_seconds"] for r in rows]),
            }

    def ratio(cfg_name, a_name):
        me = cell[(cfg_name, a_name)]["mops"]
        ref = cell.get((cfg_name, "mimalloc"), {}).get("mops")
        if not me or not ref or not ref["median"]:
            return None
        return me["median"] / ref["median"]

    # Summary matrix.
    L.append("## Median throughput (Mops/s; ×mimalloc)")
    L.append("")
    L.append("| config | " + " | ".join(a.name for a in allocs) + " |")
    L.append("|---|" + "---:|" * len(allocs))
    for cfg in configs:
        row = []
        for a in allocs:
            s = cell[(cfg.name, a.name)]["mops"]
            if s is None:
                row.append("FAILED" if (cfg.name, a.name) in failures else "-")
                continue
            r = ratio(cfg.name, a.name)
            row.append("%.1f" % s["median"] + (" (%.2f×)" % r if r is not None else ""))
        L.append("| %s | %s |" % (cfg.name, " | ".join(row)))
    L.append("")

    # Detail.
    L.append("## Detail")
    L.append("")
    L.append("| config | allocator | n | median | mean | min | max | CV % | ×mimalloc "
             "| peak RSS MiB | minor faults | user s | sys s |")
    L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cfg in configs:
        for a in allocs:
            c = cell[(cfg.name, a.name)]
            s = c["mops"]
            nfail = len(failures.get((cfg.name, a.name), []))
            if s is None:
                L.append("| %s | %s | 0 | FAILED ×%d | | | | | | | | | |" % (cfg.name, a.name, nfail))
                continue
            L.append("| %s | %s | %d%s | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %.1f | %.0f | %.3f | %.3f |" % (
                cfg.name, a.name, s["n"], (" (+%d failed)" % nfail) if nfail else "",
                s["median"], s["mean"], s["min"], s["max"], s["cv"],
                fmt(ratio(cfg.name, a.name), 2), c["rss"]["median"], c["minflt"]["median"],
                c["user"]["median"], c["sys"]["median"]))
    L.append("")
    L.append("Configs: " + "; ".join(
        "%s = `%s`, %g ops" % (c.name, " ".join([c.program] + c.args + (
            ["--threads", str(c.threads)] if c.threads > 1 else [])),
            c.real_ops(ops_of(c))) for c in configs) + ".  Peak RSS is the benchmark's VmHWM.")
    L.append("")

    if failures:
        L.append("## Failures")
        L.append("")
        for (cn, an), msgs in sorted(failures.items()):
            L.append("- %s / %s: %d failed run(s); first: %s" % (cn, an, len(msgs), msgs[0]))
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
        for cfg, alloc, full, base in sys_rows:
            if full is None:
                L.append("| %s | %s | FAILED |%s" % (cfg.name, alloc.name, " |" * (len(SYSCALLS) + 2)))
                continue
            ops = cfg.real_ops(ops_of(cfg))
            loop = sum(max(0, full.get(s, 0) - base.get(s, 0)) for s in SYSCALLS)
            per = loop * 1e8 / ops if ops else 0.0
            L.append("| %s | %s | %g | %s | %d | %.1f |" % (
                cfg.name, alloc.name, ops,
                " | ".join("%d (loop %d)" % (full.get(s, 0), full.get(s, 0) - base.get(s, 0))
                           for s in SYSCALLS), loop, per))
        L.append("")
    return "\n".join(L) + "\n"


def plot(configs, allocs, results, path):
    """A bar chart of the medians, only if matplotlib happens to be installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return
    width = 0.8 / max(1, len(allocs))
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(configs)), 4))
    for i, a in enumerate(allocs):
        ys = []
        for cfg in configs:
            rows = results.get((cfg.name, a.name), [])
            ys.append(statistics.median([r["mops"] for r in rows]) if rows else 0)
        ax.bar([j + i * width for j in range(len(configs))], ys, width, label=a.name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(configs))])
    ax.set_xticklabels([c.name for c in configs], rotation=20)
    ax.set_ylabel("Mops/s (median)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
