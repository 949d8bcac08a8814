"""Paired comparison of two sets of jsonl runs, per job: 95%<=15, 97%<=40, mean best after 15/40, wins/losses."""
import json, sys, statistics
def load(files):
    out = {}
    for f in files:
        for l in open(f):
            r = json.loads(l); bt = [x / r['optimum'] for x in r['best_true']]
            out[(r['job'], r['machine'], r['seed'])] = bt
    return out
a = load(sys.argv[1].split(",")); b = load(sys.argv[2].split(","))
keys = sorted(set(a) & set(b))
for job in sorted({k[0] for k in keys}):
    ks = [k for k in keys if k[0] == job]
    def stats(d):
        p95 = [any(x >= 0.95 for x in d[k][:15]) for k in ks]; p97 = [any(x >= 0.97 for x in d[k][:40]) for k in ks]
        return p95, p97
    a95, a97 = stats(a); b95, b97 = stats(b)
    g95 = sum(y and not x for x, y in zip(a95, b95)); l95 = sum(x and not y for x, y in zip(a95, b95))
    g97 = sum(y and not x for x, y in zip(a97, b97)); l97 = sum(x and not y for x, y in zip(a97, b97))
    d15 = [b[k][14] - a[k][14] for k in ks]; d40 = [b[k][-1] - a[k][-1] for k in ks]
    print(f"{job} n={len(ks)} 95%<=15 {sum(a95)}->{sum(b95)} (+{g95} -{l95}) 97%<=40 {sum(a97)}->{sum(b97)} (+{g97} -{l97}) "
          f"best15 {statistics.mean(d15):+.4f} best40 {statistics.mean(d40):+.4f}")
