#!/usr/bin/env python3
"""The options table in the code (src/policy.c, printed as Markdown rows by
`test_memory --print-options`) and the tables in docs/CONFIG.md and README.md
must say the same: every row the code prints appears verbatim in both, and
neither lists a HAKMEM_ variable the code does not know."""
import re
import subprocess
import sys

exe, root = sys.argv[1], sys.argv[2]
rows = subprocess.run([exe, "--print-options"], capture_output=True, text=True, check=True).stdout.splitlines()
names = {re.match(r"\| `(HAKMEM_\w+)`", r).group(1) for r in rows}
failed = False
for doc in ("docs/CONFIG.md", "README.md"):
    text = open("%s/%s" % (root, doc)).read()
    for row in rows:
        if row not in text.splitlines():
            print("FAIL: %s lacks the row (or has it differently):\n  %s" % (doc, row))
            failed = True
    for listed in re.findall(r"^\| `(HAKMEM_\w+)`", text, re.M):
        if listed not in names:
            print("FAIL: %s lists %s, which the code does not know" % (doc, listed))
            failed = True
print("config tables: %s (%d options)" % ("FAIL" if failed else "ok", len(rows)))
sys.exit(1 if failed else 0)
