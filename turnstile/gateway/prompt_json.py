"""The JSON text of a call's prompt IDs, made from the session's previous prompt where this one
extends it.

Every engine takes the prompt as a JSON list of IDs. A coding agent's prompt is ~100k IDs, ~600
KB of JSON, and serialising all of it again on every turn was ~9% of the turn's CPU, though
all but the last few thousand IDs are the previous call's prompt. So the text of the last
prompt sent is kept on the session's tree (``Tree.prompt_json``: one per session, ~5.5 bytes
per context token) with the call it belongs to; a prompt that continues that call is its
text plus the IDs after it (the call's completion and the new messages' delta).
"""

from __future__ import annotations

from array import array

import numpy as np
import orjson

from .prompting import Prompt
from .session_trees import Tree


def dumps(ids: array) -> bytes:
    return orjson.dumps(np.frombuffer(ids, dtype=np.int32), option=orjson.OPT_SERIALIZE_NUMPY)


def prompt_json(tree: Tree, prompt: Prompt) -> bytes:
    """``prompt.ids`` as JSON text: from the kept text when it is the parent call's prompt.
    The prompt of a call that extends its parent is the parent's prompt, its completion and
    the delta (``gateway.prompting``), so the parent's prompt is the first ``n`` IDs."""
    kept, parent = tree.prompt_json, prompt.parent
    if kept is None or parent is None or kept[0] != parent.id:
        return dumps(prompt.ids)
    _, n, text = kept
    if n != len(prompt.ids) - len(prompt.delta) - len(parent.completion_ids) or n <= 0:
        return dumps(prompt.ids)
    if n == len(prompt.ids):
        return text
    return text[:-1] + b"," + dumps(prompt.ids[n:])[1:]


def keep(tree: Tree, call_id: str, prompt: Prompt, text: bytes) -> None:
    """Keep ``text`` as the session's last prompt (the call ``call_id`` was recorded)."""
    tree.prompt_json = (call_id, len(prompt.ids), text)
