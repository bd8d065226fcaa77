#!/usr/bin/env python3
"""Soak test (`make soak`): random_mixed for a long time, RSS and throughput
sampled every second.

Runs bench/soak (see soak.c) under each chosen allocator in turn (default:
hakmem only; every allocator gets the full --duration), checks that the
preloaded allocator is the one really used, shows a progress line every
--progress seconds, and reports per allocator: mean throughput, throughput
and RSS of the first and last tenth of the run (after a first tenth of
warm-up) and their drift.  hakmem's targets: throughput drift and RSS drift
both under 5% over a long soak (the seeds' figure is for an hour).

Output in bench/results/: soak-<stamp>.csv (every sample), soak-<stamp>.md
(the summary, also printed), soak-<stamp>.png (RSS and throughput over time;
needs matplotlib, installed for this python3 if missing) and latest-soak.*.
Exit status 1 if a run crashes (or, with --strict, if a drift is over 5%).

Examples:
    python3 bench/soak.py                        # 600 s under hakmem
    python3 bench/soak.py --duration 60 --only hakmem,mimalloc
    python3 bench/soak.py --preset mixed-8k --threads 2 --duration 3600
"""

import argparse
import atexit
import csv
import datetime
import os
import shutil
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import allocators as A  # noqa: E402
import compare as C  # noqa: E402

TARGET_PCT = 5.0


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run_soak(cmd, alloc, duration, progress, timeout):
    """Runs one soak, streaming its samples.  Returns (samples, result fields,
    error message or None)."""
    samples = []
    proc = subprocess.Popen(cmd, env=alloc.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    last_shown = 0.0
    result_line = None
    for line in proc.stdout:
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "soak_sample":
            f = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
            s = {"t": float(f["t"]), "ops": int(f["ops"]), "mops": float(f["mops"]),
                 "rss_kib": int(f["rss_kib"])}
            samples.append(s)
            if s["t"] - last_shown >= progress or s["t"] >= duration - 1e-3:
                last_shown = s["t"]
                log("  [%s] t=%5.0f/%g s  %8.2f Mops/s  RSS %.1f MiB"
                    % (alloc.name, s["t"], duration, s["mops"], s["rss_kib"] / 1024.0))
        elif parts[0] == "soak":
            result_line = line
    err = proc.stderr.read()
    rc = proc.wait()
    killer.cancel()
    if rc != 0:
        return samples, None, C.describe_failure(rc, err, timeout)
    fields = A.parse_line(result_line or "", "soak")
    if not fields:
        return samples, None, "printed no result line"
    return samples, fields, None


def chart(plt, series, path, title):
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    for name, samples in series:
        ts = [s["t"] for s in samples]
        ax1.plot(ts, [s["mops"] for s in samples], label=name, linewidth=1)
        ax2.plot(ts, [s["rss_kib"] / 1024.0 for s in samples], label=name, linewidth=1)
    ax1.set_ylabel("Mops/s (per second)")
    ax1.set_ylim(bottom=0)
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize="small")
    ax1.set_title(title, fontsize="medium")
    ax2.set_ylabel("RSS, MiB")
    ax2.set_ylim(bottom=0)
    ax2.set_xlabel("seconds")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=600,
                    help="seconds per allocator (default 600)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("--only", default="hakmem",
                    help="comma-separated allocators, one soak each (default hakmem)")
    ap.add_argument("--preset", default="mixed", help="random_mixed preset (default mixed)")
    ap.add_argument("--threads", type=int, default=1, help="worker threads (default 1)")
    ap.add_argument("--extra", default="", help="more soak flags, e.g. '--ws 2000 --seed 7'")
    ap.add_argument("--progress", type=float, default=10.0,
                    help="seconds between progress lines (default 10)")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a drift exceeds the 5%% target")
    ap.add_argument("--no-charts", action="store_true")
    ap.add_argument("--no-install", action="store_true",
                    help="do not install matplotlib when it is missing")
    A.add_run_args(ap)
    args = ap.parse_args()
    if args.duration <= 0 or args.interval < 0.01:
        sys.exit("--duration must be positive and --interval at least 0.01")

    allocs, notes = A.select_allocators(C.csv_list(args.only), args.hakmem)
    for n in notes:
        log("note: " + n)
    if not allocs:
        sys.exit("no allocator to run")
    bench_dir = A.find_benchmarks(args.bench_dir, log)
    snap, bench_dir = A.snapshot(bench_dir, allocs)  # a rebuild meanwhile changes nothing
    atexit.register(shutil.rmtree, snap, True)
    plt = None
    if not args.no_charts:
        plt, msg = C.matplotlib_pyplot(not args.no_install
                                       and not os.environ.get("HAKMEM_BENCH_NO_INSTALL"))
        if msg:
            log(("note: " if plt else "warning: chart will be skipped: ") + msg)
            if not plt:
                notes.append("chart skipped: " + msg)

    flags = ["--preset", args.preset, "--threads", str(args.threads),
             "--duration", "%g" % args.duration, "--interval", "%g" % args.interval]
    flags += args.extra.split()
    cmd = [os.path.join(bench_dir, "soak")] + flags
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, "soak-%s" % stamp)
    info = C.machine_info()
    log("hakmem soak: %s for %g s each under %s (total ~%s)"
        % (" ".join(["soak"] + flags), args.duration, ", ".join(a.name for a in allocs),
           C.hms(args.duration * len(allocs))))

    series, results, failed, missed = [], [], [], []
    timeout = args.duration * 1.5 + 120
    with open(base + ".csv", "w", newline="") as fcsv:
        w = csv.writer(fcsv)
        w.writerow(["stamp", "allocator", "t", "ops", "mops", "rss_kib"])
        for a in allocs:
            samples, fields, err = run_soak(cmd, a, args.duration, args.progress, timeout)
            for s in samples:
                w.writerow([stamp, a.name, s["t"], s["ops"], s["mops"], s["rss_kib"]])
            fcsv.flush()
            if err:
                log("FAILED: soak under %s: %s" % (a.name, err))
                failed.append((a.name, err))
                continue
            problem = a.check(fields)
            if problem:
                sys.exit("FATAL: " + problem)
            series.append((a.name, samples))
            results.append((a.name, fields))
            for key in ("mops_drift_pct", "rss_drift_pct"):
                if abs(float(fields[key])) > TARGET_PCT:
                    missed.append("%s %s %s%%" % (a.name, key, fields[key]))

    L = ["# hakmem soak — %s" % stamp, ""]
    L.append("`%s`, %g s per allocator, one sample every %g s.  Drift: mean of the last "
             "tenth of the samples against the mean of the second tenth (the first tenth "
             "is warm-up); hakmem's target is under %g%% for both.  *faults*: minor page "
             "faults during the second and during the last tenth (warm: the last no more "
             "than the first)." % (
                 " ".join(["soak"] + flags), args.duration, args.interval, TARGET_PCT))
    L.append("")
    L.append("- machine: %s, %s CPUs, Linux %s; load average at start %s; hakmem tree %s"
             % (info.get("cpu", "?"), info.get("cpus", "?"), info.get("kernel", "?"),
                info.get("loadavg", "?"), info.get("git", "?")))
    for n in notes:
        L.append("- note: %s" % n)
    L.append("")
    L.append("| allocator | samples | Mops/s mean | first | last | drift % | RSS MiB first "
             "| last | max | drift % | faults first | last | verdict |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, f in results:
        md, rd = float(f["mops_drift_pct"]), float(f["rss_drift_pct"])
        ok = abs(md) <= TARGET_PCT and abs(rd) <= TARGET_PCT
        L.append("| %s | %s | %s | %s | %s | %+.2f | %.2f | %.2f | %.2f | %+.2f | %s | %s | %s |" % (
            name, f["samples"], C.tp(float(f["mops"])), C.tp(float(f["mops_first"])),
            C.tp(float(f["mops_last"])), md, float(f["rss_first_kib"]) / 1024,
            float(f["rss_last_kib"]) / 1024, float(f["rss_max_kib"]) / 1024, rd,
            f.get("faults_first", "?"), f.get("faults_last", "?"),
            "within 5%" if ok else "**over 5%**"))
    for name, err in failed:
        L.append("| %s | FAILED: %s | | | | | | | | | | | |" % (name, err))
    L.append("")
    if plt is not None and series:
        try:
            chart(plt, series, base + ".png", "soak: %s" % " ".join(flags))
            L.append("![soak](%s)" % os.path.basename(base + ".png"))
            L.append("")
            shutil.copyfile(base + ".png", os.path.join(args.out, "latest-soak.png"))
        except Exception as e:
            log("warning: chart failed: %s" % e)
    md = "\n".join(L) + "\n"
    with open(base + ".md", "w") as f:
        f.write(md)
    shutil.copyfile(base + ".md", os.path.join(args.out, "latest-soak.md"))
    shutil.copyfile(base + ".csv", os.path.join(args.out, "latest-soak.csv"))
    print(md)
    log("wrote %s.{csv,md%s}" % (base, ",png" if plt is not None and series else ""))
    if missed:
        log(("FAILED target: " if args.strict else "note: over the 5% target: ")
            + "; ".join(missed))
    if failed or (args.strict and missed):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
