"""Chat rendering: tokenizers, templates, and token-in/token-out prompt extension."""
