"""Prompts: text put before each input text, chosen as sentence-transformers' encode() chooses it.

A request gives a raw `prompt` or a `prompt_name` (not both); a name must be one of the checkpoint's prompts
(the manifest keeps them); with neither, the checkpoint's default prompt applies, if it has one. The prompt is
prepended to the text before tokenization, so truncation at max_seq_length counts its tokens, as
sentence-transformers does. Token-id inputs are the caller's own tokens and get no prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnserve.errors import InvalidInputError

from .manifest import Manifest


def _invalid(field: str, problem: str) -> InvalidInputError:
    return InvalidInputError(problem, field=field, description=problem)


def prompt_text(manifest: Manifest, prompt_name: str | None = None, prompt: str | None = None) -> str:
    """The text to put before each input: the raw prompt, the named one, or the model's default ("" if none)."""
    if prompt is not None and prompt_name is not None:
        raise _invalid("prompt", "give prompt_name or prompt, not both")
    if prompt is not None:
        return prompt
    prompts = manifest.prompts
    if prompt_name is not None:
        if prompt_name not in prompts:
            known = ", ".join(repr(n) for n in prompts)
            which = f"this model's prompts are {known}" if known else "the model has no prompts"
            raise _invalid("prompt_name", f"prompt_name {prompt_name!r} does not exist: {which}")
        return prompts[prompt_name]
    return prompts[manifest.default_prompt_name] if manifest.default_prompt_name is not None else ""


def unpooled_prompt(manifest: Manifest, before: str) -> str:
    """The prompt to mark unpooled in each input (TextTokenizer.encode_texts' unpooled_prompt): `before` where the
    model's pooling leaves its prompt out (Pooling include_prompt false: NV-Embed), else ""."""
    return "" if manifest.include_prompt else before


def apply_prompt(manifest: Manifest, texts: Sequence[str], prompt_name: str | None = None,
                 prompt: str | None = None) -> list[str]:
    """Each text with the chosen prompt before it (see prompt_text)."""
    before = prompt_text(manifest, prompt_name, prompt)
    return [before + text for text in texts] if before else list(texts)
