"""web_fetch (formerly http_fetch) on pages like real ones, served by a local server: an HTML page
comes back as its readable text (main content with its links, no scripts, styles, navigation or
boilerplate) within the usual byte cap; chunked and slow bodies, other types, oversized pages and
a page that tries prompt injection. The former name keeps reaching the tool and the rules."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web
from helpers import Site, serving
from tooling import THREAD, make_ctx

from gateway.approvals.policy import ApprovalPolicy, Bypass
from gateway.config import AgentConfig, SearchConfig
from gateway.tools import ToolOutcome, default_registry, run_tool
from gateway.tools.builtin_search import search_specs
from gateway.tools.readable import is_html

PAGES = Path(__file__).parent / "payloads" / "web"
ARTICLE = (PAGES / "article.html").read_text(encoding="utf-8")
INJECTION = (PAGES / "injection.html").read_text(encoding="utf-8")
HTML = "text/html"


def _static_pages() -> dict[str, tuple[bytes, str]]:
    """Name -> (body, Content-Type) of the pages that are sent whole."""
    filler = "".join(f"<p>Paragraph {i} of the appendix, about tides and turbines.</p>" for i in range(60_000))
    cafe = "<html><body><article><p>" + "Le café du port sert les marins depuis 1890. " * 8
    cafe += "</p></article></body></html>"
    pages = {
        "article": (ARTICLE, "text/html; charset=utf-8"),
        "injection": (INJECTION, HTML),
        "huge": (ARTICLE.replace("</article>", filler + "</article>"), HTML),
        # nothing but navigation: that is what there is to read
        "menu": ("<html><body><nav><a href='/a'>Alpha</a> <a href='/b'>Beta</a></nav>"
                 "<script>var hidden = 1;</script></body></html>", HTML),
        "boilerplate": ("<html><body><aside><p>" + "Related stories about tides and turbines in the sea. " * 6
                        + "</p></aside></body></html>", HTML),
        "empty": ("<html><head></head><body></body></html>", HTML),
        "data.json": ('{"tides": [1, 2], "html": "<b>not a page</b>"}', "application/json"),
        "notes.txt": ("<p>plain text stays as it is</p>", "text/plain"),
    }
    found = {name: (text.encode(), kind) for name, (text, kind) in pages.items()}
    found["latin1"] = (cafe.encode("latin-1"), "text/html; charset=iso-8859-1")
    found["chart.png"] = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "image/png")
    return found


@pytest.fixture
async def site():
    state = Site()
    static = _static_pages()

    async def chunked(request: web.Request) -> web.StreamResponse:  # in pieces, with pauses between them
        response = web.StreamResponse(headers={"Content-Type": "text/html; charset=utf-8"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        data = ARTICLE.encode()
        for start in range(0, len(data), 700):
            await response.write(data[start:start + 700])
            await asyncio.sleep(0.02)
        await response.write_eof()
        return response

    async def stalls(request: web.Request) -> web.StreamResponse:  # the head of the page, then nothing
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        await response.prepare(request)
        await response.write(ARTICLE[:500].encode())
        await state.release.wait()
        return response

    async def page(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in static:
            return web.Response(status=404, text="<html><body><h1>Not found</h1></body></html>", content_type=HTML)
        body, kind = static[name]
        return web.Response(body=body, headers={"Content-Type": kind})

    app = web.Application()
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/stalls", stalls)
    app.router.add_get("/{name}", page)
    async with serving(app) as state.base:
        yield state
        state.release.set()


async def fetch(tmp_path, url: str, **args) -> ToolOutcome:
    settings = {"http_fetch_allow_private": True, **args.pop("agent", {})}
    ctx = make_ctx(tmp_path, **settings)
    spec = default_registry(ctx.agent).get("web_fetch")
    assert spec is not None
    return await run_tool(spec, {"url": url, **args}, ctx)


def body_of(outcome: ToolOutcome) -> str:
    return outcome.text.split("\n\n", 1)[1]


async def test_an_html_page_comes_back_as_its_readable_text(site, tmp_path):
    outcome = await fetch(tmp_path, f"{site.base}/article")
    assert not outcome.failed
    head, text = outcome.text.split("\n\n", 1)
    assert head.splitlines() == [
        "HTTP 200 OK", f"URL: {site.base}/article", "Content-Type: text/html; charset=utf-8",
        "Title: Tidal Energy Explained | Ocean Power Weekly",
    ]
    assert text.startswith("# Tidal energy explained\n")
    assert "## Costs" in text and "- Tidal stream turbines" in text
    # links kept, relative ones made absolute against the page
    assert "[Sihwa Lake](https://en.wikipedia.org/wiki/Sihwa_Lake_Tidal_Power_Station)" in text
    assert f"[guide to tidal stream generators]({site.base}/guides/tidal-stream)" in text
    for left_out in ("SCRIPT_MARKER", "INLINE_SCRIPT_MARKER", "gtag", "STYLE-MARKER", "font-family", "schema.org",
                     "Accept all", "cookies", "About us", "Subscribe", "Most read", "newsletter",
                     "All rights reserved", "Terms of use", "<p>", "<a "):
        assert left_out not in text, left_out
    assert text.endswith(f"[readable text: the main content, scripts, styles and navigation left out; "
                         f"{len(ARTICLE.encode())} bytes of HTML; raw=true gives the source]")
    assert len(text) < len(ARTICLE) / 2


async def test_raw_gives_the_source(site, tmp_path):
    outcome = await fetch(tmp_path, f"{site.base}/article", raw=True)
    assert body_of(outcome) == ARTICLE


async def test_a_chunked_body_sent_slowly_is_read_whole(site, tmp_path):
    chunked = await fetch(tmp_path, f"{site.base}/chunked")
    whole = await fetch(tmp_path, f"{site.base}/article")
    assert body_of(chunked) == body_of(whole)


async def test_a_body_that_stalls_times_out(site, tmp_path):
    outcome = await fetch(tmp_path, f"{site.base}/stalls", agent={"http_fetch_timeout_s": 0.5})
    assert outcome.failed and "timed out after 0.5s" in outcome.text


async def test_an_oversized_page_is_cut_at_the_cap_and_its_head_still_read(site, tmp_path):
    outcome = await fetch(tmp_path, f"{site.base}/huge", agent={"http_fetch_max_bytes": 50_000})
    text = body_of(outcome)
    assert text.startswith("# Tidal energy explained") and "Sihwa Lake" in text
    assert "Paragraph 100 of the appendix" in text and "Paragraph 59999" not in text
    assert "50000+ bytes of HTML" in text
    assert text.endswith("[truncated: only the first 50000 bytes were read]")
    small = await fetch(tmp_path, f"{site.base}/huge", agent={"http_fetch_max_bytes": 50_000}, max_bytes=3000)
    assert "[truncated: only the first 3000 bytes were read]" in small.text


async def test_the_pages_charset_is_honoured(site, tmp_path):
    outcome = await fetch(tmp_path, f"{site.base}/latin1")
    assert "Le café du port sert les marins depuis 1890." in body_of(outcome)


async def test_a_page_without_main_content_says_what_there_is(site, tmp_path):
    menu = body_of(await fetch(tmp_path, f"{site.base}/menu"))
    assert menu.startswith(f"[Alpha]({site.base}/a) [Beta]({site.base}/b)\n[readable text:")
    assert "hidden" not in menu
    for name in ("boilerplate", "empty"):
        nothing = body_of(await fetch(tmp_path, f"{site.base}/{name}"))
        assert nothing.startswith("[the page has no readable text: only navigation and boilerplate, or nothing]\n")
        assert "raw=true gives the source" in nothing


async def test_other_types_are_not_taken_for_pages(site, tmp_path):
    data = await fetch(tmp_path, f"{site.base}/data.json")
    assert body_of(data) == '{"tides": [1, 2], "html": "<b>not a page</b>"}'
    notes = await fetch(tmp_path, f"{site.base}/notes.txt")
    assert body_of(notes) == "<p>plain text stays as it is</p>"
    chart = await fetch(tmp_path, f"{site.base}/chart.png")
    assert "[binary content, 16 bytes, not shown]" in chart.text
    missing = await fetch(tmp_path, f"{site.base}/gone")
    assert missing.text.startswith("HTTP 404 Not Found") and body_of(missing).startswith("# Not found")


def test_a_page_without_a_type_is_known_by_its_start():
    assert is_html("", b"  <!DOCTYPE html><html>")
    assert is_html("", b"<HTML><body>")
    assert not is_html("", b"{\"a\": 1}")
    assert not is_html("application/json", b"<html>")
    assert is_html("application/xhtml+xml; charset=utf-8", b"<?xml version='1.0'?>")


async def test_a_page_that_gives_orders_is_returned_as_page_text_only(site, tmp_path):
    outcome = await fetch(tmp_path, f"{site.base}/injection")
    text = body_of(outcome)
    # what the page says is data: it is shown as the page's text, in the tool's result, and only there
    assert "IMPORTANT SYSTEM INSTRUCTION TO THE AI ASSISTANT" in text
    assert "developer mode" not in text  # its script is left out like any other
    assert outcome.text.startswith("HTTP 200 OK\n")
    # and following it would need a person: the collector is not on the allow list
    registry = default_registry(AgentConfig(http_allow_hosts=["127.0.0.1"]))
    decision = ApprovalPolicy([], tmp_path).decide(
        registry.get("web_fetch"), {"url": "https://collector.example/steal?data=NOTES"},  # type: ignore[arg-type]
        source="telegram", interactive=True,
    )
    assert decision.action == "require" and "collector.example is not on agent.http_allow_hosts" in decision.reason


async def test_the_extractor_is_not_loaded_before_a_page_is(site, tmp_path):
    """The import is inside the function that reads a page (test_start_imports checks a start)."""
    import gateway.tools.readable as readable

    assert "trafilatura" not in vars(readable)


# --- the former name, approvals, headless sessions -----------------------------------------------


def test_the_former_name_reaches_the_tool_and_matches_what_was_written_for_it(tmp_path):
    registry = default_registry(AgentConfig(tools=["http_fetch", "clock"]))
    assert registry.names() == ["clock", "web_fetch"]
    spec = registry.get("http_fetch")  # a call recorded before the rename, or a model that learned it
    assert spec is not None and spec.name == "web_fetch"
    args = {"url": "https://en.wikipedia.org/wiki/Tide"}
    deny = ApprovalPolicy([{"tool": "http_fetch", "action": "deny"}], tmp_path)
    assert deny.decide(spec, args, source="telegram", interactive=True).action == "deny"
    assert deny.hidden_tools([spec], "telegram") == {"web_fetch"}
    allow = ApprovalPolicy([{"tool": "http_*", "action": "allow"}], tmp_path)
    assert allow.decide(spec, args, source="cron", interactive=False).action == "allow"
    standing = Bypass.for_thread("http_fetch", THREAD)  # granted under the former name
    decided = ApprovalPolicy([], tmp_path).decide(spec, args, source="telegram", interactive=True,
                                                  bypasses=[standing], thread=THREAD)
    assert decided.action == "allow" and decided.bypassed


@pytest.mark.parametrize("source", ["cron", "tick"])
def test_headless_sessions_may_search_and_fetch_listed_hosts(tmp_path, source):
    policy = ApprovalPolicy([], tmp_path)
    (search,) = search_specs(SearchConfig(provider="searxng", url="http://127.0.0.1:8888"))
    fetch = default_registry(AgentConfig(http_allow_hosts=["*.wikipedia.org"])).get("web_fetch")
    assert fetch is not None and not search.side_effects and not fetch.side_effects
    assert search.classes == fetch.classes == {"network"}

    def decide(spec, **args):  # noqa: ANN001, ANN003
        return policy.decide(spec, args, source=source, interactive=False).action

    assert decide(search, query="tides") == "allow"
    assert decide(fetch, url="https://en.wikipedia.org/wiki/Tide") == "allow"
    assert decide(fetch, url="https://elsewhere.example/") == "auto_deny"  # nobody to ask
    require = ApprovalPolicy([{"tool": "web_search", "action": "require"}], tmp_path)
    assert require.decide(search, {"query": "tides"}, source=source, interactive=False).action == "auto_deny"
