"""Shared pieces of bench/compare.py and bench/instr.py (standard library only).

- ALLOCATORS: hakmem and its peers, how to preload each, and how to recognise
  each in a benchmark's `allocator=` / `malloc_from=` fields.
- find_benchmarks(): the benchmark binaries, built if needed.
- parse_line(): a benchmark's `key=value` output line as a dict.
"""

import os
import shutil
import subprocess
import sys

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
LIBDIR = "/usr/lib/x86_64-linux-gnu"
PROGRAMS = ("random_mixed", "string_builder", "pair", "larson", "xthread", "realloc_growth",
            "big", "soak", "rss_phase")


class Allocator:
    """One allocator: `preload` is None for glibc (nothing preloaded).
    A benchmark run really used it when its allocator= field starts with
    `maps_prefix` and its malloc_from= field starts with `malloc_prefix`."""

    def __init__(self, name, preload, maps_prefix, malloc_prefix, hint, optional=False,
                 extra_env=None):
        self.optional = optional  # measured only when asked for by name
        self.extra_env = extra_env or {}  # set in each run's environment
        self.name = name
        self.preload = preload
        self.maps_prefix = maps_prefix
        self.malloc_prefix = malloc_prefix
        self.hint = hint
        self.origin = preload  # where the library was found (preload may be a copy)

    def available(self):
        return self.preload is None or os.path.exists(self.preload)

    def env(self, base=None):
        env = dict(os.environ if base is None else base)
        env.pop("LD_PRELOAD", None)
        if self.preload:
            env["LD_PRELOAD"] = self.preload
        env.update(self.extra_env)
        return env

    def check(self, fields):
        """Returns None if the run used this allocator, else a message."""
        got = fields.get("allocator", "?")
        frm = fields.get("malloc_from", "?")
        if self.maps_prefix == "glibc":
            ok_maps = got == "glibc"
        else:
            ok_maps = got.startswith(self.maps_prefix)
        ok_from = frm.startswith(self.malloc_prefix)
        if ok_maps and ok_from:
            return None
        return ("expected allocator %s (maps %s*, malloc from %s*) but the benchmark "
                "reports allocator=%s malloc_from=%s (LD_PRELOAD=%s)"
                % (self.name, self.maps_prefix, self.malloc_prefix, got, frm,
                   self.preload or "<none>"))


def all_allocators(hakmem_lib=None):
    hakmem_lib = hakmem_lib or os.environ.get("HAKMEM_LIB") or os.path.join(
        ROOT, "build", "libhakmem.so")
    return [
        Allocator("hakmem", os.path.abspath(hakmem_lib), "libhakmem", "libhakmem",
                  "run `make` at the top of the repository"),
        # The hardened build, for its cost against release (--only hakmem,hakmem-secure).
        Allocator("hakmem-secure", os.path.join(os.path.dirname(os.path.abspath(hakmem_lib)),
                                                "libhakmem-secure.so"),
                  "libhakmem-secure", "libhakmem-secure", "run `make secure`", optional=True),
        # The profiling library with the profiler on at its default rate, for its cost.
        Allocator("hakmem-prof", os.path.join(os.path.dirname(os.path.abspath(hakmem_lib)),
                                              "libhakmem-prof.so"),
                  "libhakmem-prof", "libhakmem-prof", "run `make`", optional=True,
                  extra_env={"HAKMEM_PROF": "file:/dev/null"}),
        # Another build of hakmem (HAKMEM_REF_LIB=path), to compare two builds side by side.
        Allocator("hakmem-ref", os.path.abspath(os.environ.get("HAKMEM_REF_LIB", "/nonexistent")),
                  "libhakmem", "libhakmem", "set HAKMEM_REF_LIB to a libhakmem.so", optional=True),
        Allocator("glibc", None, "glibc", "libc.so", ""),
        Allocator("mimalloc", os.path.join(LIBDIR, "libmimalloc.so.2"),
                  "libmimalloc", "libmimalloc", "apt install libmimalloc2.0"),
        Allocator("jemalloc", os.path.join(LIBDIR, "libjemalloc.so.2"),
                  "libjemalloc", "libjemalloc", "apt install libjemalloc2"),
        Allocator("tcmalloc", os.path.join(LIBDIR, "libtcmalloc_minimal.so.4"),
                  "libtcmalloc", "libtcmalloc", "apt install libtcmalloc-minimal4"),
        # libtbbmalloc.so.2 alone replaces nothing: the proxy is the LD_PRELOAD shim.
        Allocator("tbbmalloc", os.path.join(LIBDIR, "libtbbmalloc_proxy.so.2"),
                  "libtbbmalloc_proxy", "libtbbmalloc_proxy", "apt install libtbbmalloc2"),
    ]


def select_allocators(names, hakmem_lib=None, default=None):
    """names: list or None (None = `default` list, or all).  Returns
    (available allocators in canonical order, list of notes about skipped ones)."""
    allocs = all_allocators(hakmem_lib)
    known = [a.name for a in allocs]
    wanted = names if names else (default or [a.name for a in allocs if not a.optional])
    for n in wanted:
        if n not in known:
            sys.exit("unknown allocator '%s' (known: %s)" % (n, ", ".join(known)))
    chosen, notes = [], []
    for a in allocs:
        if a.name not in wanted:
            continue
        if a.available():
            chosen.append(a)
        else:
            notes.append("%s skipped: %s not found (%s)" % (a.name, a.preload, a.hint))
    return chosen, notes


def parse_line(text, program):
    """The last stdout line that starts with `program`, as a dict of its
    key=value fields; None if there is none."""
    for line in reversed(text.splitlines()):
        parts = line.split()
        if parts and parts[0] == program:
            fields = {}
            for p in parts[1:]:
                k, sep, v = p.partition("=")
                if sep:
                    fields[k] = v
            return fields
    return None


def snapshot(bench_dir, allocs, log=None):
    """Copies the benchmark binaries and every allocator library that lives
    in this repository (hakmem) into a fresh temporary directory, so that a
    rebuild during a long comparison cannot mix two versions.  Returns
    (temporary directory, benchmark directory inside it); the caller removes
    the directory.  The copy of libhakmem keeps a name starting with
    `libhakmem`, so the checks of Allocator still hold."""
    import tempfile
    tmp = tempfile.mkdtemp(prefix="hakmem-bench-")
    bdir = os.path.join(tmp, "bench")
    os.makedirs(bdir)
    for p in PROGRAMS:
        src = os.path.join(bench_dir, p)
        if os.path.exists(src):
            shutil.copy2(src, os.path.join(bdir, p))
    for a in allocs:
        if a.preload and os.path.realpath(a.preload).startswith(ROOT + os.sep):
            dst = os.path.join(tmp, os.path.basename(a.preload))
            shutil.copy2(os.path.realpath(a.preload), dst)
            a.origin = a.preload
            a.preload = dst
    if log:
        log("note: running copies of the benchmarks and of hakmem from %s" % tmp)
    return tmp, bdir


def _stale(binary, sources):
    if not os.path.exists(binary):
        return True
    t = os.path.getmtime(binary)
    return any(os.path.getmtime(s) > t for s in sources if os.path.exists(s))


def find_benchmarks(bench_dir=None, log=None):
    """Directory holding up-to-date benchmark binaries (PROGRAMS).

    Order: an explicit directory; build/bench (rebuilt through cmake when
    stale and build/ is configured); else a direct `cc -O2` build into
    build/bench-direct (works even when the library itself does not build)."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    if bench_dir:
        for p in PROGRAMS:
            if not os.access(os.path.join(bench_dir, p), os.X_OK):
                sys.exit("benchmark %s not found in %s" % (p, bench_dir))
        return bench_dir

    headers = [os.path.join(BENCH_DIR, h) for h in ("bench_common.h", "bench_mixed.h")]

    def sources(p):
        return [os.path.join(BENCH_DIR, p + ".c")] + headers

    cmake_dir = os.path.join(ROOT, "build", "bench")
    if all(not _stale(os.path.join(cmake_dir, p), sources(p)) for p in PROGRAMS):
        return cmake_dir
    if os.path.exists(os.path.join(ROOT, "build", "CMakeCache.txt")) and shutil.which("cmake"):
        r = subprocess.run(["cmake", "--build", os.path.join(ROOT, "build"), "--target"]
                           + list(PROGRAMS), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        if r.returncode == 0 and all(
                not _stale(os.path.join(cmake_dir, p), sources(p)) for p in PROGRAMS):
            return cmake_dir
        log("note: building benchmarks through cmake failed; compiling them directly")

    direct = os.path.join(ROOT, "build", "bench-direct")
    os.makedirs(direct, exist_ok=True)
    cc = os.environ.get("CC", "cc")
    for p in PROGRAMS:
        out = os.path.join(direct, p)
        if not _stale(out, sources(p)):
            continue
        cmd = [cc, "-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-pthread",
               "-o", out, os.path.join(BENCH_DIR, p + ".c"), "-ldl"]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            sys.exit("cannot build %s:\n%s\n%s" % (p, " ".join(cmd), r.stdout))
    log("note: using benchmarks compiled directly in %s" % direct)
    return direct


def add_run_args(ap, timeout=None, snapshot=False):
    """The options every driver takes: --out, --bench-dir, --hakmem, and
    --timeout (seconds per run, when given a default) and --no-snapshot."""
    ap.add_argument("--out", default=os.path.join(BENCH_DIR, "results"),
                    help="results directory (default bench/results)")
    ap.add_argument("--bench-dir", help="directory holding the benchmark binaries")
    ap.add_argument("--hakmem", help="path of libhakmem.so (default build/libhakmem.so)")
    if timeout is not None:
        ap.add_argument("--timeout", type=float, default=timeout,
                        help="seconds per run (default %g)" % timeout)
    if snapshot:
        ap.add_argument("--no-snapshot", action="store_true",
                        help="run the binaries in place instead of copies taken at start")
