"""Capture mode: the engine renders, Turnstile records what it saw. ``gateway`` (the room's
door, :class:`PassthroughGateway`) starts one ``call`` per request; ``recording`` builds its
records, ``lineage`` the session's token prefixes."""
