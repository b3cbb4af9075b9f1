"""A SIMULATED gpt-oss engine (not a model): scripted, deterministic Harmony output served over
the real vLLM (``/v1/completions``) and SGLang (``/generate``) HTTP protocols, for tests,
benchmarks and `chorus up` without a GPU. Responses carry ``X-Chorus-Simulator: true``."""
