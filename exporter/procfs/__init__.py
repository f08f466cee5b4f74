"""Pure parsers of kernel files: text in, data out (like prometheus/procfs)."""
