"""The console: the web page the gateway serves at ``/console``."""
