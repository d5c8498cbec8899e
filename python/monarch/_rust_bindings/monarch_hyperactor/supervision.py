"""Monarch's import path of MeshFailure and SupervisionError (see monarch._rust_bindings)."""
from monarch.actor import MeshFailure, SupervisionError

__all__ = ["MeshFailure", "SupervisionError"]
