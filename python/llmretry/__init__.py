"""llmretry: a production retry policy around OpenAI-compatible LLM calls."""

__version__ = "0.1.0"
