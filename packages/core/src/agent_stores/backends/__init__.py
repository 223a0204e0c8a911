"""Backends shipped with the core: ``memory://`` and ``sqlite://``."""
