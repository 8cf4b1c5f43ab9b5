"""The DIV core: wire format, per-producer segment state and the pure validator.

Nothing in this package does I/O or reads a clock; everything else in kdiv depends on it.
"""
