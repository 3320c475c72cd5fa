"""The core never imports a connector: nothing under ``twophase/`` imports ``twophase.sinks`` or
``twophase.sources`` (the Spark registry names its formats as strings, loaded on demand), so a
connector can be added, removed or broken without touching the core."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_layering_core_never_imports_a_connector():
    offenders = []
    for p in sorted((ROOT / "twophase").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{p.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                          if n.split(".")[:2] in (["twophase", "sinks"], ["twophase", "sources"])]
    assert offenders == []


def test_layering_log_and_its_stores_form_no_cycle():
    """``twophase.log_store`` imports neither the log nor a store; the S3 store imports the stores only."""
    def imports(name: str) -> set[str]:
        tree = ast.parse((ROOT / "twophase" / f"{name}.py").read_text())
        return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {"twophase.log", "twophase.log_s3"} & imports("log_store")
    assert "twophase.log" not in imports("log_s3")
