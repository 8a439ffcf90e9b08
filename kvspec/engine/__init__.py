"""A small reference engine that proves the pipeline: scheduler, coordinator, block tables, paged model."""

from kvspec.engine.engine import Engine as Engine
from kvspec.engine.engine import EngineStats as EngineStats
from kvspec.engine.model import (
    TINY_FULL as TINY_FULL,
)
from kvspec.engine.model import (
    TINY_HYBRID as TINY_HYBRID,
)
from kvspec.engine.model import (
    TinyDecoder as TinyDecoder,
)
from kvspec.engine.model import (
    TinyModelConfig as TinyModelConfig,
)
from kvspec.engine.scheduler import Scheduler as Scheduler
from kvspec.engine.scheduler import SchedulerOutput as SchedulerOutput
from kvspec.engine.workloads import WORKLOADS as WORKLOADS
from kvspec.engine.workloads import make_workload as make_workload
