"""Run the Kafka sink's driver start (``prepare_sink``) as a driver on another host would, and print the outcome.

``python other_host.py '<sink options json>'`` with the caller's HOME, TWOPHASE_STATE_DIR and working
directory standing for another host's disk; prints one JSON line ``{"ok": bool, "error", "message"}``.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import pyarrow as pa

    from twophase.sinks.kafka import KafkaSink
    from twophase.spark.datasource import prepare_sink

    raw = json.loads(sys.argv[1])
    schema = pa.schema([("key", pa.binary()), ("value", pa.binary())])
    try:
        sink = KafkaSink.from_options(raw, schema)
        prepare_sink(sink, raw.get("checkpointLocation"), what="other-host")
        out = {"ok": True, "error": None, "message": ""}
    except Exception as e:
        out = {"ok": False, "error": type(e).__name__, "message": str(e)}
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
