"""The plugin conformance kit: run it in a plugin's own test suite.

``check_plugin(spec, manager_cls)`` registers the pair in a scratch registry (beside the built-ins), checks
every value the spec returns, plans a layout (the spec alone, and beside full attention), and drives a
coordinator through admission, a prefix hit, decode, an unrelated request, preemption, a refused
allocation and free, checking after every step:

- the pool's invariants and that every block's ref count equals its holders (``check_invariants``);
- every value a manager method returns (types, ranges, blocks from this pool);
- behaviour, not only bookkeeping: the block holding a request's last computed token is still held
  (a skipped-token count off by one frees it), a prefix hit's blocks carry the request's own block
  hashes, ``get_num_common_prefix_blocks`` never counts a block some running request does not hold,
  a refused allocation changes nothing, and finishing every request returns every block.

``check_eviction_policy(factory)`` does the same for an eviction policy (``kvspec.blocks.eviction``): seeded
random requests with shared prefixes over two groups, forced eviction, and the policy's promises checked
after every step.

``plugin_state_machine(spec, manager_cls)`` returns a hypothesis ``RuleBasedStateMachine`` that makes the
same checks after random steps (hypothesis is needed only for it).

Every failure raises :class:`kvspec.errors.PluginContractError` (or the registration error at the door)
naming the method, the value and what was expected.
"""

from kvspec.testing.checker import ConformanceReport, CoordinatorChecker, check_spec_values
from kvspec.testing.eviction_kit import EvictionReport, check_eviction_policy, eviction_scenario
from kvspec.testing.plugin_kit import check_plugin, plugin_state_machine

__all__ = [
    "ConformanceReport",
    "CoordinatorChecker",
    "EvictionReport",
    "check_eviction_policy",
    "check_plugin",
    "check_spec_values",
    "eviction_scenario",
    "plugin_state_machine",
]
