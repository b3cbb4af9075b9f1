"""The encoder and a dispatcher in one process: a rendered prompt goes to the dispatcher
beside it without a bus hop. See ``app.py``."""
