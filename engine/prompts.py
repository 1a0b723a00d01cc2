"""Prompts: text a model's checkpoint puts before its inputs (E5's "query: "), chosen per request by name
(prompt_name, as TEI and sentence-transformers call it) or given raw (prompt).

The manifest keeps the checkpoint's `prompts` and `default_prompt_name` (config_sentence_transformers.json);
the default prompt applies when a request names none. The prompt is part of the text, so its tokens count
toward max_seq_length, as in sentence-transformers. Read through getattr so that this works on manifests
written before prompts were kept (no prompts, no default).
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
    prompts: dict[str, str] = getattr(manifest, "prompts", None) or {}
    if prompt_name is not None:
        if prompt_name not in prompts:
            known = ", ".join(repr(n) for n in prompts)
            which = f"this model's prompts are {known}" if known else "the model has no prompts"
            raise _invalid("prompt_name", f"prompt_name {prompt_name!r} does not exist: {which}")
        return prompts[prompt_name]
    default = getattr(manifest, "default_prompt_name", None)
    return prompts.get(default, "") if default else ""


def apply_prompt(manifest: Manifest, texts: Sequence[str], prompt_name: str | None = None,
                 prompt: str | None = None) -> list[str]:
    """Each text with the chosen prompt before it (see prompt_text)."""
    before = prompt_text(manifest, prompt_name, prompt)
    return [before + text for text in texts] if before else list(texts)
