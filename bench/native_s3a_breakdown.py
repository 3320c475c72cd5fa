"""The per-batch breakdown of the native path on s3a:// in docs/benchmarks.md ("Where the gap was"): one
SparkSession, one round of four queries in turn (writeStream noop, a foreachBatch doing only a noop write,
Spark's file sink on s3a://, native_sink('parquet') on s3a://), each query's durationMs per batch, the native
sink's prepare/write/commit and the time in a few twophase functions, and every S3 request through a counting
proxy in front of radosgw (bench/_s3_count_proxy.py; NOPROXY=1 for the timings: the proxy delays PUTs that
send Expect: 100-continue, so its timings are not usable, only its counts). Writes OUT (json) and PLOG
(the proxy's log); bench/_native_s3a_breakdown_report.py PLOG OUT prints the tables. Environment: ROWS,
BATCHES, MODES, ROUNDS, EXTRA (JSON of extra Spark settings, e.g. the in-memory magic tracking), ROOT/JAR
(another checkout and committer jar, for a before/after). Run under the Spark lock:

    flock /tmp/twophase-spark.lock env EXTRA='{"spark.hadoop.fs.s3a.committer.magic.track.commits.in.memory.enabled":"true"}' \
        .venv/bin/python bench/native_s3a_breakdown.py
"""
import json, os, socket, subprocess, sys, tempfile, time, uuid, statistics
ROOT = os.environ.get("ROOT", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT); sys.path.insert(0, ROOT + "/bench")
from _s3bench import endpoint, stop
from _sparkbench import time_batches
from integration.s3 import s3a
ROWS = int(os.environ.get("ROWS", "300000")); BATCHES = int(os.environ.get("BATCHES", "4"))
MODES = os.environ.get("MODES", "stream-noop,fb-noop,spark-s3a,native-s3a").split(",")
EXTRA = json.loads(os.environ.get("EXTRA", "{}"))   # extra s3a hadoop conf for the session
JAR = os.environ.get("JAR", ROOT + "/.venv/jvm/s3a-committer/twophase-s3a-committer.jar")
os.environ["TWOPHASE_EXPERIMENTAL_S3A"] = "1"
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
ep, sd = endpoint()
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
logf = os.environ.get("PLOG", "/tmp/twophase-s3a-breakdown-proxy.log")
open(logf, "w").close()
proxy = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_s3_count_proxy.py"), str(port), ep.split("//")[1], logf])
import atexit; atexit.register(proxy.terminate); time.sleep(1)
pep = f"http://127.0.0.1:{port}" if os.environ.get("NOPROXY") != "1" else ep
os.environ.update({"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                   "TWOPHASE_S3_ENDPOINT": pep, "AWS_ENDPOINT_URL": pep})
import boto3
client = boto3.client("s3", endpoint_url=pep, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1")
bucket = f"bd-{uuid.uuid4().hex[:8]}"; client.create_bucket(Bucket=bucket)
from pyspark.sql import SparkSession
from integration.spark_session import own_spark
import twophase.spark
b = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
conf = s3a.spark_conf(pep, "test", "test"); conf["spark.jars"] += "," + JAR
for k, v in {**conf, **EXTRA}.items():
    b = b.config(k, v)
spark = own_spark(b); twophase.spark.register(spark)
import functools, importlib
TIMES = {}
def wrap(modname, qual):
    mod = importlib.import_module(modname)
    owner, _, attr = qual.rpartition(".")
    obj = getattr(mod, owner) if owner else mod
    f = getattr(obj, attr)
    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            TIMES.setdefault(qual, []).append((time.perf_counter() - t) * 1e3)
    setattr(obj, attr, w)
for m, q in [("twophase.spark.native", "NativeSink._prepare"), ("twophase.spark.native", "NativeSink._check_columns"),
             ("twophase.spark.native", "NativeSink._spark_write"),
             ("twophase.sinks.native_s3a", "S3ANativeTarget.committables"), ("twophase.coordinator", "CheckpointCoordinator.complete_batch"),
             ("twophase.coordinator", "CheckpointCoordinator.recover"), ("twophase.log", "TransactionLog.transition"),
             ("twophase.log", "TransactionLog.claim"), ("twophase.log", "TransactionLog._list"), ("twophase.log", "TransactionLog.prune"),
             ("twophase.sinks.s3", "S3Committer.commit_checkpoint"), ("twophase.sinks.s3", "S3Committer.abort_lingering"),
             ("twophase.sinks.native_s3a", "delete_magic_leftovers"), ("twophase.sinks.s3", "S3Sink.validate_destination"),
             ("twophase.spark.datasource", "checkpoint_query_id")]:
    try:
        wrap(m, q)
    except Exception as e:
        print("no", m, q, e)
s3o = {"s3.endpoint": pep, "s3.accessKeyId": "test", "s3.secretAccessKey": "test", "s3.region": "us-east-1"}
work = tempfile.mkdtemp()
def src():
    return spark.readStream.format("rate-micro-batch").option("rowsPerBatch", ROWS).option("numPartitions", 2).load()
out = {}
class A: timeout = 600
for rnd in range(int(os.environ.get("ROUNDS", "1"))):
  for m in MODES:
    ck = f"{work}/{m}-{rnd}"; path = f"s3a://{bucket}/{m}-{rnd}"
    t0 = time.time(); stats = None
    if m == "stream-noop":
        q = src().writeStream.format("noop").option("checkpointLocation", ck)
    elif m == "fb-noop":
        q = src().writeStream.foreachBatch(lambda df, i: df.write.format("noop").mode("overwrite").save()).option("checkpointLocation", ck)
    elif m == "spark-s3a":
        q = src().writeStream.format("parquet").option("path", path).option("checkpointLocation", ck)
    elif m == "native-s3a":
        sink = twophase.spark.native_sink("parquet", path=path, checkpointLocation=ck, **s3o); stats = sink.stats
        q = src().writeStream.foreachBatch(sink).option("checkpointLocation", ck)
    q = q.trigger(processingTime="0 seconds").start()
    deadline = time.time() + 600
    while time.time() < deadline:
        p = q.lastProgress
        if p is not None and p["batchId"] >= BATCHES: break
        q.awaitTermination(0.2)
    prog = [p for p in q.recentProgress if 1 <= p["batchId"] <= BATCHES]
    q.stop()
    rec = {"progress": [{"batch": p["batchId"], "ts": p["timestamp"], "d": p["durationMs"]} for p in prog]}
    if stats is not None:
        rec["timings"] = [t.__dict__ for t in stats.timings]
        rec["funcs"] = {k: v for k, v in TIMES.items()}
    TIMES.clear()
    out[f"{m}-{rnd}"] = rec
    print(m, rnd, statistics.median(p["d"]["triggerExecution"] for p in rec["progress"]), flush=True)
spark.stop(); proxy.terminate(); stop(sd)
json.dump(out, open(os.environ.get("OUT", "/tmp/twophase-s3a-breakdown.json"), "w"), indent=1)
