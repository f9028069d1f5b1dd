"""The ASGI server: OpenAI Chat Completions for harnesses, session and record APIs for trainers."""
