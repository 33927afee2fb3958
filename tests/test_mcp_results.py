"""Results people expect from MCP tools: a resource link the model reads with
`mcp_read_resource`, an embedded resource inlined, a structured-only result as JSON, and image
results shown to a vision model like the images people send (through Telegram, SQLite and
PostgreSQL); and the image repair the reference server's logo needs."""

from __future__ import annotations

import json
import zlib

from fakes.llm import FakeToolCall, Reply
from mcp_support import mcp_section, stdio_server, until_running
from test_telegram_e2e import PRIVATE, has_prompt, prompt_message, running, settle, texts, tg_config, tool_results

from gateway.mcp.results import PNG_SIGNATURE, mended_png, render, render_result
from gateway.mcp.sdk import CallResult, Content


def config(llm, tg, tmp_path, *, vision: bool = False, **server):  # noqa: ANN001, ANN201
    mcp = mcp_section(t=stdio_server(tmp_path / "state", **{"trusted": True, **server}))
    mcp["servers"]["t"]["command"].append("--extra")
    cfg = tg_config(llm, tg, tmp_path, mcp=mcp)
    return cfg.model_copy(update={"llm": cfg.llm.model_copy(update={"vision": vision})})


async def test_a_resource_link_is_read_with_mcp_read_resource(store, llm, tg, tmp_path) -> None:
    llm.tool_calls(("mcp__t__report", {"kind": "link"}, "r1"), ("mcp__t__report", {"kind": "embedded"}, "r2"),
                   ("mcp__t__report", {"kind": "structured"}, "r3"))
    llm.tool_call("mcp_read_resource", {"server": "t", "uri": "notes://report"}, id="m1")
    llm.reply("Read it.")
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "the report please")
        await settle(gateway, lambda: "Read it." in texts(tg, PRIVATE))
        read = next(t for t in llm.requests[0]["tools"] if t["function"]["name"] == "mcp_read_resource")
        assert read["function"]["parameters"]["properties"]["server"]["enum"] == ["t"]
        link, embedded, structured = tool_results(llm.requests[1])
        assert link == (
            "the report is ready\n[resource link report - the weekly report: notes://report (text/plain); "
            'read it with mcp_read_resource(server="t", uri="notes://report")]'
        )
        assert embedded == "[resource notes://report (text/plain)]\nThe report: all green."
        assert json.loads(structured) == {"total": 3, "items": ["a", "ü"]} and "ü" in structured
        assert tool_results(llm.requests[2])[-1] == "[resource notes://report (text/plain)]\nThe report: all green."


async def test_reading_from_an_untrusted_server_asks_first(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp_read_resource", {"server": "t", "uri": "notes://report"}, id="m1")
    llm.reply("done")
    async with running(store, config(llm, tg, tmp_path, trusted=False)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "read it")
        await settle(gateway, lambda: has_prompt(tg, PRIVATE))
        assert "mcp_read_resource" in prompt_message(tg, PRIVATE).text


async def test_image_results_reach_a_vision_model(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__chart", {}, id="c1")

    def then_read_the_pixel(request):  # noqa: ANN001, ANN202
        if len(llm.requests) == 2:
            read = FakeToolCall("mcp_read_resource", {"server": "t", "uri": "notes://pixel"}, "p1")
            return Reply("", tool_calls=(read,))
        return Reply("Seen.")

    llm.responder = then_read_the_pixel
    async with running(store, config(llm, tg, tmp_path, vision=True)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "draw it")
        await settle(gateway, lambda: "Seen." in texts(tg, PRIVATE))
        (chart,) = tool_results(llm.requests[1])
        saved = chart.split("workspace: ")[1].split(" ")[0]
        after = llm.requests[1]["messages"][-2:]  # the notice carrying the image, then the context line
        notice = next(m for m in llm.requests[1]["messages"] if m["role"] == "user" and isinstance(m["content"], list))
        assert notice["content"][0]["text"].startswith("[The images returned by the MCP tool chart of 't' (call c1)")
        assert notice["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
        assert saved in notice["content"][0]["text"] and after
        last = [m for m in llm.requests[2]["messages"] if m["role"] == "user" and isinstance(m["content"], list)]
        assert any("mcp_read_resource" in p.get("text", "") for m in last for p in m["content"])
        assert sum(p.get("type") == "image_url" for m in last for p in m["content"]) == 2


async def test_without_vision_images_stay_a_path(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__chart", {}, id="c1")
    llm.reply("ok")
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "draw it")
        await settle(gateway, lambda: "ok" in texts(tg, PRIVATE))
        assert not any(isinstance(m["content"], list) for m in llm.requests[1]["messages"])


def chunk(kind: bytes, body: bytes, crc: int | None = None) -> bytes:
    checksum = zlib.crc32(kind + body) if crc is None else crc
    return len(body).to_bytes(4, "big") + kind + body + checksum.to_bytes(4, "big")


def test_a_png_loses_only_its_broken_ancillary_chunks() -> None:
    header = chunk(b"IHDR", bytes(13))
    broken = chunk(b"iCCP", b"profile", crc=1)
    good = chunk(b"tEXt", b"k\x00v")
    end = chunk(b"IEND", b"")
    assert mended_png(PNG_SIGNATURE + header + broken + good + end) == PNG_SIGNATURE + header + good + end
    critical = chunk(b"IDAT", b"x", crc=1)  # a broken critical chunk is not hidden
    assert mended_png(PNG_SIGNATURE + header + critical + end) == PNG_SIGNATURE + header + critical + end
    assert mended_png(b"GIF89a...") == b"GIF89a..."
    assert mended_png(PNG_SIGNATURE + b"not chunks") == PNG_SIGNATURE + b"not chunks"  # left as it is


def test_structured_only_results_are_json_and_links_name_their_reader(tmp_path) -> None:
    rendered = render_result(CallResult((), False, {"a": [1, 2]}), server="s", workspace=tmp_path)
    assert json.loads(rendered.text) == {"a": [1, 2]}
    link = Content("link", "file:///x", mime="", uri="file:///x")
    assert render(CallResult((link,), False), server="s", workspace=tmp_path) == (
        '[resource link file:///x; read it with mcp_read_resource(server="s", uri="file:///x")]'
    )
