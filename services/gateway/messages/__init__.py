"""Anthropic's Messages API (``POST /v1/messages``), the third front beside chat/ and responses/."""
