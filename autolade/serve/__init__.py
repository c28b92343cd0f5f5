"""``autolade serve``: an OpenAI-compatible HTTP server over the exact lookahead decoder."""
