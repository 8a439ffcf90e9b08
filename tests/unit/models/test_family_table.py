"""docs/MODELS.md's family table is the one the real configs give (regenerate it with
``python -m tests.unit.models.family_table``)."""

from __future__ import annotations

from tests.unit.models.family_table import DOC, document_with_table


def test_the_family_table_in_the_docs_is_current() -> None:
    document = DOC.read_text()
    assert document == document_with_table(document), (
        "docs/MODELS.md's table is stale: run python -m tests.unit.models.family_table"
    )
    # Every family with state layers appears with its state.
    for name in ("Mamba1", "Mamba2", "GDN", "lightning"):
        assert f" {name}, " in document or f" {name} (" in document
