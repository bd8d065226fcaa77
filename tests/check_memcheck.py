#!/usr/bin/env python3
"""Memcheck sees hakmem's blocks (the debug build's valgrind annotations):
a correct program through the hak_* API gets no error and no leak, a use
after free and a lost block are reported, naming the functions.

Usage: check_memcheck.py PATH/TO/test_memcheck"""
import re
import subprocess
import sys

failures = []


def memcheck(program, mode):
    cmd = ["valgrind", "--tool=memcheck", "--leak-check=full", "--errors-for-leak-kinds=definite",
           "--num-callers=20", program, mode]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    return r.stdout, r.stderr


def expect(cond, what, log):
    if not cond:
        failures.append(what)
        print("FAILED: %s\n--- memcheck said ---\n%s" % (what, log))


def errors(log):
    m = re.search(r"ERROR SUMMARY: (\d+) errors", log)
    return int(m.group(1)) if m else -1


def definitely_lost(log):
    m = re.search(r"definitely lost: ([\d,]+) bytes", log)
    return int(m.group(1).replace(",", "")) if m else 0


def main():
    program = sys.argv[1]
    out, log = memcheck(program, "clean")
    expect("clean" in out, "the clean run completed", log)
    expect(errors(log) == 0, "no error in a correct program", log)
    expect(definitely_lost(log) == 0, "no leak in a correct program", log)

    out, log = memcheck(program, "uaf")
    expect(re.search(r"Invalid read of size 1", log) is not None, "use after free: an invalid read", log)
    expect(re.search(r"8 bytes inside a block of size \d+ free'd", log) is not None,
           "use after free: inside a freed block", log)
    expect("use_after_free" in log and "hak_free" in log,
           "use after free: where it was read and where it was freed", log)

    out, log = memcheck(program, "leak")
    lost = definitely_lost(log)
    expect(1000 <= lost <= 1024, "leak: 1000 bytes (a block of 1024) definitely lost, got %d" % lost, log)
    expect(re.search(r"definitely lost in loss record[\s\S]*hak_malloc[\s\S]*leaky_function", log)
           is not None, "leak: allocated by leaky_function through hak_malloc", log)

    if failures:
        print("check_memcheck: %d failure(s)" % len(failures))
        return 1
    print("check_memcheck: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
