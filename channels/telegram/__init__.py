"""The Telegram channel (python-telegram-bot's bare Bot)."""

from channels.telegram.channel import TelegramChannel

__all__ = ["TelegramChannel"]
