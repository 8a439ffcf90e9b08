"""vLLM 0.34's R-SWA: full attention over the prompt, a window over the generated tokens.

Only the base class's hooks are used: ``remove_skipped_blocks`` receives the prompt length
(``num_prompt_tokens``) and frees the gap between the prompt's last block and the window with
``free_block_range``.
"""

from __future__ import annotations

from kvspec.errors import UnsupportedConfigurationError
from kvspec.intmath import cdiv
from kvspec.managers.full import FullAttentionManager


class RSWAManager(FullAttentionManager):
    """Frees the blocks wholly inside [round_up(prompt, block), max(prompt, computed - window)) of each
    request (indices of blocks; the prompt's own blocks and the window's stay)."""

    def setup(self) -> None:
        super().setup()
        window = getattr(self.kv_cache_spec, "rswa_window", None)
        if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
            raise UnsupportedConfigurationError(
                f"RSWAManager runs specs with a positive int rswa_window; {type(self.kv_cache_spec).__name__} "
                f"has {window!r}."
            )
        self.rswa_window: int = window

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, /, num_prompt_tokens: int | None = None
    ) -> None:
        if num_prompt_tokens is None:
            # Without the prompt length nothing is known to be outside both the prompt and the window.
            super().remove_skipped_blocks(request_id, total_computed_tokens, num_prompt_tokens)
            return
        bs = self.block_size
        window_start = max(num_prompt_tokens, total_computed_tokens - self.rswa_window)
        self.free_block_range(request_id, cdiv(num_prompt_tokens, bs), window_start // bs)
