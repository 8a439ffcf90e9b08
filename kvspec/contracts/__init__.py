"""Contracts: what a spec and a manager are (the ``KVCacheSpec`` and ``KVCacheManager`` protocols, the
parameter objects their hooks take), the traits a spec declares, and the run-time checking switches.
Plugins implement these; everything above reads specs and managers only through them."""
