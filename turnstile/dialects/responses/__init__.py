"""The OpenAI Responses dialect: ``dialect`` (its edge, chains by ``previous_response_id``),
``request`` (input items → a Chat body), ``items`` (the answer as output items) and ``stream``
(its typed stream events)."""
