"""A small reference engine that proves the pipeline: scheduler, coordinator, block tables, paged model.

Names load on first use (PEP 562): ``kvspec simulate --help`` reads only ``kvspec.engine.workloads``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvspec.engine.engine import Engine, EngineStats
    from kvspec.engine.model import TINY_FULL, TINY_HYBRID, TinyDecoder, TinyModelConfig
    from kvspec.engine.scheduler import Scheduler, SchedulerOutput
    from kvspec.engine.workloads import WORKLOADS, make_workload

_EXPORTS = {
    "Engine": "kvspec.engine.engine",
    "EngineStats": "kvspec.engine.engine",
    "TINY_FULL": "kvspec.engine.model",
    "TINY_HYBRID": "kvspec.engine.model",
    "TinyDecoder": "kvspec.engine.model",
    "TinyModelConfig": "kvspec.engine.model",
    "Scheduler": "kvspec.engine.scheduler",
    "SchedulerOutput": "kvspec.engine.scheduler",
    "WORKLOADS": "kvspec.engine.workloads",
    "make_workload": "kvspec.engine.workloads",
}

__all__ = [
    "TINY_FULL",
    "TINY_HYBRID",
    "WORKLOADS",
    "Engine",
    "EngineStats",
    "Scheduler",
    "SchedulerOutput",
    "TinyDecoder",
    "TinyModelConfig",
    "make_workload",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvspec.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
