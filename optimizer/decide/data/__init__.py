"""Data files shipped with the optimizer (the hardware catalog)."""
