"""relayllm adapter for openai (work in progress)."""
