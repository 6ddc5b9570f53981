"""relayllm-shout: an example third-party adapter."""
