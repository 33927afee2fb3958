"""The settings of the web tools: `search` (the provider behind `web_search`). `web_fetch` keeps
its settings under `agent` (`http_fetch_*`, `http_allow_hosts`), where they were before."""

from __future__ import annotations

import ipaddress
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from gateway.config.base import Section

SearchProvider = Literal["none", "searxng", "brave", "tavily"]
# Where the keyed providers answer; `search.url` replaces it (a proxy in between, a test server).
PROVIDER_ENDPOINTS: dict[str, str] = {
    "brave": "https://api.search.brave.com/res/v1/web/search",
    "tavily": "https://api.tavily.com/search",
}


class SearchConfig(Section):
    provider: SearchProvider = "none"  # none: no web_search tool
    # searxng: the instance's address (required), e.g. http://127.0.0.1:8888; brave, tavily: the
    # API endpoint, when not the provider's own. Reached without the SSRF check (docs/web.md).
    url: str = ""
    api_key: str = ""  # brave, tavily: the subscription key (from SEARCH_API_KEY)
    max_results: int = Field(10, ge=1, le=20)  # the most results one call returns, whatever it asks
    default_results: int = Field(5, ge=1)  # when the call does not say
    timeout_s: float = Field(15.0, gt=0)
    max_response_bytes: int = Field(2_000_000, ge=1_000)  # a longer answer is refused, not parsed

    @model_validator(mode="after")
    def _complete(self) -> SearchConfig:
        if self.provider == "searxng" and not self.url:
            raise ValueError("search.url: searxng needs the instance's address, e.g. http://127.0.0.1:8888")
        if self.provider in PROVIDER_ENDPOINTS and not self.api_key:
            raise ValueError(f"search.api_key: {self.provider} needs a key; write ${{SEARCH_API_KEY}} and set it")
        if self.url:
            _check_url(self.url, keyed=self.provider in PROVIDER_ENDPOINTS)
        return self

    @property
    def endpoint(self) -> str:
        """The URL a search request goes to."""
        if self.provider == "searxng":
            return self.url.rstrip("/") + "/search"
        return self.url or PROVIDER_ENDPOINTS.get(self.provider, "")


def _check_url(url: str, *, keyed: bool) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"search.url: expected an http:// or https:// URL, got {url!r}")
    if keyed and parts.scheme == "http" and not _loopback(parts.hostname):
        # the key goes with every request: in clear only to this machine
        raise ValueError("search.url: use https:// (the key is sent with every request); http:// only on loopback")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
