"""A call's lifecycle, whichever mode records it: admitted at the one door (``admission``,
``control``), then token-in (``token_in``: Turnstile renders the prompt, ``prompting``,
``sampling``, ``session_trees``, and records the call, ``token_record``) or capture
(``capture``: the engine renders, ``capture_record`` and ``lineage`` record what it saw), both
committing through ``record`` and answering in the internal Chat Completions shape
(``answers``). ``contract`` is what the HTTP edge uses of either."""
