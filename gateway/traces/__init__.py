"""Run records: one run per turn, its events, usage and cost, and the one writer of its stage."""
