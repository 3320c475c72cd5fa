"""Docstrings that name tests name real ones: every module whose docstring says its invariants are
"named in tests as ``test_<name>_invN_*``" has, for each numbered invariant N of that docstring, at
least one test function ``test_<name>_invN_...`` in ``tests/`` or ``integration/``."""

from __future__ import annotations

import ast
import functools
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = [p for d in ("twophase", "sinks", "sources") for p in sorted((ROOT / d).rglob("*.py"))]
PATTERN = re.compile(r"``test_([a-z0-9_]+?)_invN_\*``")


@functools.lru_cache(maxsize=1)
def _test_names() -> frozenset[str]:
    names: set[str] = set()
    for d in ("tests", "integration"):
        for p in (ROOT / d).rglob("test_*.py"):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                    names.add(node.name)
    # the conformance checks run as test_sink_conformance[<sink>-invN_...] for every sink
    for p in [ROOT / "twophase" / "testing.py"]:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("conformance_inv"):
                names.add("test_sink_" + node.name.removeprefix("conformance_"))
    return frozenset(names)


def _claims() -> list[tuple[str, str, int]]:
    out = []
    for p in SOURCES:
        doc = ast.get_docstring(ast.parse(p.read_text())) or ""
        matches = list(PATTERN.finditer(doc))
        for i, m in enumerate(matches):
            # the numbered list between this sentence naming tests and the next one
            tail = doc[m.end():matches[i + 1].start() if i + 1 < len(matches) else len(doc)]
            numbers = {int(n) for n in re.findall(r"^(\d+)\. ", tail, re.M)}
            for n in sorted(numbers):
                out.append((str(p.relative_to(ROOT)), m.group(1), n))
    return out


def _covers(test: str, name: str, n: int) -> bool:
    """``test_<name>_inv1_inv2_...`` and ``test_<name>_inv5_to_7_...`` cover several invariants."""
    if not test.startswith(f"test_{name}_inv"):
        return False
    rest = test[len(f"test_{name}_"):]
    if re.search(rf"(^|_)inv{n}_", rest):
        return True
    return any(int(a) <= n <= int(b) for a, b in re.findall(r"inv(\d+)_to_(\d+)_", rest))


CLAIMS = _claims()


def test_docs_name_at_least_the_core_modules():
    assert {"coordinator", "log", "sink", "file_sink", "s3_sink", "delta_sink", "kafka_sink"} <= {c[1] for c in CLAIMS}


@pytest.mark.parametrize("where,name,n", CLAIMS, ids=[f"{c[1]}_inv{c[2]}" for c in CLAIMS])
def test_every_invariant_a_docstring_names_has_a_test(where, name, n):
    assert any(_covers(t, name, n) for t in _test_names()), f"{where} names test_{name}_inv{n}_* but no such test exists"
