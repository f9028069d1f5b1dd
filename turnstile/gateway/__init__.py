"""A call's lifecycle, whichever mode records it: admitted at the one door (``admission``,
``control``), then token-in (the ``token_in`` room: Turnstile renders the prompt and records
the call) or capture (the ``capture`` room: the engine renders, we record what it saw), both
committing through ``record``. ``contract`` is what the HTTP edge uses of either."""
