"""The nightly reconciliation job (PySpark): validator tables vs topics at rest, state schemas vs the registry."""
