"""gwpolicy: Gateway API Policy Attachment (GEP-713) engine, CLI and controller."""

from gwpolicy import compiled as _compiled

__version__ = "0.1.0"

_compiled.guard()  # before any module of the compiled core is imported (compiled.py says why)
