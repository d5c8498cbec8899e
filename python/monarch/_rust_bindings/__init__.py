"""Monarch's private import paths, for the few names its users' scripts import from there.

Only these are here, each the same object as its public home:
``monarch._rust_bindings.monarch_hyperactor.mailbox.UndeliverableMessageEnvelope`` and
``monarch._rust_bindings.monarch_hyperactor.supervision.{MeshFailure, SupervisionError}``
(``monarch.actor``). Import them from ``monarch.actor`` in new code.
"""
