"""The `gateway ...` command line: its commands and reports."""
