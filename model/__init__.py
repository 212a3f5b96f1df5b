"""Tolk's model: the Transformer, its training recipe and data, checkpoints and imports, and the decoding engine.

Importing it changes nothing process-wide: a process that decodes for the server makes its settings at its start
(`model.runtime.configure`).
"""
