#!/usr/bin/env python3
"""malloc_info's XML, as test_malloc_info writes it while holding 100 blocks
of one class and a huge block: well formed, shaped like glibc's, and its
figures agreeing with what the program held and with mallinfo2 taken just
before.  Usage: check_malloc_info.py TEST_MALLOC_INFO WORKDIR"""
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

exe, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
path = os.path.join(work, "malloc_info.xml")
run = subprocess.run([exe, path], capture_output=True, text=True)
sys.stderr.write(run.stderr)
if run.returncode != 0:
    print("FAIL: %s exited with %d" % (exe, run.returncode))
    sys.exit(1)
held = dict(kv.split("=") for kv in run.stdout.splitlines()[0].split())
held = {k: int(v) for k, v in held.items()}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


text = open(path).read()
try:
    root = ET.fromstring(text)
except ET.ParseError as e:
    print("FAIL: malloc_info's output is not well-formed XML: %s\n%s" % (e, text))
    sys.exit(1)


def num(el, attr):
    return int(el.get(attr))


def typed(parent, tag):
    return {el.get("type"): el for el in parent.findall(tag)}


check(root.tag == "malloc" and root.get("version") == "1", "root is <malloc version=\"1\">")
heaps = root.findall("heap")
check(len(heaps) == 1 and heaps[0].get("nr") == "0", "one <heap nr=\"0\">")
heap = heaps[0]
sizes = heap.findall("sizes/size")
check(len(sizes) > 0, "<sizes> lists the classes in use")

# The heap's elements and the whole process's, as glibc has them.
h_total, h_system, h_aspace = typed(heap, "total"), typed(heap, "system"), typed(heap, "aspace")
check(set(h_total) == {"fast", "rest"}, "heap: <total> fast and rest")
check(set(h_system) == {"current", "max"}, "heap: <system> current and max")
check(set(h_aspace) == {"total", "mprotect"}, "heap: <aspace> total and mprotect")
t_total, t_system, t_aspace = typed(root, "total"), typed(root, "system"), typed(root, "aspace")
check(set(t_total) == {"fast", "rest", "mmap"}, "process: <total> fast, rest and mmap")
check(set(t_system) == {"current", "max"}, "process: <system> current and max")
check(set(t_aspace) == {"total", "mprotect"}, "process: <aspace> total and mprotect")
if failures:
    print("FAIL:\n  " + "\n  ".join(failures) + "\n" + text)
    sys.exit(1)

# Each class: its free blocks (count, total bytes), blocks handed out (live).
fast = [0, 0]
rest = [0, 0]
live_bytes = 0
large = False
prev_to = 0
for s in sizes:
    lo, hi, total, count, live = (num(s, a) for a in ("from", "to", "total", "count", "live"))
    check(lo <= hi and lo > prev_to, "classes in order: %s" % ET.tostring(s).decode())
    prev_to = hi
    if hi > 128 * 1024:  # large blocks, one per page, each of its own size
        large = True
        continue
    check(total == count * hi, "class %d: total = count * block size" % hi)
    live_bytes += live * hi
    acc = fast if hi <= 1024 else rest
    acc[0] += count
    acc[1] += total

ours = [s for s in sizes if num(s, "from") <= held["usable"] <= num(s, "to")]
check(len(ours) == 1, "one class holds blocks of usable size %d" % held["usable"])
if ours:
    check(num(ours[0], "live") == held["blocks"],
          "class %s: live %s, the program held %d" % (ours[0].get("to"), ours[0].get("live"), held["blocks"]))
    check(num(ours[0], "pages") >= 1, "class of the blocks: pages")

check([num(h_total["fast"], "count"), num(h_total["fast"], "size")] == fast,
      "fast = the free blocks of the classes up to 1 KiB: %s" % fast)
check(num(h_total["rest"], "count") >= rest[0] and num(h_total["rest"], "size") >= rest[1],
      "rest holds the free blocks of the larger classes")
for kind in ("fast", "rest"):
    check(h_total[kind].attrib == t_total[kind].attrib, "process %s = heap %s" % (kind, kind))

# The huge block, and mallinfo2 taken just before.
mmap = t_total["mmap"]
check(num(mmap, "count") == 1 == held["hblks"], "mmap count 1 (mallinfo2 hblks %d)" % held["hblks"])
check(num(mmap, "size") == held["hblkhd"] >= held["huge_size"], "mmap size = mallinfo2 hblkhd")
if not large:
    check(live_bytes == held["uordblks"], "live bytes %d = mallinfo2 uordblks %d" % (live_bytes, held["uordblks"]))

# Committed and mapped bytes hold at least what is live.
cur, peak = num(t_system["current"], "size"), num(t_system["max"], "size")
check(cur >= live_bytes + num(mmap, "size"), "process: system current >= live bytes")
check(peak >= cur, "system max >= current")
check(num(h_system["current"], "size") >= live_bytes, "heap: system current >= its live bytes")
check(num(h_system["current"], "size") <= cur, "heap: system current within the process's")
check(num(h_aspace["total"], "size") >= held["arena"], "heap: aspace total >= mallinfo2 arena")
check(num(t_aspace["total"], "size") >= num(h_aspace["total"], "size") + num(mmap, "size"),
      "process: aspace total >= the heap's and the huge block's")

if failures:
    print("FAIL:\n  " + "\n  ".join(failures) + "\n" + text)
    sys.exit(1)
print("malloc_info: ok (%d classes, %d blocks of %d bytes found live)" % (len(sizes), held["blocks"], held["usable"]))
