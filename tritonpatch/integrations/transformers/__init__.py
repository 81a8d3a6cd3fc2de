"""tritonpatch's attention kernels as a Hugging Face ``transformers`` attention implementation.

>>> from tritonpatch.integrations import transformers as tp_transformers
>>> tp_transformers.register()                       # adds attn_implementation="tritonpatch"
>>> model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="tritonpatch")

The model's masks are read from transformers' own mask functions: causal and bidirectional
attention, sliding windows (``config.sliding_window``), packed sequences (``position_ids`` restarting
at 0, no padding) as a document mask, GQA, the model's scaling and ``softcap``. What cannot be
expressed exactly runs transformers' SDPA path with one warning per cause (see
:mod:`.attention`). Importing this module does not import transformers; :func:`register` does.
"""
from __future__ import annotations

NAME = "tritonpatch"


def register(name: str = NAME) -> str:
    """Register the attention function and its mask function under ``name`` in transformers'
    ``AttentionInterface`` and ``AttentionMaskInterface`` (for every model, this process); returns
    ``name``, the value for ``attn_implementation``. Registering again replaces the entries."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ModuleNotFoundError as exc:
        if exc.name != "transformers":
            raise
        raise ImportError("tritonpatch.integrations.transformers.register() needs transformers 5: "
                          "pip install 'tritonpatch[transformers]' (or pip install transformers)") from exc
    from . import attention

    AttentionInterface.register(name, attention.attention_forward)
    AttentionMaskInterface.register(name, attention.create_mask)
    return name
