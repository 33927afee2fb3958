"""Voice replies: an answer also sent as a voice note, in the chats that asked (`/voice on`).

`speakable.py` turns the model's Markdown into text worth hearing (and cuts a long answer at a
sentence); `replies.py` speaks it after the turn through the spend caps and sends the audio
through the outbox; `command.py` answers `/voice`."""

from gateway.voice.command import voice_command
from gateway.voice.replies import VOICE_DIR, VoiceReplies
from gateway.voice.speakable import speakable

__all__ = ["VOICE_DIR", "VoiceReplies", "speakable", "voice_command"]
