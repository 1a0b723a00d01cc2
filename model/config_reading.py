"""The checks every family's config.json reader makes, each a one-line CheckpointError naming the setting: the
architectures, true/false flags, a setting's supported values, plain-rotary rope settings, layer types, and sizes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attnserve.errors import CheckpointError

ROPE_KEYS = {"rope_type", "rope_theta"}  # a plain rotary rope_parameters object: rope_type "default", one base


def check_architectures(raw: dict[str, Any], path: Path, encoders: tuple[str, ...], runs: str | None = None) -> None:
    """Refuse an architecture whose output is not the encoder's (a task head the export would drop). runs: what the
    refusal says the export runs; default: the bare encoder's architectures."""
    architectures = raw.get("architectures") or []
    if not isinstance(architectures, list):
        raise CheckpointError(f"{path}: architectures must be a list, got {architectures!r}")
    heads = [a for a in architectures if a not in encoders]
    if heads:
        runs = f"the bare encoder: {' or '.join(encoders)}" if runs is None else runs
        raise CheckpointError(f"{path}: cannot reproduce architecture {heads[0]} (the export runs {runs})")


def check_settings(raw: dict[str, Any], path: Path, reproduced: dict[str, Any]) -> None:
    """Refuse each setting whose value is not the one this code runs (a missing key reads as that value)."""
    for key, value in reproduced.items():
        if raw.get(key, value) != value:
            raise CheckpointError(f"{path}: cannot reproduce {key} {raw[key]!r} (only {value!r})")


def check_supported(path: Path, key: str, value: Any, choices: Iterable[str]) -> Any:
    """value, if one of choices (an activation's name, say); else refused, the choices listed in their order."""
    choices = list(choices)
    if value not in choices:
        raise CheckpointError(f"{path}: {key} {value!r} is not supported (only {', '.join(choices)})")
    return value


def flag(raw: dict[str, Any], key: str, path: Path, none_is_false: bool = False) -> bool:
    """A true/false setting, false when missing (and, with none_is_false, when null)."""
    value = raw.get(key, False)
    if none_is_false and value is None:
        return False
    if not isinstance(value, bool):
        raise CheckpointError(f"{path}: {key} must be true or false, got {value!r}")
    return value


def refuse_rope_scaling(raw: dict[str, Any], path: Path) -> None:
    if raw.get("rope_scaling") is not None:
        raise CheckpointError(f"{path}: cannot reproduce rope_scaling {raw['rope_scaling']!r} (only plain RoPE)")


def check_object(value: Any, path: Path, name: str) -> None:
    """Refuse a value that is given and not a JSON object."""
    if value is not None and not isinstance(value, dict):
        raise CheckpointError(f"{path}: {name} must be an object, got {value!r}")


def plain_rope_theta(params: Any, legacy: Any, path: Path, name: str = "rope_parameters") -> float:
    """The rope base of a rope_parameters object (transformers 5), or legacy (the 4.x key's value) where it is None
    or gives no rope_theta. Only plain rotary (rope_type "default" with its rope_theta) is reproduced."""
    if params is None:
        return float(legacy)
    if not isinstance(params, dict) or params.get("rope_type", "default") != "default" or set(params) - ROPE_KEYS:
        raise CheckpointError(f"{path}: cannot reproduce {name} {params!r} "
                              "(only rope_type 'default' with its rope_theta)")
    return float(params.get("rope_theta", legacy))


def single_rope_theta(raw: dict[str, Any], path: Path, default: float) -> float:
    """The one rope base of a family with one: rope_parameters (transformers 5), else rope_theta (4.x), else
    default; any scaling is refused."""
    refuse_rope_scaling(raw, path)
    return plain_rope_theta(raw.get("rope_parameters"), raw.get("rope_theta", default), path)


def layer_type_rope_theta(raw: dict[str, Any], layer_type: str, legacy: Any, path: Path) -> float:
    """The rope base of one layer type, in a family with a base per type (Gemma 3, ModernBERT):
    rope_parameters[layer_type] (transformers 5), else legacy (the 4.x key's value); any scaling is refused
    (transformers would apply it to the full layers' rotary)."""
    refuse_rope_scaling(raw, path)
    rope_parameters = raw.get("rope_parameters")
    check_object(rope_parameters, path, "rope_parameters")
    params, name = (rope_parameters or {}).get(layer_type), f"rope_parameters[{layer_type!r}]"
    check_object(params, path, name)
    return plain_rope_theta(params, legacy, path, name)


def listed_layer_types(raw: dict[str, Any], num_layers: int, kinds: tuple[str, str], path: Path
                       ) -> tuple[str, ...] | None:
    """layer_types as transformers 5 saves it, one of kinds per layer; None where the config leaves it out (4.x
    configs say it another way, each family its own)."""
    types = raw.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != num_layers or any(t not in kinds for t in types):
        raise CheckpointError(f"{path}: layer_types must list {kinds[0]!r} or {kinds[1]!r} for each of the "
                              f"{num_layers} layers, got {types!r}")
    return tuple(types)


@contextmanager
def invalid_config(path: Path) -> Iterator[None]:
    """Around building a config: a missing field or a value the config refuses becomes a one-line refusal."""
    try:
        yield
    except KeyError as e:
        raise CheckpointError(f"{path}: missing field {e.args[0]!r}") from None
    except (TypeError, ValueError, AssertionError, ZeroDivisionError) as e:
        raise CheckpointError(f"{path}: invalid config: {e}") from None


def check_positive(cfg: Any, path: Path, sizes: Iterable[str], above_zero: str, *values: float) -> None:
    """Refuse a size (cfg's attributes named by sizes) below 1, or one of values not above 0 (above_zero names them
    in the refusal)."""
    given = {k: getattr(cfg, k) for k in sizes}
    if any(v < 1 for v in given.values()) or not all(v > 0 for v in values):
        raise CheckpointError(f"{path}: invalid config: sizes must be positive and {above_zero} above 0, got "
                              + ", ".join(str(v) for v in (given, *values)))
