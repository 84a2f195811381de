"""The engine: Gateway API Policy Attachment as pure functions of the objects (standard library only)."""
