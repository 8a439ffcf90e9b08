"""What the Mamba2 hybrids share: a Mamba2 state sized from keys each family names its own way, and the
``d_inner`` rule (``mamba_expand x hidden_size`` unless the family says otherwise)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvspec.models import state_shapes
from kvspec.models.config_reader import ConfigReader
from kvspec.models.family import ModelFamily
from kvspec.models.state_shapes import StateLayout


@dataclass(frozen=True, kw_only=True, slots=True)
class Mamba2Keys:
    """The config keys a Mamba2 family names its state's sizes with."""

    n_groups: str
    heads: str
    head_dim: str
    state_size: str
    conv_kernel: str

    @property
    def names(self) -> tuple[str, ...]:
        return (self.n_groups, self.heads, self.head_dim, self.state_size, self.conv_kernel)


#: Granite 4.0-H's and Falcon-H1's names.
MAMBA_D_KEYS = Mamba2Keys(
    n_groups="mamba_n_groups",
    heads="mamba_n_heads",
    head_dim="mamba_d_head",
    state_size="mamba_d_state",
    conv_kernel="mamba_d_conv",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Mamba2Hybrid(ModelFamily):
    """A family whose state layers are Mamba2 mixers; ``mamba2_keys`` names their sizes."""

    mamba2_keys: Mamba2Keys = MAMBA_D_KEYS

    def inner_size(self, config: ConfigReader, heads_size: int) -> int:
        """d_inner: ``mamba_expand x hidden_size`` (Falcon's expand may be fractional)."""
        return int(config.positive_number("mamba_expand") * config.positive_int("hidden_size"))

    def ssm_dtype(self, config: ConfigReader, model_dtype: torch.dtype) -> torch.dtype:
        """The SSM state's dtype: the model's."""
        return model_dtype

    def state_layout(self, config: ConfigReader, tp: int, model_dtype: torch.dtype) -> StateLayout:
        names = self.mamba2_keys
        heads, head_dim = config.positive_int(names.heads), config.positive_int(names.head_dim)
        return state_shapes.mamba2_state(
            tp=tp,
            intermediate_size=self.inner_size(config, heads * head_dim),
            n_groups=config.positive_int(names.n_groups),
            num_heads=heads,
            head_dim=head_dim,
            state_size=config.positive_int(names.state_size),
            conv_kernel=config.positive_int(names.conv_kernel),
            dtypes=(model_dtype, self.ssm_dtype(config, model_dtype)),
        )
