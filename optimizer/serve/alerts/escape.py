"""Escaping per chat platform. Workload, node and site names come from agents: none may mention a channel,
link, embed an image or break the message's markup, whatever it contains.

- Slack mrkdwn: ``&``, ``<`` and ``>`` become ``&amp;``, ``&lt;`` and ``&gt;`` (Slack's documented escapes); that
  alone defuses ``<!channel>``, ``<@U…>`` and ``<url|text>``. Clipping escaped text never cuts an entity in two.
- Markdown (Mattermost, Teams): the punctuation that starts markup is backslash-escaped (CommonMark allows it
  before any ASCII punctuation), so links, images, emphasis, headings, lists and ``~channel`` stay text; a
  zero-width space follows ``@`` (``@channel``, ``@all`` and ``@user`` notify no one) and breaks ``://`` and
  ``www.``, so no URL is turned into a link.
- Plain text that a platform still scans for mentions (Mattermost's ``fallback``, shown in notifications):
  only mentions are defused.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from optimizer.plan.render import printable

ZWSP = "\u200b"
_MARKDOWN = re.compile(r"([\\`*_\[\]()#<>~&])")
_LIST_MARKER = re.compile(r"^(\s*)([-+]|\d+[.)])")
_AUTOLINK = re.compile(r"(://|(?i:www)\.)")
_MENTION = re.compile(r"([@<])")


def slack(text: str) -> str:
    return printable(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_clip(escaped: str, limit: int) -> str:
    """``escaped`` cut to ``limit`` characters with an ellipsis, never inside an ``&…;`` entity."""
    if len(escaped) <= limit:
        return escaped
    cut = escaped[: limit - 1]
    amp = cut.rfind("&")
    if amp != -1 and ";" not in cut[amp:]:
        cut = cut[:amp]
    return cut + "…"


def slack_link(url: str, label: str) -> str:
    """``<url|label>``: the URL with Slack's escapes and ``|`` percent-encoded, so it cannot end the link early."""
    return f"<{slack(url.replace('|', '%7C'))}|{slack(label)}>"


def markdown(text: str) -> str:
    escaped = _MARKDOWN.sub(r"\\\1", printable(text))
    escaped = _LIST_MARKER.sub(lambda m: m.group(1) + m.group(2)[:-1] + "\\" + m.group(2)[-1], escaped)
    escaped = _AUTOLINK.sub(lambda m: m.group(1)[:-1] + ZWSP + m.group(1)[-1], escaped)
    return escaped.replace("@", "@" + ZWSP)


def plain(text: str) -> str:
    """Plain text some platforms still scan for ``@channel`` and ``<!channel>``."""
    return _MENTION.sub(lambda m: m.group(1) + ZWSP, printable(text))


def markdown_url(url: str) -> str:
    """A URL safe inside ``[text](url)``: characters that could end or extend the link are percent-encoded."""
    return quote(url, safe=":/?#@!$&'*+,;=%~-._")
