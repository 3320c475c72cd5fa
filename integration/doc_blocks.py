"""Run the documentation's examples as written: take the ```python blocks of a Markdown page (or of one section
of it), run them in a fresh Python process with a plain ``SparkSession.builder.getOrCreate()`` and no test set-up,
and read the JSON line the appended check prints. Shared by the README's and docs pages' example tests."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]


def python_blocks(page: str, start: Optional[str] = None, end: Optional[str] = None) -> list[str]:
    """The ```python blocks of ``page`` (relative to the repository), in order; with ``start``, only those after
    the first line starting with it and before the next ``end`` (default: the end of the page)."""
    text = (ROOT / page).read_text()
    if start is not None:
        text = text[text.index(start):]
        if end is not None:
            text = text[:text.index(end, len(start))]
    return re.findall(r"```python\n(.*?)```", text, re.S)


def run_as_written(script: str, cwd: pathlib.Path, timeout: int = 600) -> Any:
    """Run ``script`` with this interpreter (also Spark's Python workers'); assert it succeeded; return the JSON
    value of its last output line."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, env=env,
                         cwd=str(cwd))
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])
