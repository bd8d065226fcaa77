#!/usr/bin/env python3
"""Memory benchmarks (`make bench-memory`): is each allocator frugal with
memory and with the OS?

Two sections, every available allocator (hakmem and its peers, preloaded as
in compare.py), each run checked to have used the intended allocator:

1. RSS after a big phase (bench/rss_phase, see rss_phase.c): allocate
   --bytes (1 GiB) in small (16-1024 B) and mid (1-64 KiB) blocks, all
   written, free them all in a random order, then run lightly for --light
   seconds (2) and call malloc_trim(0).  --runs (3) runs per allocator,
   interleaved (allocator order rotated each run, seed = run number).
   Medians per allocator of RSS at the peak, after the frees, 1 s later and
   after malloc_trim, and of the time RSS took to fall below 5% of the
   peak.  hakmem's targets: below 5% of the peak within 1 s, and at once
   after malloc_trim(0).

2. Steady-state system calls: random_mixed --preset mixed for 10^7 and for
   2x10^8 operations under `strace -f -c` (with --seccomp-bpf when
   available), counting mmap, munmap, madvise, mremap and brk; the loader's
   and start-up calls are the same in both runs and cancel out in the
   difference.  hakmem's target: the longer run makes at most 2 more calls.
   LD_PRELOAD reaches the traced program only (strace -E), not strace.

Output in bench/results/: memory-<stamp>.md (the report, also printed),
memory-<stamp>.json (settings and every run) and latest-memory.{md,json}.
Exit status 1 if a run crashes (or, with --strict, if hakmem misses a
target).

Examples:
    python3 bench/memory.py                         # both sections
    python3 bench/memory.py --only-rss --runs 5 --only hakmem,glibc
    python3 bench/memory.py --only-syscalls --long-ops 1e8
    python3 bench/memory.py --bytes 256M --light 3
"""

import argparse
import atexit
import datetime
import json
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import allocators as A  # noqa: E402
import compare as C  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
FALL_PCT = 5.0           # RSS target, percent of the peak
FALL_WITHIN_MS = 1000    # ... reached within this long after the frees
SYSCALL_SLACK = 2        # extra calls allowed for the longer run
SYSCALLS = ["mmap", "munmap", "madvise", "mremap", "brk"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_bytes(notes):
    """1 GiB, or what fits when less than 3 GiB is available."""
    avail = mem_available()
    if avail is None or avail >= 3 * GIB:
        return GIB
    fit = max(64 * MIB, (avail // 3) // (64 * MIB) * (64 * MIB))
    notes.append("only %d MiB of memory available: --bytes defaults to %d MiB instead of 1 GiB"
                 % (avail // MIB, fit // MIB))
    return fit


def ops_str(n):
    """1e7 -> 10^7, 2e8 -> 2×10^8, 1.9e8 -> 1.9×10^8, 12345 -> 12345."""
    n = int(n)
    e = len(str(n)) - 1
    if e < 3:
        return str(n)
    m = "%g" % (n / 10.0 ** e)
    if float(m) * 10 ** e != n or len(m.replace(".", "")) > 2:
        return str(n)
    return ("10^%d" % e) if m == "1" else ("%s×10^%d" % (m, e))


def mib(kib):
    return "-" if kib is None else "%.1f" % (kib / 1024.0)


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# ---------------------------------------------------------------- RSS phase

def rss_section(allocs, bench_dir, args, failures):
    """Returns {allocator name: [fields of each run]}."""
    prog = os.path.join(bench_dir, "rss_phase")
    results = {a.name: [] for a in allocs}
    t0 = time.time()
    per_run = args.light + 2.5 * args.bytes / GIB + 0.5
    total = args.runs * len(allocs)
    done = 0
    for run in range(args.runs):
        order = allocs[run % len(allocs):] + allocs[:run % len(allocs)]
        seed = args.seed + run
        parts = []
        for a in order:
            cmd = [prog, "--bytes", str(args.bytes), "--light", "%g" % args.light,
                   "--seed", str(seed)]
            rc, out, err, _, _ = C.run_once(cmd, a.env(), args.timeout)
            done += 1
            if rc != 0:
                msg = C.describe_failure(rc, err, args.timeout)
                log("  FAILED rss_phase under %s: %s" % (a.name, msg))
                failures.append(("rss_phase", a.name, msg))
                parts.append("%s FAILED" % a.name)
                continue
            f = A.parse_line(out, "rss_phase")
            if not f:
                failures.append(("rss_phase", a.name, "printed no result line"))
                parts.append("%s FAILED" % a.name)
                continue
            problem = a.check(f)
            if problem:
                sys.exit("FATAL (rss_phase): " + problem)
            results[a.name].append(f)
            parts.append("%s %s→%s MiB" % (a.name, mib(int(f["peak_rss_kib"])),
                                          mib(int(f["rss_end_kib"]))))
        el = time.time() - t0
        log("[rss run %d/%d] %s  [%s elapsed, ~%s left]"
            % (run + 1, args.runs, "  ".join(parts), C.hms(el),
               C.hms(el / done * (total - done) if done else per_run * total)))
    return results


def below(kib, peak):
    return kib is not None and kib >= 0 and kib * 100.0 < peak * FALL_PCT


def rss_verdicts(runs):
    """Per run: (fell below 5% within 1 s, below 5% after malloc_trim)."""
    out = []
    for f in runs:
        peak = int(f["peak_rss_kib"])
        fall = int(f["fall_ms"])
        out.append((0 <= fall <= FALL_WITHIN_MS, below(int(f["after_trim_kib"]), peak)))
    return out


def verdict_cell(oks):
    n, good = len(oks), sum(1 for x in oks if x)
    if n == 0:
        return "-"
    return ("pass %d/%d" % (good, n)) if good == n else ("**fail** %d/%d" % (good, n))


def rss_table(allocs, results, args):
    L = ["| allocator | runs | start | peak | after free | fall < 5% | at 1 s | worst at 1 s "
         "| min | after trim | malloc_trim from | < 5% within 1 s | < 5% after trim |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    summary = {}
    for a in allocs:
        runs = results.get(a.name) or []
        if not runs:
            L.append("| %s | 0 | FAILED | | | | | | | | | | |" % a.name)
            continue

        def med(key):
            return median_or_none([int(f[key]) for f in runs if int(f[key]) >= 0])

        peak = med("peak_rss_kib")

        def pct(key):
            v = med(key)
            if v is None:
                return "-"
            return "%s (%.1f%%)" % (mib(v), 100.0 * v / peak) if peak else mib(v)

        # A run whose RSS never fell below 5% counts as infinitely slow.
        falls = [int(f["fall_ms"]) for f in runs]
        mf = statistics.median([x if x >= 0 else float("inf") for x in falls])
        fall = ("never in %gs" % args.light) if mf == float("inf") else "%.0f ms" % mf
        froms = sorted(set(f.get("trim_from", "?") for f in runs))
        v = rss_verdicts(runs)
        within, trim = [x[0] for x in v], [x[1] for x in v]
        summary[a.name] = {"within_1s": all(within), "after_trim": all(trim),
                           "fall_ms_median": None if mf == float("inf") else mf,
                           "peak_kib": peak, "rss_1s_kib": med("rss_1s_kib"),
                           "after_trim_kib": med("after_trim_kib"), "trim_from": froms}
        worst = max([(int(f["rss_1s_kib"]), int(f["peak_rss_kib"])) for f in runs],
                    key=lambda x: x[0] / max(x[1], 1))
        worst_s = "-" if worst[0] < 0 else "%s (%.1f%%)" % (mib(worst[0]),
                                                           100.0 * worst[0] / max(worst[1], 1))
        L.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            a.name, len(runs), mib(med("base_kib")), mib(peak), pct("after_free_kib"), fall,
            pct("rss_1s_kib"), worst_s, pct("rss_min_kib"), pct("after_trim_kib"), ", ".join(froms),
            verdict_cell(within), verdict_cell(trim)))
    return L, summary


# ---------------------------------------------------------------- syscalls

def strace_counts(prefix, alloc, cmd, timeout, failures, what):
    """Syscall counts of one run of cmd under strace; None on failure."""
    counts, fields, wall = C.strace_run(prefix, what, "random_mixed", alloc, cmd, timeout, SYSCALLS)
    if counts is None:
        log("  FAILED %s under %s: %s" % (what, alloc.name, fields))
        failures.append((what, alloc.name, fields))
        return None
    return {"counts": {s: counts.get(s, 0) for s in SYSCALLS},
            "ops": int(fields.get("ops", 0)), "mops": float(fields.get("mops", 0)),
            "wall": wall}


def syscall_section(allocs, bench_dir, args, failures):
    """Returns {allocator name: [(short run, long run) per run]}."""
    prefix = C.strace_base()
    log("syscall counts under %s: random_mixed --preset %s, %s and %s operations"
        % (" ".join(prefix), args.preset, ops_str(args.short_ops), ops_str(args.long_ops)))
    prog = os.path.join(bench_dir, "random_mixed")
    results = {a.name: [] for a in allocs}
    for run in range(args.syscall_runs):
        for a in allocs:
            pair = []
            for n in (args.short_ops, args.long_ops):
                cmd = [prog, "--preset", args.preset, "--iters", str(int(n))]
                pair.append(strace_counts(prefix, a, cmd, args.timeout, failures,
                                          "random_mixed %s" % ops_str(n)))
            if None in pair:
                continue
            results[a.name].append(tuple(pair))
            s, l = pair
            log("  [syscalls run %d/%d] %-10s %s: %d  %s: %d  (%s)"
                % (run + 1, args.syscall_runs, a.name, ops_str(args.short_ops),
                   sum(s["counts"].values()), ops_str(args.long_ops),
                   sum(l["counts"].values()), " ".join(
                       "%s%+d" % (k, l["counts"][k] - s["counts"][k]) for k in SYSCALLS)))
    return results, prefix


def syscall_table(allocs, results, args):
    multi = args.syscall_runs > 1
    L = ["| allocator | calls at %s | calls at %s | difference | %s |%s target ≤ +%d |"
         % (ops_str(args.short_ops), ops_str(args.long_ops),
            " | ".join(SYSCALLS), " differences per run |" if multi else "", SYSCALL_SLACK),
         "|---|---:|---:|---:|%s%s---|" % ("---:|" * len(SYSCALLS), "---|" if multi else "")]
    summary = {}
    for a in allocs:
        runs = results.get(a.name) or []
        if not runs:
            L.append("| %s | FAILED | | | %s|%s |" % (a.name, " |" * len(SYSCALLS),
                                                    " |" if multi else ""))
            continue
        short = {k: statistics.median([s["counts"][k] for s, _ in runs]) for k in SYSCALLS}
        long_ = {k: statistics.median([l["counts"][k] for _, l in runs]) for k in SYSCALLS}
        diffs = [sum(l["counts"].values()) - sum(s["counts"].values()) for s, l in runs]
        ts, tl = sum(short.values()), sum(long_.values())
        worst = max(diffs)
        ok = worst <= SYSCALL_SLACK
        summary[a.name] = {"short": ts, "long": tl, "diff": tl - ts, "worst_diff": worst,
                           "ok": ok}
        L.append("| %s | %g | %g | %+g | %s |%s %s |" % (
            a.name, ts, tl, tl - ts,
            " | ".join("%+g" % (long_[k] - short[k]) for k in SYSCALLS),
            (" %s |" % ", ".join("%+d" % d for d in diffs)) if multi else "",
            "pass" if ok else "**fail**"))
    return L, summary


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="allocators: " + ", ".join(
                                     a.name for a in A.all_allocators()))
    ap.add_argument("--only", help="comma-separated allocators (default: all available)")
    ap.add_argument("--only-rss", action="store_true", help="the RSS section only")
    ap.add_argument("--only-syscalls", action="store_true", help="the syscall section only")
    ap.add_argument("--runs", type=int, default=3,
                    help="rss_phase runs per allocator (default 3)")
    ap.add_argument("--bytes", help="bytes of the allocation phase (default 1G; k/M/G = 1024^n; "
                    "less when under 3 GiB of memory is available)")
    ap.add_argument("--light", type=float, default=2.0,
                    help="seconds of light work after the frees (default 2)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the first run (default 1)")
    ap.add_argument("--syscall-runs", type=int, default=1,
                    help="strace runs per allocator and length (default 1; counts are "
                    "near-deterministic)")
    ap.add_argument("--short-ops", type=float, default=1e7,
                    help="operations of the short run (default 1e7)")
    ap.add_argument("--long-ops", type=float, default=2e8,
                    help="operations of the long run (default 2e8)")
    ap.add_argument("--preset", default="mixed", help="random_mixed preset (default mixed)")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when hakmem misses a target")
    A.add_run_args(ap, timeout=600, snapshot=True)
    args = ap.parse_args()
    if args.only_rss and args.only_syscalls:
        sys.exit("--only-rss and --only-syscalls exclude each other")
    if args.runs < 1 or args.syscall_runs < 1:
        sys.exit("--runs and --syscall-runs must be at least 1")
    if args.light < 0 or args.short_ops < 0 or args.long_ops < args.short_ops:
        sys.exit("need --light >= 0 and 0 <= --short-ops <= --long-ops")
    do_rss, do_sys = not args.only_syscalls, not args.only_rss

    notes = []
    allocs, skipped = A.select_allocators(C.csv_list(args.only), args.hakmem)
    notes += skipped
    for n in skipped:
        log("note: " + n)
    if not allocs:
        sys.exit("no allocator to run")
    if args.bytes:
        size = args.bytes.strip()
        mult = {"k": 1 << 10, "m": MIB, "g": GIB}.get(size[-1:].lower(), 1)
        try:
            args.bytes = int(float(size[:-1] if mult > 1 else size) * mult)
        except ValueError:
            sys.exit("bad --bytes '%s'" % size)
    else:
        args.bytes = default_bytes(notes)
        if notes and notes[-1].startswith("only"):
            log("note: " + notes[-1])
    if do_sys and not shutil.which("strace"):
        msg = "syscall section skipped: strace not found (bash scripts/install-deps.sh bench)"
        log("note: " + msg)
        notes.append(msg)
        do_sys = False

    bench_dir = A.find_benchmarks(args.bench_dir, log)
    if not args.no_snapshot:
        snap, bench_dir = A.snapshot(bench_dir, allocs, log)
        atexit.register(shutil.rmtree, snap, True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, "memory-%s" % stamp)
    info = C.machine_info()
    failures = []
    t_start = time.time()

    L = ["# hakmem memory benchmarks — %s" % stamp, ""]
    L.append("- machine: %s, %s CPUs, Linux %s, %s MiB available at start; load average at "
             "start %s; hakmem tree %s" % (
                 info.get("cpu", "?"), info.get("cpus", "?"), info.get("kernel", "?"),
                 (mem_available() or 0) // MIB, info.get("loadavg", "?"), info.get("git", "?")))
    if info.get("packages"):
        L.append("- packages: %s" % info["packages"])
    for n in notes:
        L.append("- note: %s" % n)
    L.append("")
    hak = {}
    data = {"stamp": stamp, "machine": info, "notes": notes,
            "settings": {k: v for k, v in vars(args).items()}}

    if do_rss:
        log("rss_phase: --bytes %d (%s MiB) --light %g, %d run(s) under %s"
            % (args.bytes, args.bytes // MIB, args.light, args.runs,
               ", ".join(a.name for a in allocs)))
        res = rss_section(allocs, bench_dir, args, failures)
        data["rss_runs"] = res
        table, summary = rss_table(allocs, res, args)
        L.append("## RSS after a %s phase (rss_phase)" % (
            "%g GiB" % (args.bytes / GIB) if args.bytes >= GIB else "%g MiB" % (args.bytes / MIB)))
        L.append("")
        L.append("`rss_phase --bytes %d --light %g`, %d run(s) per allocator, interleaved; "
                 "medians, MiB (and %% of the peak).  Allocate the bytes in blocks of "
                 "16-1024 B and 1-64 KiB (half the bytes each, every byte written), free "
                 "them all in a random order, then every 1 ms 200 random_mixed operations "
                 "on 400 slots of 16-1024 B, RSS sampled every 10 ms; then malloc_trim(0) "
                 "with those blocks live.  *start*: RSS before the phase; *fall < 5%%*: time "
                 "from the end of the frees until RSS is below 5%% of the peak (0: at once; "
                 "a median over runs that never got there counts them as infinitely slow); "
                 "*worst at 1 s*: the run with the highest share of its peak at 1 s; "
                 "*min*: lowest sample of the light phase.  Targets (hakmem): below %g%% of "
                 "the peak within 1 s, and at once after malloc_trim(0).  *malloc_trim from*: "
                 "the library the call binds to (glibc's when the preloaded allocator "
                 "defines none: it then trims only glibc's own, unused heap)."
                 % (args.bytes, args.light, args.runs, FALL_PCT))
        L.append("")
        L += table
        L.append("")
        if "hakmem" in summary:
            s = summary["hakmem"]
            hak["rss_within_1s"] = s["within_1s"]
            hak["rss_after_trim"] = s["after_trim"]
            L.append("hakmem: below 5%% of the peak within 1 s: **%s** (RSS at 1 s %s MiB, "
                     "%.1f%% of %s MiB); after malloc_trim(0): **%s** (%s MiB, %.1f%%; "
                     "malloc_trim from %s)." % (
                         "pass" if s["within_1s"] else "FAIL", mib(s["rss_1s_kib"]),
                         100.0 * (s["rss_1s_kib"] or 0) / s["peak_kib"], mib(s["peak_kib"]),
                         "pass" if s["after_trim"] else "FAIL", mib(s["after_trim_kib"]),
                         100.0 * s["after_trim_kib"] / s["peak_kib"],
                         ", ".join(s["trim_from"])))
            L.append("")

    if do_sys:
        res, prefix = syscall_section(allocs, bench_dir, args, failures)
        data["syscall_runs"] = res
        table, summary = syscall_table(allocs, res, args)
        L.append("## Steady-state system calls (random_mixed under strace)")
        L.append("")
        L.append("`%s -e trace=%s random_mixed --preset %s --iters N` for N = %s and %s "
                 "(%d run(s) each; medians).  Calls of %s together; the start-up and the "
                 "loader's calls are the same in both runs, so the difference is what %s "
                 "more operations asked of the kernel.  The columns per system call are "
                 "differences.  Target (hakmem): at most +%d." % (
                     " ".join(prefix), ",".join(SYSCALLS), args.preset,
                     ops_str(args.short_ops), ops_str(args.long_ops), args.syscall_runs,
                     ", ".join(SYSCALLS), ops_str(args.long_ops - args.short_ops),
                     SYSCALL_SLACK))
        L.append("")
        L += table
        L.append("")
        if "hakmem" in summary:
            s = summary["hakmem"]
            hak["syscalls"] = s["ok"]
            L.append("hakmem: %g more calls for %s operations than for %s: **%s**." % (
                s["diff"], ops_str(args.long_ops), ops_str(args.short_ops),
                "pass" if s["ok"] else "FAIL"))
            L.append("")

    if failures:
        L.append("## Failures")
        L.append("")
        for what, name, msg in failures:
            L.append("- %s under %s: %s" % (what, name, msg))
        L.append("")
    L.append("Took %s." % C.hms(time.time() - t_start))
    md = "\n".join(L) + "\n"
    data["failures"] = failures
    data["hakmem_targets"] = hak
    with open(base + ".md", "w") as f:
        f.write(md)
    with open(base + ".json", "w") as f:
        json.dump(data, f, indent=1, default=str)
    shutil.copyfile(base + ".md", os.path.join(args.out, "latest-memory.md"))
    shutil.copyfile(base + ".json", os.path.join(args.out, "latest-memory.json"))
    print(md)
    log("wrote %s.{md,json} and latest-memory.*" % base)
    missed = [k for k, ok in hak.items() if not ok]
    if missed:
        log(("FAILED target: " if args.strict else "note: hakmem misses: ") + ", ".join(missed))
    if failures or (args.strict and missed):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
