"""autolade's exact lookahead decoding as a transformers ``custom_generate`` folder.

    model.generate(**inputs, custom_generate="<this folder's parent>", trust_remote_code=True, max_new_tokens=128)

transformers loads this file and calls ``generate(model=model, **every argument of generate)``; it
delegates to ``autolade.hf.generate``, which runs ``model.generate`` with
``custom_generate=autolade.hf.lookahead``. Needs ``autolade`` installed (``pip install autolade``).
"""

import autolade.hf


def generate(model, *args, **kwargs):
    """``model.generate(*args, **kwargs)`` decoded by autolade's lookahead engine (see README.md)."""
    return autolade.hf.generate(model, *args, **kwargs)
