"""vLLM's KV event wire format: kept at this path for readers of earlier docs; the code is
:mod:`kvspec.blocks.event_wire` (the blocks layer, beside the events it encodes, so the fleet reads and
writes the wire without the vLLM integration)."""

from kvspec.blocks.event_wire import *  # noqa: F403
from kvspec.blocks.event_wire import __all__ as __all__
