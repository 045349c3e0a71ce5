"""The methods: one package each, found by ``memjax.catalog``.

Each package's ``__init__`` exports ``METHOD``, one ``memjax.extend.Method``
built from real imports, that lists every part the method adds and its
settings. A method imports another only where its paper builds on it
(external -> trime, cache), and the engine imports none of them.
"""
