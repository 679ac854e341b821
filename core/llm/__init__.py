from core.llm.arrivals import Arrival
from core.llm.llm import LLM

__all__ = ["LLM", "Arrival"]
