"""See monarch._rust_bindings."""
