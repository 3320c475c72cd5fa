"""A nemesis campaign: N seeded scenarios on a Spark standalone cluster, then a summary table.

    python -m integration.nemesis.campaign --runs 30 --seed 7 [--sinks files,s3,delta,kafka,azure-files,azure-delta]
        [--faults executor_jvm,...] [--out DIR] [--keep]

Starts what it needs and stops it afterwards: a cluster (scripts/spark_cluster.sh; or
``TWOPHASE_SPARK_MASTER``), Azurite for azure-files and azure-delta, an S3 server for s3 and delta (scripts/s3_server.sh: radosgw, or moto with
``TWOPHASE_S3_SERVER=moto``, or ``TWOPHASE_S3_ENDPOINT``) and Kafka for kafka: a 3-broker Apache Kafka cluster
(scripts/kafka_cluster.sh; ``--kafka-brokers 1``: one broker by scripts/kafka_server.sh; or ``KAFKA_BOOTSTRAP_SERVERS``). Scenario ``i`` draws its sink and fault from ``random.Random(f"{seed}:{i}")``
(each sink and fault kind in turn when ``--runs`` covers them, so a 30-run campaign meets every pair
it can). Prints each outcome as it ends and the summary table (markdown) at the end; writes both
(``summary.md``, ``outcomes.json``) to ``--out``. Exit code 1 if any scenario failed. An outcome line
``kafka/pause seed=7.12 ...`` is replayed by ``--replay 7.12 --sinks kafka --faults pause``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Iterator

from integration.nemesis.harness import (FAULTS, SINKS, Cluster, Outcome, Servers, faults_for, new_tmp,
                                         run_scenario, summary)


def plan(runs: int, seed: int, sinks: list[str], faults: list[str]) -> list[tuple[str, str, str]]:
    """``runs`` (sink, fault, scenario seed): every allowed pair once in a seeded order, then seeded draws."""
    rng = random.Random(f"{seed}:plan")
    pairs = [(s, f) for s in sinks for f in faults if f == "matrix" or f in faults_for(s)]
    rng.shuffle(pairs)
    out = []
    for i in range(runs):
        sink, fault = pairs[i] if i < len(pairs) else rng.choice(pairs)
        out.append((sink, fault, f"{seed}.{i}"))
    return out


@contextlib.contextmanager
def servers_for(sinks: list[str], base: str, kafka_brokers: int = 3) -> Iterator[Servers]:
    with contextlib.ExitStack() as stack:
        external = os.environ.get("TWOPHASE_SPARK_MASTER")
        if external:
            cluster = Cluster(external)
        else:
            cluster = Cluster.start(os.path.join(base, "cluster"))
            stack.callback(cluster.stop)
        servers = Servers(cluster)
        if {"s3", "delta"} & set(sinks):
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "s3"))
            from _support import s3_server_fixture  # type: ignore
            gen = s3_server_fixture()
            servers.s3 = next(gen)
            stack.callback(lambda: next(gen, None))
        if any(s.startswith("azure-") for s in sinks):
            from integration.azure.azurite import azure_server_fixture
            agen = azure_server_fixture()
            servers.azure = next(agen)
            stack.callback(lambda: next(agen, None))
        if "postgres" in sinks:
            from integration.postgres.server import pg_server
            servers.postgres = stack.enter_context(pg_server())
        if "kafka" in sinks and kafka_brokers > 1 and not os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
            from integration.kafka.cluster import kafka_cluster
            servers.kafka_cluster = stack.enter_context(kafka_cluster(kafka_brokers))
            servers.kafka = servers.kafka_cluster.bootstrap
        elif "kafka" in sinks:
            from integration.kafka.broker import kafka_broker
            servers.kafka = stack.enter_context(kafka_broker())
        yield servers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    ap.add_argument("--sinks", default=",".join(SINKS))
    ap.add_argument("--faults", default=",".join(FAULTS),
                    help="fault kinds (default: all of them); 'matrix' is every protocol point in one chain")
    ap.add_argument("--kafka-brokers", type=int, default=3,
                    help="the kafka target's brokers: 3 (default) is the replicated cluster of scripts/kafka_cluster.sh "
                         "(needed by coordinator_kill, leader_kill, broker_pause); 1 is one broker (scripts/kafka_server.sh)")
    ap.add_argument("--out", default="", help="directory for summary.md and outcomes.json (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep every scenario's directories (default: failed ones)")
    ap.add_argument("--replay", default="", metavar="SCENARIO_SEED",
                    help="run one scenario with this seed (as an outcome prints it, e.g. 7.12) for the one "
                         "--sinks and --faults given")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    sinks = [s for s in args.sinks.split(",") if s]
    faults = [f for f in args.faults.split(",") if f]
    bad = [s for s in sinks if s not in SINKS] + [f for f in faults if f not in FAULTS + ("matrix",)]
    if bad:
        ap.error(f"unknown {bad}; sinks: {', '.join(SINKS)}; faults: {', '.join(FAULTS)}")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    out = args.out or tempfile.mkdtemp(prefix="twophase-nemesis-")
    os.makedirs(out, exist_ok=True)
    base = tempfile.mkdtemp(prefix="twophase-nemesis-work-")
    if args.replay:
        if len(sinks) != 1 or len(faults) != 1:
            ap.error("--replay needs exactly one --sinks and one --faults (as the outcome line names them)")
        scenarios = [(sinks[0], faults[0], args.replay)]
    else:
        scenarios = plan(args.runs, seed, sinks, faults)
    print(f"nemesis: seed {seed} (replay: scripts/nemesis.sh --seed {seed} --runs {args.runs} "
          f"--sinks {','.join(sinks)} --faults {','.join(faults)}); results in {out}", flush=True)
    outcomes: list[Outcome] = []
    started = time.monotonic()
    with servers_for(sinks, base, args.kafka_brokers) as servers:
        for i, (sink, fault, scenario_seed) in enumerate(scenarios):
            if not servers.available(sink):
                print(f"[{i + 1}/{len(scenarios)}] {sink}/{fault}: skipped (no server)", flush=True)
                continue
            tmp = new_tmp(base, sink, fault)
            print(f"[{i + 1}/{len(scenarios)}] {sink}/{fault} seed={scenario_seed}", flush=True)
            o = run_scenario(sink, fault, scenario_seed, servers, tmp,
                             log=lambda s: print(s, flush=True))
            outcomes.append(o)
            if o.ok and not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
            elif not o.ok:
                print(f"    kept for inspection: {tmp}", flush=True)
    table = summary(outcomes)
    minutes = (time.monotonic() - started) / 60
    header = (f"Nemesis campaign: seed {seed}, {len(outcomes)} runs, {minutes:.0f} min, "
              f"{time.strftime('%Y-%m-%d')}, Spark standalone cluster (2 workers x 1 core) on this machine")
    print("\n" + header + "\n\n" + table, flush=True)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(header + "\n\n" + table + "\n")
    with open(os.path.join(out, "outcomes.json"), "w") as f:
        json.dump([asdict(o) | {"ok": o.ok} for o in outcomes], f, indent=1)
    return 0 if outcomes and all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
