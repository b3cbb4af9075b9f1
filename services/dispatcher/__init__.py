"""The dispatcher: picks an engine for each GenerateRequest, speaks the engine's HTTP
protocol (vLLM or SGLang, token ids in and out) and streams TokenBatch messages to the parser."""
