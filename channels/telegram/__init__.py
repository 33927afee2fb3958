"""The Telegram channel (python-telegram-bot's bare ExtBot)."""

from channels.telegram.channel import TelegramChannel

__all__ = ["TelegramChannel"]
