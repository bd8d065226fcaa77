#!/usr/bin/env python3
"""Instructions per operation under callgrind (`make bench-instr`).

For each allocator (hakmem, glibc, mimalloc, jemalloc, tcmalloc by default),
preloaded into the same benchmark binaries:

  (a) hit path: bench/pair N SIZE KEEP does N x { p = malloc(SIZE); p[0] = 1;
      free(p); }.  Run at two N; (Ir(N2) - Ir(N1)) / (N2 - N1) is the number of
      instructions of one malloc+free pair plus a few of loop, start-up and
      exit cancelling out.  KEEP=0: the block is alone in its page, so each
      free empties the page (mimalloc, for one, then takes its page-retire
      path); KEEP=1: one more block of the size stays live, the pure hit path.
  (b) random_mixed --preset mixed at two iteration counts; the difference per
      operation (one malloc or one free).
  (c) string_builder (malloc 8, 16, 32, 64 B, write, free the four) likewise,
      per malloc or free.

Ir is callgrind's instruction count (the `totals:` line of its output file);
the part spent in the benchmark executable itself (its loop, PRNG, slot
bookkeeping, PLT stubs: ~34 Ir per random_mixed operation) is separated out,
so the `allocator` column is what the allocator costs.
Instruction counts are deterministic, so runs go in parallel (--jobs).
The table is printed and saved as bench/results/instr-<stamp>.md.
"""

import argparse
import concurrent.futures
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import allocators as A  # noqa: E402

DEFAULT_ALLOCATORS = ["hakmem", "glibc", "mimalloc", "jemalloc", "tcmalloc"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def self_costs(path):
    """Self Ir per object (ob=) from a callgrind output file written with
    --compress-strings=no: cost lines add to the current object, except the
    line after `calls=` (the inclusive cost of a call)."""
    costs, ob, skip = {}, None, False
    with open(path) as f:
        for line in f:
            c = line[:1]
            if c.isdigit() or c in "+-*":
                if skip:
                    skip = False
                    continue
                tok = line.split()
                if len(tok) > 1 and ob is not None:
                    costs[ob] = costs.get(ob, 0) + int(tok[1])
            elif line.startswith("ob="):
                ob = line[3:].strip()
            elif line.startswith("calls="):
                skip = True
    return costs


def callgrind_ir(cmd, alloc, program):
    """(total Ir, Ir in the benchmark executable itself) of one run of cmd
    under callgrind with alloc preloaded."""
    fd, out_file = tempfile.mkstemp(prefix="hakmem-callgrind-")
    os.close(fd)
    try:
        vg = ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out_file,
              "--dump-instr=no", "--compress-strings=no"] + cmd
        r = subprocess.run(vg, env=alloc.env(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            tail = "\n".join(r.stderr.strip().splitlines()[-5:])
            raise RuntimeError("%s failed under callgrind (status %d):\n%s"
                               % (" ".join(cmd), r.returncode, tail))
        fields = A.parse_line(r.stdout, program)
        problem = alloc.check(fields or {})
        if problem:
            sys.exit("FATAL: %s" % problem)
        total = None
        with open(out_file) as f:
            for line in f:
                m = re.match(r"(totals|summary):\s+(\d+)", line)
                if m:
                    total = int(m.group(2))
                    if m.group(1) == "totals":
                        break
        if total is None:  # fall back to the "Collected : N" line on stderr
            m = re.search(r"Collected\s*:\s*(\d+)", r.stderr)
            if not m:
                raise RuntimeError("no instruction total in callgrind output")
            total = int(m.group(1))
        exe = os.path.realpath(cmd[0])
        harness = sum(v for ob, v in self_costs(out_file).items()
                      if os.path.realpath(ob) == exe) if os.path.exists(out_file) else 0
        return total, harness
    finally:
        if os.path.exists(out_file):
            os.unlink(out_file)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated allocators (default: %s)"
                    % ",".join(DEFAULT_ALLOCATORS))
    ap.add_argument("--sizes", default="64", help="pair sizes, comma-separated (default 64)")
    ap.add_argument("--keep", default="0,1",
                    help="pair: blocks kept live beside the loop's block, comma-separated (default 0,1)")
    ap.add_argument("--pair-n", default="200000,400000", help="the two pair iteration counts")
    ap.add_argument("--mixed-iters", default="1000000,2000000",
                    help="the two random_mixed iteration counts")
    ap.add_argument("--sb-iters", default="250000,500000",
                    help="the two string_builder iteration counts")
    ap.add_argument("--preset", default="mixed", help="random_mixed preset (default mixed)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="callgrind runs in parallel (default: CPU count)")
    A.add_run_args(ap)
    args = ap.parse_args()

    if not shutil.which("valgrind"):
        sys.exit("valgrind not found (bash scripts/install-deps.sh bench)")
    only = [x.strip() for x in args.only.split(",")] if args.only else None
    allocs, notes = A.select_allocators(only, args.hakmem, DEFAULT_ALLOCATORS)
    for n in notes:
        log("note: " + n)
    if not allocs:
        sys.exit("no allocator to run")
    bench_dir = A.find_benchmarks(args.bench_dir, log)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    keeps = [int(float(k)) for k in args.keep.split(",")]
    pn = [int(float(x)) for x in args.pair_n.split(",")]
    mi = [int(float(x)) for x in args.mixed_iters.split(",")]
    sbi = [int(float(x)) for x in args.sb_iters.split(",")]
    if any(len(c) != 2 or c[0] == c[1] for c in (pn, mi, sbi)):
        sys.exit("--pair-n, --mixed-iters and --sb-iters need two different counts")

    pair = os.path.join(bench_dir, "pair")
    rm = os.path.join(bench_dir, "random_mixed")
    sb = os.path.join(bench_dir, "string_builder")
    jobs = []  # (key, cmd, alloc, program)
    for a in allocs:
        for s in sizes:
            for k in keeps:
                for n in pn:
                    jobs.append(((a.name, "pair%d/%d" % (s, k), n),
                                 [pair, str(n), str(s), str(k)], a, "pair"))
        for n in mi:
            jobs.append(((a.name, "mixed", n),
                         [rm, "--preset", args.preset, "--iters", str(n)], a, "random_mixed"))
        for n in sbi:
            jobs.append(((a.name, "string_builder", n),
                         [sb, "--iters", str(n)], a, "string_builder"))
    log("instr: %d callgrind runs, %d at a time (%s)"
        % (len(jobs), args.jobs, ", ".join(a.name for a in allocs)))

    ir, errors = {}, {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        futs = {ex.submit(callgrind_ir, cmd, a, prog): key for key, cmd, a, prog in jobs}
        for fut in concurrent.futures.as_completed(futs):
            key = futs[fut]
            try:
                ir[key] = fut.result()
                log("  %-10s %-10s n=%-8d Ir=%d (in benchmark %d)"
                    % (key[0], key[1], key[2], ir[key][0], ir[key][1]))
            except RuntimeError as e:
                errors[key[:2]] = str(e)
                log("  %-10s %-10s n=%-8d FAILED: %s" % (key[0], key[1], key[2], e))

    def per_op(name, bench, counts, ops_per_iter):
        """(total Ir per op, Ir per op in the benchmark program itself)."""
        k1, k2 = (name, bench, counts[0]), (name, bench, counts[1])
        if k1 not in ir or k2 not in ir:
            return None
        d = float(counts[1] - counts[0]) * ops_per_iter
        return ((ir[k2][0] - ir[k1][0]) / d, (ir[k2][1] - ir[k1][1]) / d)

    cols = [("pair%d/%d" % (s, k), pn, "pair %d B%s" % (s, ", page kept" if k else ""), 1)
            for s in sizes for k in keeps]
    cols.append(("mixed", mi, "random_mixed %s" % args.preset, 1))
    # string_builder: one iteration = 4 mallocs and 4 frees.
    cols.append(("string_builder", sbi, "string_builder", 8))
    table = {(a.name, c): per_op(a.name, c, n, m) for a in allocs for c, n, _, m in cols}

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    L = ["# Instructions per operation (callgrind Ir) — %s" % stamp, ""]
    L.append("Difference of callgrind totals between two run lengths divided by the "
             "difference in operations (pair: N = %d, %d, one operation = one malloc+free "
             "pair; random_mixed: iters = %d, %d, one operation = one malloc or one free; "
             "string_builder: iters = %d, %d, one operation = one malloc or one free). "
             "`harness` is the part spent in the benchmark program itself (loop, PRNG, "
             "PLT stubs), `allocator` the rest; ×mimalloc compares `allocator` "
             "(lower is better). \"page kept\": one other block of the size stays "
             "live, so the free never empties the page (the pure hit path)."
             % (pn[0], pn[1], mi[0], mi[1], sbi[0], sbi[1]))
    L.append("")
    for n in notes:
        L.append("- note: %s" % n)
    if notes:
        L.append("")
    L.append("| benchmark | allocator | Ir/op | harness | allocator | ×mimalloc |")
    L.append("|---|---|---:|---:|---:|---:|")
    for c, _, title, _ in cols:
        ref = table.get(("mimalloc", c))
        for a in allocs:
            v = table[(a.name, c)]
            if v is None:
                L.append("| %s | %s | FAILED | | | |" % (title, a.name))
                continue
            own = v[0] - v[1]
            rel = ("%.2f" % (own / (ref[0] - ref[1]))) if ref and ref[0] - ref[1] > 0 else "-"
            L.append("| %s | %s | %.1f | %.1f | %.1f | %s |" % (title, a.name, v[0], v[1], own, rel))
    L.append("")
    if errors:
        L.append("## Failures")
        L.append("")
        for (an, c), e in sorted(errors.items()):
            L.append("- %s / %s: %s" % (an, c, e.splitlines()[0]))
        L.append("")
    md = "\n".join(L) + "\n"
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "instr-%s.md" % stamp)
    with open(path, "w") as f:
        f.write(md)
    print(md)
    log("wrote %s" % path)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
