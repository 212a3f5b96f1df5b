"""Corpus building for Tolk (English -> Brazilian Portuguese).

The entry point is :mod:`model.data.build`; each source of parallel text lives
in :mod:`model.data.sources`, cleaning in :mod:`model.data.clean`, and the
dev/test hold-out in :mod:`model.data.split`.
"""
