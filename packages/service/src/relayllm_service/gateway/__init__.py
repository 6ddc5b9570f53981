"""The gateway: the Serve application that answers the Batch, Files, Usage and online routes."""
