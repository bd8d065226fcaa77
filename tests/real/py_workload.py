"""An allocation-heavy Python workload with deterministic output: dicts,
lists, strings, sets, JSON, and a few threads.  Run with PYTHONMALLOC=malloc
so that every object goes through the C allocator."""
import hashlib
import json
import random
import threading


def digest(obj):
    return hashlib.sha256(repr(obj).encode()).hexdigest()[:16]


def words(rng, n):
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def dict_phase(seed):
    rng = random.Random(seed)
    index = {}
    ws = words(rng, 40000)
    for i, w in enumerate(ws):
        index.setdefault(w[:3], []).append((w, i))
    # Grow and shrink: delete half of the keys, rebuild them as strings.
    for k in sorted(index)[::2]:
        del index[k]
    text = {k: " ".join(w for w, _ in v) for k, v in index.items()}
    big = "|".join(text[k] for k in sorted(text))
    return len(index), len(big), digest(sorted(text.items())[:50])


def list_phase(seed):
    rng = random.Random(seed)
    rows = [[rng.random() for _ in range(rng.randint(0, 40))] for _ in range(20000)]
    rows.sort(key=lambda r: (len(r), r[:1]))
    flat = [x for r in rows for x in r]
    chunks = [flat[i:i + 1000] for i in range(0, len(flat), 1000)]
    sums = [round(sum(c), 6) for c in chunks]
    return len(flat), len(chunks), digest(sums)


def string_phase(seed):
    rng = random.Random(seed)
    parts = []
    for i in range(30000):
        s = "%d:%s" % (i, "x" * rng.randint(0, 300))
        parts.append(s.upper() if i % 3 == 0 else s[::-1])
    joined = ",".join(parts)
    pieces = joined.split(",")
    counts = {}
    for p in pieces:
        counts[len(p) % 17] = counts.get(len(p) % 17, 0) + 1
    enc = json.dumps({"parts": pieces[:2000], "counts": counts}, sort_keys=True)
    back = json.loads(enc)
    return len(joined), len(back["parts"]), digest(sorted(back["counts"].items()))


def set_phase(seed):
    rng = random.Random(seed)
    a = {rng.randrange(1 << 40) for _ in range(60000)}
    b = {x ^ 1 for x in a if x & 4}
    c = a.symmetric_difference(b)
    return len(a), len(b), len(c), digest(sorted(c)[:100])


def thread_job(tid, out):
    rng = random.Random(1000 + tid)
    local = {}
    for i in range(50000):
        k = rng.randrange(5000)
        local[k] = local.get(k, "") + chr(97 + i % 26)
        if len(local[k]) > 50:
            local[k] = local[k][25:]
    out[tid] = (len(local), digest(sorted(local.items())))


def main():
    print("dicts", dict_phase(1))
    print("lists", list_phase(2))
    print("strings", string_phase(3))
    print("sets", set_phase(4))
    out = [None] * 4
    threads = [threading.Thread(target=thread_job, args=(t, out)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for t, r in enumerate(out):
        print("thread", t, r)
    # Objects made by the threads are released here, by the main thread.
    del out
    print("done")


if __name__ == "__main__":
    main()
