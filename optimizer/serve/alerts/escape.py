"""Escaping per chat platform. Workload ids and names, node and site names come from agents: none may mention
anyone, link anywhere, embed an image or break the message's markup, whatever they contain. No zero-width
character is used to break anything up: text passes through places that strip them (the protocol's own checks
among them), and what they protected would come back.

- Slack mrkdwn: ``&``, ``<`` and ``>`` become ``&amp;``, ``&lt;`` and ``&gt;`` (Slack's documented escapes); that
  alone defuses ``<!channel>``, ``<@U…>`` and ``<url|text>``. A node's text goes in a code span (``slack_code``),
  and every mrkdwn text object is sent with ``verbatim: true``, under which Slack turns no URL, bare domain or
  channel name into a link and parses no mention (docs.slack.dev, Block Kit "Text object"). Clipping escaped
  text never cuts an entity in two.
- Mattermost (CommonMark): a node's text goes in a code span (``markdown_code``): literal in every Markdown, with
  no link, autolink, emphasis or ``~channel`` inside, and Mattermost's server reads mentions only outside code
  (its mention parser takes Markdown text nodes alone). Text of fleetfit's own is backslash-escaped.
- Teams (Adaptive Card TextBlock Markdown, which has no code span): the punctuation that starts markup is
  backslash-escaped, and ``://`` and ``www.`` are written ``[:]//`` and ``www[.]`` (the usual way to quote a URL
  without it being one), so no URL becomes a link (``markdown``).
- Plain text (Mattermost's ``fallback``, shown in notifications): URLs as above, ``@`` as the full-width ``＠`` and
  ``<`` as ``‹``, so nothing there mentions anyone or reads as Slack-style markup (``plain``).
"""

from __future__ import annotations

import re
from urllib.parse import quote

from optimizer.plan.render import printable

_MARKDOWN = re.compile(r"([\\`*_\[\]()#<>~&!|])")
_LIST_MARKER = re.compile(r"^(\s*)([-+]|\d+[.)])")
_URL = re.compile(r"://|(?i:\bwww)\.")
_BACKTICKS = re.compile(r"`+")
SLACK_BACKTICK = "\u02cb"  # ˋ: Slack has no escape for a backtick, which would end the code span


def slack(text: str) -> str:
    return printable(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_code(text: str) -> str:
    """A node's ``text`` as a Slack code span, escaped; "" for no text (an empty span would show two backticks)."""
    return f"`{slack(text).replace('`', SLACK_BACKTICK)}`" if text else ""


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


def _defang(text: str) -> str:
    return _URL.sub(lambda m: "[:]//" if m.group() == "://" else m.group()[:-1] + "[.]", text)


def markdown(text: str) -> str:
    escaped = _MARKDOWN.sub(r"\\\1", _defang(printable(text)))
    return _LIST_MARKER.sub(lambda m: m.group(1) + m.group(2)[:-1] + "\\" + m.group(2)[-1], escaped)


def markdown_code(text: str) -> str:
    """A node's ``text`` as a CommonMark code span: fenced by one backtick more than its longest run of them, and
    padded with a space on each side (which CommonMark takes off again) where it starts or ends with a backtick or
    a space; "" for no text."""
    text = printable(text)
    if not text:
        return ""
    fence = "`" * (max(map(len, _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def plain(text: str) -> str:
    """Plain text that clients show as it is, but may still scan for mentions and URLs."""
    return _defang(printable(text)).replace("@", "\uff20").replace("<", "\u2039")


def markdown_url(url: str) -> str:
    """A URL safe inside ``[text](url)``: characters that could end or extend the link are percent-encoded."""
    return quote(url, safe=":/?#@!$&'*+,;=%~-._")
