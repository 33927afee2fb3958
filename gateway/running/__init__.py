"""Running the process: the leader lease and its duties, cooperative stopping, the clock that
expiry is measured against, and what a start says and refuses."""
