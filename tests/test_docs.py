"""Documented as built: every ```python block of the README and docs/ runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pagedkv.engine.policies import SCHEDULERS

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [
    pytest.param(code, id=f"{doc.name}:{i}")
    for doc in DOCS
    for i, code in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(), re.S))
]


def test_docs_have_examples() -> None:
    assert BLOCKS, "no runnable example found in README.md or docs/"


@pytest.mark.parametrize("code", BLOCKS)
def test_example_runs(code: str) -> None:
    known = dict(SCHEDULERS)  # an example may register a policy: known for that example only
    try:
        exec(compile(code, "<doc example>", "exec"), {"__name__": "__doc_example__"})
    finally:
        SCHEDULERS.clear()
        SCHEDULERS.update(known)


# A path a document names: a link or image target, or a backticked path in the repository.
PATH = re.compile(
    r"\]\((?!https?://|#)([^)\s]+)\)|`((?:docs|src|tests|benchmarks|configs)/[\w./-]+)`"
)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_path_a_document_names_exists(doc: Path) -> None:
    named = [a or b for a, b in PATH.findall(doc.read_text())]
    missing = [p for p in named if not (doc.parent / p).exists() and not (ROOT / p).exists()]
    assert not missing, f"{doc.name} names files that are not in the repository: {missing}"
