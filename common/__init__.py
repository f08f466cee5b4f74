"""What the programs share: YAML and duration parsing, the HTTP server with its TLS and basic auth,
the exposition format, command-line flags, log lines, generated Markdown blocks."""

__version__ = "0.1.0"
