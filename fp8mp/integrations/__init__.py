"""Layer integrations, other libraries: fp8mp.integrations.hf (Hugging Face transformers),
fp8mp.integrations.lightning (a Lightning precision plugin), fp8mp.integrations.accelerate (accelerate),
fp8mp.integrations.torchtitan (a torchtitan override of its Linear layers; importing it registers the override).
May import every layer below. The libraries themselves are optional and imported only where
used, so importing this package needs none of them."""
from fp8mp.integrations import hf

__all__ = ["hf"]
