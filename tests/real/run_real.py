#!/usr/bin/env python3
"""Runs a real program with and without LD_PRELOAD=libhakmem.so: its stdout
must be byte-identical and both runs must succeed; a third run with
HAKMEM_STATS=1 must print hakmem's statistics line on stderr with pages>0
(proof that hakmem served the program), and the run without HAKMEM_STATS
must not print it.

Usage: run_real.py --lib LIBHAKMEM --work DIR CASE [ARGS]
  python SCRIPT      the interpreter running this driver, PYTHONMALLOC=malloc
  sort               GNU sort (LC_ALL=C) on a generated multi-megabyte file
  cxx BINARY         a C++ program built without hakmem
  sqlite3            the sqlite3 shell on a scripted workload (tables, indexes,
                     joins, aggregates, updates) in an in-memory database
  git                read-only git commands (log with diffs, grep, rev-list,
                     archive) on a generated repository of 30 commits
  redis              redis-server on loopback: a scripted session through
                     redis-cli (its replies compared) and redis-benchmark
                     with a bounded number of requests (make test-real)
"""
import argparse
import hashlib
import os
import random
import re
import subprocess
import sys

TIMEOUT = 150


def generate_sort_input(path):
    """About 12 MB of lines, the same on every run."""
    rng = random.Random(20240607)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "
    pool = "".join(rng.choices(alphabet, k=1 << 20))
    lines = []
    for _ in range(250000):
        off = rng.randrange(len(pool) - 64)
        word = pool[off:off + rng.randint(1, 60)]
        lines.append("%08x\t%d\t%s\n" % (rng.getrandbits(32), rng.randint(-10**6, 10**6), word))
    with open(path, "w", encoding="ascii") as f:
        f.write("".join(lines))


SQLITE_SCRIPT = """
CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT, grp INTEGER, price REAL, note TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 60000)
INSERT INTO item SELECT i, 'item-' || (i * 7919 % 60000), i % 97, (i * 37 % 1000) / 10.0,
  printf('%0*d', 1 + i % 300, i) FROM n;
CREATE TABLE grp(id INTEGER PRIMARY KEY, label TEXT);
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 96)
INSERT INTO grp SELECT i, 'group ' || i FROM n;
CREATE INDEX item_name ON item(name);
CREATE INDEX item_grp_price ON item(grp, price);
SELECT count(*), sum(price), min(name), max(name), sum(length(note)) FROM item;
SELECT g.label, count(*), round(avg(i.price), 3), max(length(i.note))
  FROM item i JOIN grp g ON g.id = i.grp GROUP BY g.id ORDER BY g.id;
SELECT name, price FROM item WHERE name LIKE 'item-12%' ORDER BY name LIMIT 50;
UPDATE item SET note = note || note WHERE id % 5 = 0;
DELETE FROM item WHERE id % 7 = 0;
SELECT count(*), sum(length(note)) FROM item;
SELECT grp, group_concat(id, ',') FROM (SELECT grp, id FROM item WHERE id < 3000 ORDER BY id) GROUP BY grp;
VACUUM;
SELECT count(*) FROM item i1 JOIN item i2 ON i1.grp = i2.grp AND i1.id < i2.id WHERE i1.id < 2000 AND i2.id < 2000;
"""


def make_git_repo(repo):
    """A repository of 30 commits over 200 files, the same on every run."""
    if os.path.isdir(os.path.join(repo, ".git")):
        return
    os.makedirs(repo, exist_ok=True)
    env = dict(os.environ, GIT_AUTHOR_NAME="hakmem", GIT_AUTHOR_EMAIL="hakmem@example.org",
               GIT_COMMITTER_NAME="hakmem", GIT_COMMITTER_EMAIL="hakmem@example.org",
               GIT_CONFIG_NOSYSTEM="1", HOME=repo)
    git = ["git", "-C", repo, "-c", "init.defaultBranch=main", "-c", "core.autocrlf=false"]
    subprocess.run(git + ["init", "-q"], env=env, check=True)
    rng = random.Random(4242)
    words = ["alloc", "free", "page", "segment", "heap", "thread", "block", "class", "purge", "unit"]
    for c in range(30):
        for _ in range(40 if c else 200):
            k = rng.randrange(200)
            path = os.path.join(repo, "src%d" % (k % 8), "file%03d.txt" % k)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a", encoding="ascii") as f:
                for _ in range(rng.randint(1, 30)):
                    f.write(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "\n")
        date = "2024-01-01T00:00:%02d+00:00" % c
        subprocess.run(git + ["add", "-A"], env=env, check=True)
        subprocess.run(git + ["commit", "-q", "-m", "commit %d" % c],
                       env=dict(env, GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date), check=True)


def run(cmd, env, label):
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        print("FAIL: %s: timed out after %d s" % (label, TIMEOUT))
        return None
    if p.returncode != 0:
        print("FAIL: %s: exit status %d" % (label, p.returncode))
        sys.stdout.write(p.stderr.decode(errors="replace")[-4000:])
        return None
    return p


def check_program(name, cmds, base_env, lib):
    failures = 0
    plain_env = dict(base_env)
    plain_env.pop("LD_PRELOAD", None)
    plain_env.pop("HAKMEM_STATS", None)
    pre_env = dict(plain_env, LD_PRELOAD=lib)
    stats_env = dict(pre_env, HAKMEM_STATS="1")
    for i, cmd in enumerate(cmds):
        tag = "%s[%d] %s" % (name, i, " ".join(os.path.basename(c) if j == 0 else c
                                                 for j, c in enumerate(cmd)))
        base = run(cmd, plain_env, tag + " without hakmem")
        pre = run(cmd, pre_env, tag + " with LD_PRELOAD")
        stats = run(cmd, stats_env, tag + " with LD_PRELOAD and HAKMEM_STATS=1")
        if base is None or pre is None or stats is None:
            failures += 1
            continue
        digest = hashlib.sha256(base.stdout).hexdigest()[:16]
        print("%s: %d bytes of output, sha256 %s" % (tag, len(base.stdout), digest))
        if len(base.stdout) == 0:
            print("FAIL: %s: no output" % tag)
            failures += 1
        for label, p in (("LD_PRELOAD", pre), ("LD_PRELOAD + HAKMEM_STATS", stats)):
            if p.stdout != base.stdout:
                failures += 1
                a, b = base.stdout, p.stdout
                k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
                print("FAIL: %s: stdout with %s differs (%d vs %d bytes, first difference at %d)"
                      % (tag, label, len(a), len(b), k))
                print("  without: %r" % a[max(0, k - 60):k + 60])
                print("  with:    %r" % b[max(0, k - 60):k + 60])
        if b"hakmem: stats" in pre.stderr:
            print("FAIL: %s: statistics printed without HAKMEM_STATS" % tag)
            failures += 1
        lines = [l for l in stats.stderr.decode(errors="replace").splitlines()
                 if l.startswith("hakmem: stats ")]
        if len(lines) != 1:
            print("FAIL: %s: expected one 'hakmem: stats' line on stderr with HAKMEM_STATS=1, got %d"
                  % (tag, len(lines)))
            sys.stdout.write(stats.stderr.decode(errors="replace")[-2000:])
            failures += 1
            continue
        kv = dict(re.findall(r"(\w+)=(\S+)", lines[0]))
        print("  " + lines[0])
        try:
            pages = int(kv.get("pages", "-1"))
        except ValueError:
            pages = -1
        if pages <= 0:
            print("FAIL: %s: stats line shows pages=%s, want > 0" % (tag, kv.get("pages")))
            failures += 1
        if "segments" not in kv:
            print("FAIL: %s: stats line has no segments=" % tag)
            failures += 1
    return failures


REDIS_SCRIPT = "".join(
    ["SET key:%d %s\n" % (i, "v" * (i % 500 + 1)) for i in range(2000)]
    + ["RPUSH list:%d %s\n" % (i % 50, " ".join("e%d" % k for k in range(i % 40 + 1))) for i in range(1000)]
    + ["HSET hash:%d %s\n" % (i % 30, " ".join("f%d %d" % (k, k * i) for k in range(20))) for i in range(600)]
    + ["SADD set:%d %s\n" % (i % 20, " ".join("m%d" % ((k * 7 + i) % 300) for k in range(30))) for i in range(400)]
    + ["DEL key:%d\n" % i for i in range(0, 2000, 3)]
    + ["GET key:%d\n" % i for i in range(0, 2000, 7)]
    + ["LRANGE list:%d 0 -1\n" % i for i in range(50)]
    + ["HGETALL hash:%d\n" % i for i in range(30)]
    + ["SORT set:%d ALPHA\n" % i for i in range(20)]
    + ["DBSIZE\n", "FLUSHALL\n", "DBSIZE\n"])


def check_redis(env, lib, work):
    """redis-server three times (without hakmem, with it, with its statistics):
    the same scripted session must get the same replies, redis-benchmark must
    complete, and the statistics run must show hakmem served the server."""
    import socket
    import time
    failures = 0
    plain = dict(env)
    plain.pop("LD_PRELOAD", None)
    plain.pop("HAKMEM_STATS", None)
    replies = {}
    for label, server_env in (("without hakmem", plain), ("with LD_PRELOAD", dict(plain, LD_PRELOAD=lib)),
                              ("with LD_PRELOAD and HAKMEM_STATS=1", dict(plain, LD_PRELOAD=lib, HAKMEM_STATS="1"))):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        log = open(os.path.join(work, "redis-server.log"), "w+b")
        server = subprocess.Popen(["redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--dir", work], env=server_env,
                                  stdout=log, stderr=log)
        try:
            cli = ["redis-cli", "-p", port]
            for _ in range(100):
                if subprocess.run(cli + ["PING"], env=plain, capture_output=True).stdout.strip() == b"PONG":
                    break
                time.sleep(0.1)
            else:
                print("FAIL: redis %s: the server did not answer" % label)
                failures += 1
                continue
            p = subprocess.run(cli, input=REDIS_SCRIPT.encode(), env=plain, capture_output=True, timeout=TIMEOUT)
            replies[label] = p.stdout
            b = subprocess.run(["redis-benchmark", "-p", port, "-q", "-n", "20000", "-c", "8",
                                "-t", "set,get,incr,lpush,rpop,sadd,hset,mset", "-d", "300"],
                               env=plain, capture_output=True, timeout=TIMEOUT)
            if b.returncode != 0 or b"requests per second" not in b.stdout:
                print("FAIL: redis %s: redis-benchmark failed: %r" % (label, b.stdout[-300:] + b.stderr[-300:]))
                failures += 1
            subprocess.run(cli + ["SHUTDOWN", "NOSAVE"], env=plain, capture_output=True)
            server.wait(timeout=30)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
        log.seek(0)
        text = log.read().decode(errors="replace")
        log.close()
        print("redis %s: %d bytes of replies, sha256 %s, server exit %d" % (
            label, len(replies.get(label, b"")), hashlib.sha256(replies.get(label, b"")).hexdigest()[:16],
            server.returncode))
        if server.returncode != 0:
            print("FAIL: redis %s: server exit status %d\n%s" % (label, server.returncode, text[-2000:]))
            failures += 1
        stats = [l for l in text.splitlines() if l.startswith("hakmem: stats ")]
        if "HAKMEM_STATS" in server_env:
            m = re.search(r"pages=(\d+)", stats[0]) if len(stats) == 1 else None
            if m is None or int(m.group(1)) <= 0:
                print("FAIL: redis %s: no statistics line showing pages > 0" % label)
                failures += 1
            else:
                print("  " + stats[0])
        elif stats:
            print("FAIL: redis %s: statistics printed without HAKMEM_STATS" % label)
            failures += 1
    base = replies.get("without hakmem")
    if not base:
        print("FAIL: redis: no replies without hakmem")
        failures += 1
    for label, r in replies.items():
        if r != base:
            print("FAIL: redis %s: the replies differ from those without hakmem" % label)
            failures += 1
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("case", choices=["python", "sort", "cxx", "sqlite3", "git", "redis"])
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    lib = os.path.abspath(a.lib)
    if not os.path.exists(lib):
        print("FAIL: %s does not exist" % lib)
        return 1
    os.makedirs(a.work, exist_ok=True)
    env = dict(os.environ, LC_ALL="C")

    if a.case == "python":
        env.update(PYTHONMALLOC="malloc", PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
        cmds = [[sys.executable, "-I", a.args[0]]]
    elif a.case == "sort":
        data = os.path.join(a.work, "sort_input.txt")
        generate_sort_input(data)
        tmp = os.path.join(a.work, "sort_tmp")
        os.makedirs(tmp, exist_ok=True)
        cmds = [
            ["sort", data],
            ["sort", "-t", "\t", "-k2,2n", "-k3", data],
            # Small buffer and several threads: temporary files, merges.
            ["sort", "--parallel=4", "-S", "1M", "-T", tmp, "-k3", "-s", data],
        ]
    elif a.case == "sqlite3":
        script = os.path.join(a.work, "workload.sql")
        with open(script, "w", encoding="ascii") as f:
            f.write(SQLITE_SCRIPT)
        cmds = [["sqlite3", "-batch", ":memory:", ".read " + script]]
    elif a.case == "redis":
        cmds = []
    elif a.case == "git":
        repo = os.path.join(a.work, "git_repo")
        make_git_repo(repo)
        env.update(GIT_CONFIG_NOSYSTEM="1", HOME=repo, GIT_PAGER="cat")
        git = ["git", "-C", repo]
        cmds = [
            git + ["log", "-p", "--stat", "--format=%H %s"],
            git + ["grep", "-c", "segment", "HEAD~10"],
            git + ["rev-list", "--objects", "--all"],
            git + ["archive", "--format=tar", "HEAD~3"],
            git + ["diff", "HEAD~20", "HEAD", "--numstat"],
        ]
    else:
        cmds = [[os.path.abspath(a.args[0])]]

    if a.case == "redis":
        failures = check_redis(env, lib, a.work)
    else:
        failures = check_program(a.case, cmds, env, lib)
    if failures:
        print("real_%s: %d failure(s)" % (a.case, failures))
        return 1
    print("real_%s: ok" % a.case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
