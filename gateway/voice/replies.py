"""After a turn's answer is out: in a chat that asked for voice notes, the answer spoken by
`llm.speech_model` and sent as a voice note (Telegram sendVoice, a Slack audio file in the
thread). The speech is priced by the character and asked of the spend caps first; it is counted
on the turn's run (/cost, the console). Whatever goes wrong, the text answer is already there:
a refused or failed voice note is said in one line, never retried into a loop."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from gateway.agent.messages import TurnOutcome, TurnRequest
from gateway.agent.turn import turn_payer
from gateway.budgets import current_payer
from gateway.config import Config
from gateway.delivery.outbox import Outbox
from gateway.events import Outbound, OutboundFile, ThreadKey
from gateway.files.private_files import make_dirs
from gateway.files.session_files import VOICE_DIR
from gateway.files.workspace import session_dir
from gateway.llm import LLMClient, LLMError
from gateway.llm.gate import BudgetReached
from gateway.llm.pricing import chars_cost
from gateway.llm.speech import AudioFormat, Speech
from gateway.store import Store
from gateway.voice.speakable import speakable

log = logging.getLogger(__name__)
# The audio each platform plays inline: Telegram's voice notes are Ogg Opus; Slack plays MP3.
FORMATS: dict[str, AudioFormat] = {"telegram": "opus", "slack": "mp3"}
SPEECH_FAILED = "🔇 No voice note this time: the speech server failed (the text is the whole answer)."


class VoiceReplies:
    def __init__(self, store: Store, config: Config, llm: LLMClient, outbox: Outbox):
        self.store = store
        self.config = config
        self.llm = llm
        self.outbox = outbox

    async def wanted(self, thread: ThreadKey) -> bool:
        """Whether answers in `thread`'s chat are also spoken (its /voice, else voice.default)."""
        if not self.config.llm.speech_model or thread.channel not in FORMATS:
            return False
        chosen = await self.store.preferences.voice(f"{thread.channel}:{thread.chat}")
        return chosen if chosen is not None else self.config.voice.default == "on"

    async def after_turn(self, request: TurnRequest, outcome: TurnOutcome) -> None:
        """The answer of a finished interactive turn as a voice note, where it is wanted."""
        if outcome.stage != "SUCCESS" or not outcome.reply.strip() or request.child is not None:
            return
        if not request.session.interactive or not await self.wanted(request.thread):
            return
        text = speakable(outcome.reply, self.config.voice.max_chars)
        if not text:
            return
        key = f"voice:{outcome.run_id}"
        payer = turn_payer(request.session, request.thread, request.requested_by, request.on_behalf_of)
        paying = current_payer.set(payer)  # spent for whom the turn was, under their caps
        try:
            speech = await self.llm.speak(
                text,
                voice=self.config.voice.voice,
                audio_format=FORMATS[request.thread.channel],
                timeout_s=self.config.voice.timeout_s,
            )
        except BudgetReached as exc:
            await self._say(request, key, f"🔇 No voice note: {exc.message}")
            return
        except LLMError as exc:
            log.warning("voice note for run %s not made: %s (llm.speech_model %s)", outcome.run_id, exc,
                        self.config.llm.speech_model)
            await self._say(request, key, SPEECH_FAILED)
            return
        finally:
            current_payer.reset(paying)
        await self._count(outcome.run_id, speech)
        path = await asyncio.to_thread(self._save, request.session.id, outcome.run_id, speech)
        file = OutboundFile(str(path), path.name, speech.mime, "voice")
        await self.outbox.send(Outbound(request.thread, "", key, reply_to=request.reply_to, file=file))

    async def _count(self, run_id: int, speech: Speech) -> None:
        """The speech on the turn's run: one more call, its cost (unpriced when no price is set)."""
        model = self.config.llm.speech_model
        cost = chars_cost(self.config.llm.price_of(model), speech.chars)
        event = {"model": model, "chars": speech.chars, "bytes": len(speech.audio), "cost_nano_usd": cost}
        await self.store.runs.add_events(
            run_id, [("SPEECH", event, None)], llm_calls=1, cost_nano_usd=cost, unpriced=cost is None
        )

    def _save(self, session_id: int, run_id: int, speech: Speech) -> Path:
        folder = session_dir(self.config.agent.workspace, session_id) / VOICE_DIR
        make_dirs(folder)
        path = folder / f"answer-{run_id}.{speech.extension}"
        path.write_bytes(speech.audio)
        return path

    async def _say(self, request: TurnRequest, key: str, text: str) -> None:
        await self.outbox.send_text(request.thread, text, key=key, reply_to=request.reply_to)
