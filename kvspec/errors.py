"""The exception hierarchy: every user error kvspec raises is a :class:`KVSpecError`.

Each class also derives from the builtin exception a Python user would expect (``ValueError`` for bad
values, ``TypeError`` for bad types, ``LookupError`` for missing registrations), so ``except ValueError``
in existing engine code keeps working.
"""

from __future__ import annotations

from typing import Any


class KVSpecError(Exception):
    """Base class of every error kvspec raises on purpose."""


class CapacityError(KVSpecError):
    """Not enough blocks or memory: a normal condition a caller handles (wait, preempt, shrink), not a bug."""


class InvariantError(KVSpecError, AssertionError):
    """An internal invariant broke (ref counts, free queue, cache map): a bug in kvspec or in a plugin."""


class KVSpecTypeError(KVSpecError, TypeError):
    """An argument has the wrong type (raised by the runtime type checks at public boundaries)."""


class SpecValidationError(KVSpecError, ValueError):
    """A spec field has an invalid value; the message names the spec class, the field and the value."""


class SpecMergeError(KVSpecError, ValueError):
    """Specs that were asked to share one KV cache group cannot be merged into one spec."""


class WindowSizeMismatchError(SpecMergeError):
    """Attention layers in one group disagree on their sliding window or chunk size."""


class UnsupportedConfigurationError(KVSpecError, ValueError):
    """A valid spec was used in a setting it does not support (e.g. sliding window with decode CP)."""


class ReleaseMismatchError(UnsupportedConfigurationError):
    """A ``KVCacheConfig`` planned under one vLLM release's rules given to a coordinator running another's:
    the run would reproduce neither release (the message names both and the ways out)."""


class RegistrationError(KVSpecError, TypeError):
    """A spec/manager registration was rejected; the registry is left exactly as it was."""


class TraitsError(RegistrationError):
    """A spec's declared traits (``kv_cache_traits``) are malformed or contradict its other members."""


class SpecClassError(RegistrationError):
    """A spec class breaks a class-level rule: it must be frozen and hashable, with properties as properties."""


class MissingManagerError(RegistrationError):
    """A spec class was registered without a manager class."""


class UniformBaseError(RegistrationError):
    """A spec class does not subclass the uniform-type base it declares."""


class SpecProtocolError(RegistrationError):
    """A class registered as a spec does not provide every member of the KVCacheSpec protocol."""


class ManagerProtocolError(RegistrationError):
    """A class registered as a manager does not provide every member of the KVCacheManager protocol."""


class RegistryBoundError(RegistrationError):
    """A typed registry (``Registry[S, M](...)``, or ``spec_bound`` / ``manager_bound``) was given a spec class
    outside ``S`` or a manager class outside ``M``, at registration or at lookup."""


class ManagerSignatureError(ManagerProtocolError):
    """A manager method's parameters differ from the KVCacheManager protocol's (names, order or kind)."""


class EvictionPolicyError(RegistrationError):
    """An eviction policy cannot be registered or built: a bad name, a factory that is not callable or
    builds something that is not an ``EvictionPolicy``, or a name registered twice."""


class UnknownEvictionPolicyError(KVSpecError, LookupError):
    """An eviction policy name that no registration holds (the message lists the registered names)."""


class PluginContractError(KVSpecError, ValueError):
    """A plugin's spec or manager returned a value that breaks the contract (found by kvspec.testing)."""


class ConflictingRegistrationError(RegistrationError):
    """A spec class is registered a second time with a different manager, base or capabilities."""


class CapabilityError(RegistrationError, ValueError):
    """Capability metadata attached to a registration is invalid."""


class UnregisteredSpecError(KVSpecError, LookupError):
    """A spec's type (or, in strict mode, its exact class) has no registration."""


class PluginError(KVSpecError, RuntimeError):
    """A plugin named in the ``kvspec.plugins`` entry-point group failed to load or to register."""


class PlanningError(KVSpecError, ValueError):
    """The memory planner cannot build a KV cache layout for the given specs and budget."""


class InsufficientKVCacheMemoryError(PlanningError, CapacityError):
    """The budget cannot hold one request of ``max_model_len`` tokens (or any block at all)."""

    def __init__(
        self,
        message: str,
        *,
        needed_bytes: int,
        available_bytes: int,
        max_model_len: int,
        estimated_max_model_len: int,
    ) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        self.max_model_len = max_model_len
        self.estimated_max_model_len = estimated_max_model_len

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by a fleet sweep's worker processes (and Ray): the figures are keyword-only, which
        # BaseException's default reduction (the message alone) cannot pass back; notes ride in the state.
        figures = {
            "needed_bytes": self.needed_bytes,
            "available_bytes": self.available_bytes,
            "max_model_len": self.max_model_len,
            "estimated_max_model_len": self.estimated_max_model_len,
        }
        return (_rebuild_insufficient, (str(self), figures), self.__dict__)


def _rebuild_insufficient(message: str, figures: dict[str, int]) -> InsufficientKVCacheMemoryError:
    return InsufficientKVCacheMemoryError(message, **figures)


class PageSizeUnificationError(PlanningError):
    """Hybrid layers whose page sizes cannot be made equal by scaling block sizes."""


class HybridUnificationError(PlanningError):
    """Hybrid KV cache management is disabled, and the specs cannot be converted to one type."""


class ConflictingLayerSpecError(PlanningError):
    """Two workers report different specs for the same layer."""


class ModelConfigError(KVSpecError, ValueError):
    """A model config (Hugging Face config.json or preset name) is unknown, malformed or incomplete."""


class ModelFamilyError(RegistrationError):
    """A model family cannot be registered: a bad name, a ``model_type`` another family already claims, or
    an object that is not a ``ModelFamily``."""


class UnknownModelFamilyError(KVSpecError, LookupError):
    """No model family is registered under a name."""


class BlockPoolError(KVSpecError, RuntimeError):
    """The block pool was used in a way that breaks its invariants."""


class NotEnoughFreeBlocksError(BlockPoolError, CapacityError):
    """More blocks were requested than the pool has free."""


class SchedulingError(KVSpecError, ValueError):
    """A scheduler-facing call got arguments that contradict the request's state."""


class PlotPathError(KVSpecError, ValueError):
    """A --plot path the CLI cannot write (unknown suffix, missing folder) or matplotlib is missing."""


class OptionError(KVSpecError, ValueError):
    """A command-line option that cannot apply to what was asked (the message names the option and what it
    needs), or two options that contradict each other."""


class OptionValueError(KVSpecError, ValueError):
    """An option given to a registered router, tier or other named entry is unknown to it or of the wrong
    kind (kvspec.named_registry)."""


class TraceFormatError(KVSpecError, ValueError):
    """A request trace cannot be read: a missing file, a line that is not JSON, or a bad field (the message
    names the file, the line and the field)."""


class DeviceError(KVSpecError, RuntimeError):
    """A device backend is unknown or its hardware/runtime is unavailable."""


# Raised by kvspec.blocks.hashing, kvspec.device and kvspec.integrations (vLLM's exception bases).


class UnknownHashFunctionError(KVSpecError, ValueError):
    """The requested hash algorithm does not exist or its package is missing."""


class BlockTableError(KVSpecError, ValueError):
    """A block table was given sizes or rows that do not fit it."""


class VllmPluginSettingsError(KVSpecError, ValueError):
    """The kvspec vLLM plugin's environment variables (``KVSPEC_VLLM*``) ask for something kvspec cannot run:
    the message names the variable, its value and what it accepts."""


class EventWireError(KVSpecError, ValueError):
    """A payload that is not a vLLM KV event batch (the message says what was found where), or the pieces to
    read one (msgspec, pyzmq) missing."""


class RouterError(RegistrationError):
    """A router plugin refused at registration: its name, factory or product is not what a fleet can run
    (the message names the router and what is wrong)."""


class RouterOptionError(RouterError, OptionValueError):
    """An option given to a router is one it does not declare, or of the wrong kind."""


class UnknownRouterError(KVSpecError, LookupError):
    """A router name nobody registered (the message lists the registered ones)."""


class RoutingError(KVSpecError, RuntimeError):
    """A router misbehaved during a run: it chose an instance that does not exist, or chose differently
    under the same seed; the message names the router, the request and the choice."""


class RouterAccessError(RoutingError):
    """A router read fleet state it did not declare (loads, KV events, the instances' caches)."""


class FleetConfigError(KVSpecError, ValueError):
    """A fleet or sweep asked for something that cannot run (no instances, a bad executor, a sweep file
    of another sweep); the message names the setting and what it accepts."""


class VllmRegistrationError(RegistrationError, AssertionError):
    """A registration vLLM refuses with an assertion (kvspec's message, vLLM's exception base)."""


class VllmSpecLookupError(KVSpecError, ValueError):
    """``check_kv_cache_spec_registry`` found a layer whose spec type has no registration."""


class SpecConversionError(KVSpecError, TypeError):
    """A spec of a class the other library does not define (or not as a dataclass) cannot be converted."""


class AdoptionError(RegistrationError):
    """A spec class or manager a platform registered in vLLM's own registry that kvspec cannot run as it is
    (``kvspec.integrations.vllm_adoption``): the message names the class, the member and what to do. Raised
    when kvspec takes over vLLM's KV cache, before anything is served."""


class VllmConflictingLayerSpecError(ConflictingLayerSpecError, AssertionError):
    """Workers report different specs for one layer (vLLM asserts; kvspec's message)."""


class VllmPageSizeUnificationError(PageSizeUnificationError, NotImplementedError):
    """Page sizes that block sizes cannot unify (vLLM raises NotImplementedError; kvspec's message)."""


class TierError(RegistrationError):
    """An offload tier plugin refused at registration: its name or factory is not what an engine can run, or
    the tier it builds lacks a method of :class:`kvspec.tiers.OffloadTier` (the message names which)."""


class UnknownTierError(KVSpecError, LookupError):
    """A tier or tier cache policy name nobody registered (the message lists the registered ones)."""


class TierConfigError(OptionValueError):
    """Tier settings that cannot run: a size that is not a byte count, a capacity below one block, an unknown
    group family to offload, a bandwidth that is not positive; the message names the setting and what it
    accepts."""


class TierStateError(KVSpecError, RuntimeError):
    """A tier used out of order: a load of a key it does not hold ready, a completion nobody prepared; the
    message names the key and the call."""
