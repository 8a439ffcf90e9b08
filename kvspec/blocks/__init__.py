"""Blocks: the pool every KV cache group shares, block hashing, the request the core reads, and what the
pool reports (KV events, block residency metrics). The bottom layer: it imports only ``kvspec.errors``
and ``kvspec.intmath``. Public names are exported by ``kvspec``."""
