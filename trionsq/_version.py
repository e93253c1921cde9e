"""The client's version, as sent in the default IDENTIFY ``user_agent`` (``trionsq/<version>``)."""

__version__ = "0.1.0"
