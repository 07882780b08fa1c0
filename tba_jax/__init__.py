"""tba_jax: asynchronous LLM RL post-training with trajectory balance (TBA), in JAX."""
import logging as _logging

# transformers greets every import without torch with "PyTorch was not found"; tba_jax uses
# only its tokenizers and configs (torch reads pytorch_model.bin files, and says so there).
_logging.getLogger("transformers").addFilter(
    lambda record: "PyTorch was not found" not in record.getMessage())
