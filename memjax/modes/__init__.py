"""The engine's modes of ``python -m memjax.main``, declared in ``memjax.catalog``."""
