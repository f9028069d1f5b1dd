"""Token-in mode: Turnstile renders the prompt and hands the engine token IDs. ``gateway`` (the
room's door, :class:`Gateway`) keeps the sessions' trees (``session_trees``), builds each
call's prompt (``prompting``) and sampling (``sampling``), then one ``call`` owns the rest:
engine events → parse → record (``recording``) → the answer (``answers``), a held call's chunks
resubmitted (``resume``)."""
