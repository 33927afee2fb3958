"""Updates in: long polling and the webhook, each batch submitted before it is confirmed.

An update is confirmed to Telegram only after `submit` has stored it: by the next getUpdates
offset, or by the webhook's 200. Callback queries are answered and strangers refused after
the batch is stored.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from telegram import Bot, Update

from channels.telegram.api import Conflicted, translated
from channels.telegram.inbound import ALLOWED_UPDATES, Reading, UpdateReader
from channels.telegram.outlet import Outlet, Target, chunks_of
from channels.telegram.streams import DraftBook
from gateway.config import TelegramConfig
from gateway.events import ChannelError, ChannelState, StoreUnwritable, Submit, SubmitResult

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger("channels.telegram")
OFFSET_CURSOR = "telegram:offset"
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
SECRET_FORMAT = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
REFUSAL = (
    "Sorry, this assistant is private. Your Telegram id is {user_id}:"
    " ask its owner to add it to telegram.allowed_users."
)


@dataclass(frozen=True)
class Unreadable:
    id: int
    why: str


class UpdateIngest:
    """One started bot's way in: read updates, submit them, then answer what needs an answer."""

    def __init__(
        self,
        config: TelegramConfig,
        state: ChannelState,
        bot: Bot,
        outlet: Outlet,
        reader: UpdateReader,
        submit: Submit,
        *,
        drafts: DraftBook | None = None,
    ) -> None:
        self.config = config
        self.state = state
        self.bot = bot
        self.outlet = outlet
        self._reader = reader
        self._submit = submit
        self._drafts = drafts or DraftBook()

    # --- polling -------------------------------------------------------------------

    async def poll_forever(self, backoff_s: float, backoff_max_s: float) -> None:
        """Long-poll on the leader. Each batch is submitted (with the next offset as the
        cursor) before the next getUpdates, which is what confirms it to Telegram."""
        offset = await self._load_offset()
        failures = 0
        while True:
            try:
                raw = await translated("getUpdates", partial(self._get_updates, offset))
                ids = [u["update_id"] for u in raw if isinstance(u, dict) and isinstance(u.get("update_id"), int)]
                if ids:
                    next_offset = max(ids) + 1
                    await self._ingest(self._parsed(raw), cursor=(OFFSET_CURSOR, str(next_offset)))
                    offset = next_offset
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the loop must outlive any single failure
                failures += 1
                delay = min(backoff_s * 2 ** (failures - 1), backoff_max_s)
                await self._wait_after_poll_failure(exc, delay)

    async def _get_updates(self, offset: int | None) -> list[Any]:
        """getUpdates as JSON: the library parses a batch as a whole, so one update it cannot
        read (a field newer than its Bot API version, say) failed the batch every time, and
        the poll never got past it. Each update is parsed on its own (`_parsed`)."""
        timeout = self.config.poll_timeout_s
        api_kwargs = {"offset": offset, "timeout": timeout, "allowed_updates": ALLOWED_UPDATES}
        with warnings.catch_warnings():  # the library would rather we called get_updates
            warnings.simplefilter("ignore")
            result = await self.bot.do_api_request("getUpdates", api_kwargs=api_kwargs, read_timeout=timeout + 5)
        return result if isinstance(result, list) else []

    def _parsed(self, raw: list[Any]) -> list[Update]:
        updates = []
        for data in raw:
            try:
                updates.append(Update.de_json(data, self.bot))
            except Exception as exc:  # noqa: BLE001 - the library raises various errors on odd payloads
                update_id = data.get("update_id") if isinstance(data, dict) else None
                log.warning("telegram: update %s ignored: the Bot API library cannot read it (%r)", update_id, exc)
        return updates

    async def _load_offset(self) -> int | None:
        stored = await self.state.load_cursor(OFFSET_CURSOR)
        if stored is None:
            return None
        if not stored.isdigit():
            log.warning("telegram: ignoring a stored offset that is not a number: %r", stored)
            return None
        return int(stored)

    async def _wait_after_poll_failure(self, exc: Exception, delay: float) -> None:
        if isinstance(exc, Conflicted):
            log.error(
                "telegram: 409 Conflict: another process is polling this bot token or a webhook "
                "is set (%s); retrying in %.1fs",
                exc,
                delay,
            )
        elif isinstance(exc, ChannelError) and exc.retry_after is not None:
            delay = max(delay, exc.retry_after)
            log.warning("telegram: getUpdates flood limit; retrying in %.1fs", delay)
        elif isinstance(exc, ChannelError):
            log.warning("telegram: getUpdates failed (%s); retrying in %.1fs", exc, delay)
        elif isinstance(exc, StoreUnwritable):  # the core said why, once: not confirmed, read again
            log.debug("telegram: a batch of updates not stored (%s); it will be read again in %.1fs", exc, delay)
        else:
            log.exception("telegram: storing a batch of updates failed; it will be read again in %.1fs", delay)
        await asyncio.sleep(delay)

    # --- webhook -------------------------------------------------------------------

    async def handle_webhook(self, request: web.Request) -> web.Response:
        from aiohttp import web  # only webhook mode serves this

        if not self._secret_matches(request.headers.get(SECRET_HEADER, "")):
            log.warning("telegram: webhook call from %s with a missing or wrong secret", request.remote)
            return web.Response(status=401, text="wrong or missing secret token")
        update = self._parse_update(await request.read())
        if isinstance(update, str):
            log.warning("telegram: malformed webhook body: %s", update)
            return web.Response(status=400, text=update)
        if isinstance(update, Unreadable):  # an update, but not one the library reads: taken, skipped
            log.warning("telegram: update %s ignored: the Bot API library cannot read it (%s)", update.id, update.why)
            return web.Response(status=200, text="ok")
        try:
            await self._ingest([update], cursor=None)
        except StoreUnwritable:  # the core said why, once: Telegram delivers it again
            return web.Response(status=503, text="not stored, retry")
        except Exception:
            log.exception("telegram: storing webhook update %s failed", update.update_id)
            return web.Response(status=500, text="not stored, retry")
        return web.Response(status=200, text="ok")

    def _secret_matches(self, given: str) -> bool:
        expected = self.config.webhook_secret
        return bool(expected) and hmac.compare_digest(given.encode(), expected.encode())

    def _parse_update(self, body: bytes) -> Update | Unreadable | str:
        """The update; an update the library cannot read (Telegram would redeliver a refused
        one for ever, holding back those behind it); or why the body is not an update."""
        try:
            data: Any = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return "body is not JSON"
        if not isinstance(data, dict) or not isinstance(data.get("update_id"), int):
            return "not a Telegram update (no integer update_id)"
        try:
            return Update.de_json(data, self.bot)
        except Exception as exc:  # noqa: BLE001 - PTB raises various errors on odd payloads
            return Unreadable(data["update_id"], repr(exc))

    # --- a batch: submit, then answer ------------------------------------------------

    async def _ingest(self, updates: Sequence[Update], *, cursor: tuple[str, str] | None) -> None:
        readings = [self._read(u) for u in updates]
        events = [r.event for r in readings if r.kind == "event" and r.event is not None]
        results = await self._submit(events, cursor=cursor)
        by_id = {r.event_id: r for r in results}
        for reading in readings:
            await self._after_submit(reading, by_id)

    def _read(self, update: Update) -> Reading:
        try:
            reading = self._reader.read(update)
        except Exception:
            log.exception("telegram: update %s could not be read; skipped", update.update_id)
            return Reading("ignore", update.update_id, text="unreadable")
        if reading.draft_id and reading.kind == "event":  # Stop pressed on a draft
            if self._drafts.already_sent(reading.draft_id):
                reading = Reading("ignore", update.update_id, text="Stop pressed on a reply already sent")
            else:
                self._drafts.stop(reading.draft_id)  # before the /stop it becomes is stored and read
        if reading.kind == "ignore":
            log.debug("telegram: update %s ignored: %s", update.update_id, reading.text)
        return reading

    async def _after_submit(self, reading: Reading, results: dict[str, SubmitResult]) -> None:
        if reading.kind == "refuse":
            await self._refuse(reading)
        elif reading.kind == "answer":
            await self._answer_callback(reading.callback_id, reading.text, alert=bool(reading.text))
        elif reading.callback_id and reading.event is not None:
            result = results.get(reading.event.event_id)
            answer, alert = (result.answer, result.alert) if result else ("", False)
            await self._answer_callback(reading.callback_id, answer, alert=alert)

    async def _refuse(self, reading: Reading) -> None:
        """One short refusal per private chat per day; the counter is all that is stored."""
        count = await self.state.bump_counter(f"telegram:refused:{reading.chat_id}:{reading.day}")
        log.info("telegram: refused user %s in chat %s (%s today)", reading.user_id, reading.chat_id, count)
        if count != 1:
            return
        try:
            await self.outlet.send_chunk(
                Target(reading.chat_id, None), chunks_of(REFUSAL.format(user_id=reading.user_id))[0]
            )
        except ChannelError as exc:
            log.warning("telegram: could not send the refusal to chat %s: %s", reading.chat_id, exc)

    async def _answer_callback(self, query_id: str, text: str, *, alert: bool) -> None:
        try:
            await translated(
                "answerCallbackQuery",
                lambda: self.bot.answer_callback_query(query_id, text=text[:200] or None, show_alert=alert),
            )
        except ChannelError as exc:  # an old query (> 15 min) can no longer be answered
            log.warning("telegram: could not answer callback %s: %s", query_id, exc)
