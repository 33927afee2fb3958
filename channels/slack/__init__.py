"""The Slack channel (slack-bolt and slack-sdk)."""
