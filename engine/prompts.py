"""Prompts: text put before each input text, chosen as sentence-transformers' encode() chooses it.

A raw `prompt` wins over a `prompt_name`; a name must be one of the checkpoint's prompts (the manifest keeps
them); with neither, the checkpoint's default prompt applies, if it has one. The prompt is prepended to the
text before tokenization, so truncation at max_seq_length counts its tokens, as sentence-transformers does.
Token-id inputs are the caller's own tokens and get no prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnserve.errors import InvalidInputError

from .manifest import Manifest


def resolve_prompt(manifest: Manifest, prompt_name: str | None = None, prompt: str | None = None) -> str:
    """The prompt to put before each text ("" for none); an unknown prompt_name is an InvalidInputError."""
    if prompt is not None:
        return prompt
    if prompt_name is not None:
        if prompt_name not in manifest.prompts:
            known = ", ".join(repr(name) for name in manifest.prompts)
            raise InvalidInputError(
                f"prompt_name {prompt_name!r} does not exist: "
                + (f"the model's prompts are {known}" if known else "the model has no prompts"),
                field="prompt_name")
        return manifest.prompts[prompt_name]
    if manifest.default_prompt_name is not None:
        return manifest.prompts[manifest.default_prompt_name]
    return ""


def apply_prompt(manifest: Manifest, texts: Sequence[str], prompt_name: str | None = None,
                 prompt: str | None = None) -> list[str]:
    """texts with the resolved prompt put before each."""
    chosen = resolve_prompt(manifest, prompt_name, prompt)
    return [chosen + text for text in texts] if chosen else list(texts)
