"""Structured outputs and forced tool calls, for every API: what the encoder renders (Harmony's
"# Response Formats"), what the engine enforces (an ``OutputConstraint``), the check of the
final text against the schema (``outputs``), and a client's schema checked before anything is
generated (``schemas``)."""

from services.gateway.structured.outputs import check, constraint, response_format, schema_error
from services.gateway.structured.schemas import schema_problem

__all__ = ["check", "constraint", "response_format", "schema_error", "schema_problem"]
