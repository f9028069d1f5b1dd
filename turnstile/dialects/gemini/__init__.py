"""The Gemini generateContent dialect: ``dialect`` (its edge, the stream choice in the path,
Google's errors) and ``request`` (contents/parts, function declarations → a Chat body)."""
