"""Who may talk to the agent and what their turns may do: pairing, approved people and chats,
roles (see docs/access.md)."""

from gateway.access.pairing import Admission, Gatekeeper
from gateway.access.policy import ADMIN, MEMBER, TRUSTED_CHANNELS, AccessPolicy, role_denial_text

__all__ = ["ADMIN", "MEMBER", "TRUSTED_CHANNELS", "AccessPolicy", "Admission", "Gatekeeper", "role_denial_text"]
