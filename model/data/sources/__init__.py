"""Sources of parallel English/pt_BR text, one module per source.

Every module exposes ``NAME``, ``PACKAGES`` (or a function returning them) and
``collect(env, work, ...) -> list[Pair]``.
"""
