"""The LLM client's HTTP clients: one for every `per_client` streams in flight.

httpcore's connection pool walks all its connections and requests whenever a request starts
or ends, asking each idle connection's socket whether the server closed it, so one pool that
carries N streams costs O(N) per request and O(N^2) for N turns started together (7% of the
gateway's CPU with a thousand in flight). Spread over clients of at most `per_client`
streams each, every walk stays short; below that one client serves everything, as before.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass

import httpx

PER_CLIENT = 16


@dataclass(eq=False)
class Lane:
    """One client and the streams it carries now."""

    client: httpx.AsyncClient
    streams: int = 0


class ClientPool:
    def __init__(
        self, make: Callable[[ssl.SSLContext | bool], httpx.AsyncClient], verify: ssl.SSLContext | bool,
        per_client: int = PER_CLIENT,
    ) -> None:
        self._make = make
        self._verify = verify
        self.per_client = per_client
        self.lanes: list[Lane] = []

    @property
    def first(self) -> httpx.AsyncClient:
        """The client of the one-off requests (discovery, transcription); made on first use: a
        client loads the TLS trust store (tens of ms), which a start need not wait for."""
        return self._lanes()[0].client

    def take(self) -> Lane:
        """The lane with the fewest streams, or a new one when every lane is full."""
        lane = min(self._lanes(), key=lambda lane: lane.streams)
        if lane.streams >= self.per_client:
            lane = self._add()
        lane.streams += 1
        return lane

    @staticmethod
    def give_back(lane: Lane) -> None:
        lane.streams -= 1

    async def aclose(self) -> None:
        for lane in self.lanes:
            await lane.client.aclose()
        self.lanes.clear()

    def _lanes(self) -> list[Lane]:
        if not self.lanes:
            self._add()
        return self.lanes

    def _add(self) -> Lane:
        if self._verify is True:  # the trust store is loaded once, for every lane
            self._verify = httpx.create_ssl_context()
        lane = Lane(self._make(self._verify))
        self.lanes.append(lane)
        return lane
