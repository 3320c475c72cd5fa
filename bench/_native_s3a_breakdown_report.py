"""Prints the tables of bench/native_s3a_breakdown.py: python bench/_native_s3a_breakdown_report.py PLOG OUT."""
import json, sys, collections, datetime, statistics, re
log, js = sys.argv[1], sys.argv[2]
reqs = []
for line in open(log):
    t, ms, meth, path, q, st, who, n = line.split()
    reqs.append((float(t), float(ms), meth, path, q, int(st), who, int(n)))
data = json.load(open(js))
def cat(meth, path, q):
    segs = path.split("/")
    if "uploads" in q and meth == "POST": return "initiate-mpu"
    if "uploadId" in q and meth == "PUT": return "upload-part"
    if "uploadId" in q and meth == "POST": return "complete-mpu"
    if "uploadId" in q and meth == "DELETE": return "abort-mpu"
    if "uploads" in q and meth == "GET": return "list-uploads"
    if "delete" in q: return "bulk-delete"
    if meth == "GET" and ("list-type" in q or "prefix" in q or len(segs) <= 2): return "list"
    kind = "data"
    if "__magic" in path: kind = "magic:" + (".pendingset" if path.endswith(".pendingset") else ".pending" if path.endswith(".pending") else "marker/dir" if path.endswith("/") or "." not in segs[-1][-9:] else "file")
    elif "_spark_metadata" in path: kind = "_spark_metadata"
    elif "/_twophase/" in path: kind = "twophase:" + ("s3a-manifest" if "/s3a/" in path else "log")
    elif path.endswith("/"): kind = "dir-marker"
    return f"{meth} {kind}"
for name, rec in data.items():
    prog = rec["progress"]
    nb = len(prog)
    counts = collections.Counter(); ms_by = collections.Counter()
    for p in prog:
        ts = datetime.datetime.strptime(p["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc).timestamp()
        end = ts + p["d"]["triggerExecution"] / 1e3
        for r in reqs:
            if ts <= r[0] <= end:
                k = (r[6], cat(r[2], r[3], r[4]))
                counts[k] += 1; ms_by[k] += r[1]
    d = {k: statistics.median(p["d"].get(k, 0) for p in prog) for k in prog[0]["d"]}
    print(f"== {name}: {nb} batches; median durationMs {d}")
    if "timings" in rec:
        ts = [t for t in rec["timings"] if t["batch_id"] >= 1]
        print("   native prepare/write/commit ms (median):", *(round(statistics.median(t[k] for t in ts), 1) for k in ("prepare_ms", "write_ms", "commit_ms")))
    for k, v in rec.get("funcs", {}).items():
        print(f"   py {k:45} calls/batch {len(v)/len(rec['timings']):.1f}  ms/batch {sum(v)/len(rec['timings']):.1f}")
    tot = sum(counts.values())
    print(f"   requests/batch: {tot/nb:.1f}")
    for k, v in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"   {k[0]:5} {k[1]:32} {v/nb:6.1f}/batch  {ms_by[k]/nb:7.1f} ms/batch (sum of latencies)")
