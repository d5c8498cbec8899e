"""Monarch's import path of UndeliverableMessageEnvelope (see monarch._rust_bindings)."""
from monarch.actor import UndeliverableMessageEnvelope

__all__ = ["UndeliverableMessageEnvelope"]
