"""The pieces of attachment handling: sniffing, safe names, image sizes and their token cost,
content parts and their merge, and a file sent while a turn runs (steer mode)."""

from __future__ import annotations

import io
from dataclasses import dataclass, field

from fakes.channel import FakeChannel
from fakes.llm import FakeLLM
from harness import ALICE, make_config, running_gateway
from media import image_bytes, pdf_bytes, text_of
from PIL import Image

from gateway.attachments import data_url, image_tokens, safe_name, sniff
from gateway.attachments.images import fitted
from gateway.context.render import merge_user
from gateway.events import Attachment, Fetched, InboundMessage, ThreadKey


def test_the_type_comes_from_the_bytes_not_the_name() -> None:
    assert sniff(pdf_bytes("x"), "photo.jpg") == "application/pdf"
    assert sniff(image_bytes(4, 4), "report.pdf") == "image/jpeg"
    assert sniff(image_bytes(4, 4, fmt="PNG")) == "image/png"
    assert sniff(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "image/webp"
    assert sniff(b"OggS\x00\x02rest") == "audio/ogg"
    assert sniff(b"a,b\n1,2\n", "data.csv") == "text/csv"
    assert sniff("naïve text".encode(), "notes") == "text/plain"
    assert sniff(b"\x00\x01\x02binary", "notes.txt") == "application/octet-stream"
    assert sniff(b"<html><body>Sign in</body></html>", "x.html") == "text/html"


def test_names_stay_inside_their_folder() -> None:
    assert safe_name("../../etc/passwd") == "passwd"
    assert safe_name("..\\..\\boot.ini") == "boot.ini"
    assert safe_name(".hidden") == "hidden"
    assert safe_name("Report (final) v2.pdf") == "Report (final) v2.pdf"
    assert safe_name("a/b<c>|d?.txt") == "b_c_d_.txt"
    long = safe_name("x" * 300 + ".txt")
    assert len(long) == 120 and long.endswith(".txt")


def test_image_sizes_and_their_token_cost() -> None:
    assert fitted(4000, 3000, 1568) == (1568, 1176)
    assert fitted(100, 50, 1568) == (100, 50)  # never upscaled
    assert image_tokens(1568, 1176) == 85 + 170 * 4  # shortest side to 768: 1024x768, 2x2 tiles
    assert image_tokens(512, 512) == 85 + 170
    assert image_tokens(4000, 1000) == 85 + 170 * 4  # fit in 2048: 2048x512, 4x1 tiles
    assert image_tokens(3000, 1000) == 85 + 170 * 8  # fit in 2048: 2048x683, 4x2 tiles
    assert image_tokens(0, 0) == 85 + 170 * 4  # unknown size: a typical estimate


def test_a_format_models_do_not_take_is_reencoded(tmp_path) -> None:
    path = tmp_path / "scan.bmp"
    path.write_bytes(image_bytes(800, 400, fmt="BMP"))
    url = data_url(path, "image/bmp", 200)
    assert url is not None and url.startswith("data:image/")
    head, _, data = url.partition(",")
    import base64

    image = Image.open(io.BytesIO(base64.b64decode(data)))
    assert image.size == (200, 100) and image.format in ("PNG", "JPEG")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    assert data_url(tmp_path / "broken.png", "image/png", 200) is None


def test_merging_user_messages_keeps_images_in_order() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    merged = merge_user(
        {"role": "user", "content": [{"type": "text", "text": "look"}, image]}, {"role": "user", "content": "and this"}
    )
    assert merged["content"] == [{"type": "text", "text": "look"}, image, {"type": "text", "text": "and this"}]
    merged = merge_user(
        {"role": "user", "content": "first"}, {"role": "user", "content": [{"type": "text", "text": "b"}, image]}
    )
    assert merged["content"] == [{"type": "text", "text": "first\n\nb"}, image]
    assert merge_user({"role": "user", "content": "a"}, {"role": "user", "content": "b"})["content"] == "a\n\nb"


@dataclass
class FilesChannel(FakeChannel):
    """The in-process channel with files to hand out."""

    files: dict[str, bytes] = field(default_factory=dict)
    fetched: list[str] = field(default_factory=list)

    async def fetch_file(self, attachment: Attachment, max_bytes: int) -> Fetched:
        self.fetched.append(attachment.file_id)
        return Fetched(self.files[attachment.file_id])


async def test_a_file_sent_while_a_turn_runs_joins_it_read(store, tmp_path) -> None:
    channel = FilesChannel(files={"f1": b"late notes\n"})
    async with FakeLLM() as llm:
        llm.tool_call("shell", {"command": "sleep 0.6"}, id="slow")
        llm.reply("Both read.")
        config = make_config(
            llm.base_url,
            str(tmp_path / "ws"),
            inbox={"busy_mode": "steer"},
            approvals={"rules": [{"tool": "shell", "action": "allow"}]},
        )
        async with running_gateway(store, config, channel) as h:
            await h.say("first")
            await h.wait_for(lambda: len(llm.requests) == 1)
            thread = ThreadKey("fake", "chat1", "")
            late = InboundMessage(
                thread, ALICE, "and this file", "fake:late", attachments=(Attachment("document", "f1", "late.txt"),)
            )
            await h.gateway.submit([late])
            await h.idle()
        said = [text_of(m) for m in llm.requests[1]["messages"] if m["role"] == "user"]
        assert any("and this file" in t and "Content:\n<<<\nlate notes\n\n>>>" in t for t in said)
        assert channel.fetched == ["f1"] and len(await store.runs.list()) == 1
        assert h.channel.messages() == ["Both read."]
