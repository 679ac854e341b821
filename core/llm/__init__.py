from core.llm.llm import LLM

__all__ = ["LLM"]
