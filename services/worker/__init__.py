"""A worker: the encoder, a dispatcher and a parser in one process, a generation kept inside
it from its job to its parsed events. See ``app.py``."""
