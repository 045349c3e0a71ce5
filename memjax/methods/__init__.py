"""The methods: one package each, reached by the engine through registries.

Each package's ``__init__`` declares what the method adds (``REGISTERS``,
``MODES``, ``CONFIG``; see ``memjax.registry``) and imports nothing, so
finding the methods costs nothing; a registry imports a method's modules
when it is first read. A method imports another only where its paper builds
on it (external -> trime, cache), and the engine imports none of them.
"""
