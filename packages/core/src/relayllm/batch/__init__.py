"""OpenAI batch files: the line format, and running a file through the shared deployments."""
