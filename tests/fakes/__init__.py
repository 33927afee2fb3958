"""Fakes for tests and benchmarks: real HTTP servers on 127.0.0.1 (random port) that the real
client libraries talk to."""
