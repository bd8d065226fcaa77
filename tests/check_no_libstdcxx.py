#!/usr/bin/env python3
"""test_no_libstdcxx: libhakmem.so must not depend on libstdc++, neither
directly (its dynamic section) nor through its other dependencies, and a
plain C program run with LD_PRELOAD=libhakmem.so must not get libstdc++
mapped.  In a sanitizer build the sanitizer runtime (a dependency that only
that build has) may bring libstdc++ itself; that path alone is tolerated there.

Usage: check_no_libstdcxx.py LIBHAKMEM MAPS_PROBE [SANITIZER]
"""
import os
import re
import subprocess
import sys

SAN_RUNTIME = re.compile(r"^lib(a|t|ub|l|hwa|m)san\.so")


def needed(path):
    out = subprocess.run(["readelf", "-d", path], check=True, capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def ldd_map(path):
    out = subprocess.run(["ldd", path], check=True, capture_output=True, text=True).stdout
    m = {}
    for line in out.splitlines():
        parts = line.split("=>")
        if len(parts) == 2:
            name = parts[0].strip()
            target = parts[1].split("(")[0].strip()
            if target:
                m[name] = target
    return m, out


def main():
    lib, probe = sys.argv[1], sys.argv[2]
    sanitizer = sys.argv[3] if len(sys.argv) > 3 else ""
    failures = []

    direct = needed(lib)
    print("NEEDED of %s: %s" % (os.path.basename(lib), ", ".join(direct)))
    for n in direct:
        if "libstdc++" in n:
            failures.append("libhakmem.so has NEEDED %s" % n)
        if SAN_RUNTIME.match(n) and not sanitizer:
            failures.append("libhakmem.so needs sanitizer runtime %s in a non-sanitizer build" % n)

    resolved, ldd_out = ldd_map(lib)
    # Closure of dependencies, leaving out sanitizer runtimes in a sanitizer build.
    seen, todo, san_brings_stdcxx = set(), list(direct), False
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if "libstdc++" in n:
            failures.append("libstdc++ (%s) is in the dependency closure of libhakmem.so" % n)
            continue
        path = resolved.get(n)
        if not path or not os.path.exists(path):
            continue
        if sanitizer and SAN_RUNTIME.match(n):
            san_closure = ldd_map(path)[1]
            san_brings_stdcxx = san_brings_stdcxx or "libstdc++" in san_closure
            continue
        todo.extend(needed(path))
    if not sanitizer and "libstdc++" in ldd_out:
        failures.append("ldd shows libstdc++ for libhakmem.so:\n" + ldd_out)

    env = dict(os.environ)
    env["LD_PRELOAD"] = lib
    run = subprocess.run([probe], env=env, capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        failures.append("maps_probe under LD_PRELOAD exited with %d: %s" % (run.returncode, run.stderr))
    lines = run.stdout.splitlines()
    malloc_obj = next((l.split()[1] for l in lines if l.startswith("malloc-object ")), "?")
    mapped = {l.split(" ", 1)[1] for l in lines if l.startswith("mapped ")}
    print("malloc resolves into", malloc_obj)
    if not malloc_obj.startswith("libhakmem"):
        failures.append("under LD_PRELOAD malloc resolves into %s, not libhakmem" % malloc_obj)
    if not any(m.startswith("libhakmem") for m in mapped):
        failures.append("libhakmem is not mapped in the preloaded program")
    stdcxx = sorted(m for m in mapped if m.startswith("libstdc++"))
    if stdcxx:
        if sanitizer and san_brings_stdcxx and any(SAN_RUNTIME.match(m) for m in mapped):
            print("note: %s mapped, brought in by the %s sanitizer runtime (tolerated in this build)"
                  % (", ".join(stdcxx), sanitizer))
        else:
            failures.append("libstdc++ is mapped in a plain C program run with LD_PRELOAD: %s"
                            % ", ".join(stdcxx))

    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print("test_no_libstdcxx: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
