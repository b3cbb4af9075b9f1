"""Typed messages on the bus, one module per conversation between services."""
