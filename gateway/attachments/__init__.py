"""Files people send, made readable for the model; see docs/attachments.md.

`prepare.AttachmentPreparer` downloads (through the channel's `fetch_file`), stores and reads
each attachment of an inbox item; `content` says what the model and the user are told;
`images` (Pillow) and `documents` (pypdf) hold the third-party readers; `sniff` decides what a
file is from its bytes.
"""

from gateway.attachments.content import Outcome, model_text, note
from gateway.attachments.images import data_url, fitted, image_tokens
from gateway.attachments.prepare import (
    AttachmentPreparer,
    Heard,
    Prepared,
    TranscriptionRefused,
    has_unsettled,
    safe_name,
)
from gateway.attachments.sniff import sniff

__all__ = [
    "AttachmentPreparer",
    "Heard",
    "Outcome",
    "Prepared",
    "TranscriptionRefused",
    "data_url",
    "fitted",
    "has_unsettled",
    "image_tokens",
    "model_text",
    "note",
    "safe_name",
    "sniff",
]
