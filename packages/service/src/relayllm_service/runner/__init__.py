"""The runner: the detached actor that claims batches and runs them on the shared deployments."""
