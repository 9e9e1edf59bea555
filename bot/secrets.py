"""Keep secrets out of everything the bot prints, posts or writes."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

# GitHub token shapes (classic, fine-grained, app, OAuth, refresh): masked even when they are not
# the bot's own token, e.g. inside a model build's error output.
TOKEN_SHAPES = re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})\b")
MASK = "***"


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a secret containing another is masked whole.
        self.secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def add(self, secret: str | None) -> None:
        if secret and len(secret) >= 4 and secret not in self.secrets:
            self.secrets = sorted([*self.secrets, secret], key=len, reverse=True)

    def __call__(self, text: object) -> str:
        s = str(text)
        for secret in self.secrets:
            s = s.replace(secret, MASK)
        return TOKEN_SHAPES.sub(MASK, s)


class RedactingFilter(logging.Filter):
    """Masks secrets in records of third-party loggers (PyGithub, urllib3) before any handler."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__()
        self.redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self.redact(record.getMessage())
        record.args = ()
        return True


def guard_loggers(redact: Redactor) -> None:
    for name in ("github", "urllib3", "requests"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter(redact))
        else:
            for f in logger.filters:
                if isinstance(f, RedactingFilter):
                    f.redact = redact
