"""Pure parsers of sysfs trees: a root path in, data out (like prometheus/procfs/sysfs)."""
