"""The Anthropic Messages dialect: ``dialect`` (its edge, content blocks and events, its errors)
and ``request`` (its body → a Chat body)."""
