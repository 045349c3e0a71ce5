"""Modes of ``python -m memjax.main`` grouped by method family."""
