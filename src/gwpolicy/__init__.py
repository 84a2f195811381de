"""gwpolicy: Gateway API Policy Attachment (GEP-713) engine, CLI and controller."""

__version__ = "0.1.0"
