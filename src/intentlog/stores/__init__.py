"""Journal stores: one module per backend over the small contract in ``_base``."""
