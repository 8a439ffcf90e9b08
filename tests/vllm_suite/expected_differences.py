"""vLLM 0.23.0 tests that kvspec does not run as-is, each with its reason (read by shim_conftest.py).

EXPECTED_DIFFERENCES: kvspec deliberately behaves differently (a documented fix); a kvspec test shows the
fixed behaviour (named in the reason). OUT_OF_SCOPE: the test checks something kvspec does not implement
(vLLM internals rather than behaviour, a GPU kernel, a model file the hub would supply).
Keys are pytest node ids relative to the unpacked tests (parametrized ids may be given without brackets).
"""

from __future__ import annotations

EXPECTED_DIFFERENCES: dict[str, str] = {}

OUT_OF_SCOPE: dict[str, str] = {}
