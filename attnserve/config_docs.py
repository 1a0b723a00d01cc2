"""docs/configuration.md, generated from the command line: `python -m attnserve.config_docs > docs/configuration.md`.

Every setting declared with config.setting() is a flag and an environment variable; it is found in the parser
that `attnserve` builds (attnserve/cli.py), with the commands that take it. Flags declared in cli.py alone have
no environment variable and are listed per command. tests/test_config_docs.py fails when the page differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any

from attnserve import config

COMMAND = "python -m attnserve.config_docs > docs/configuration.md"


def config_classes() -> list[type]:
    """Every dataclass of attnserve/config.py whose fields are settings, in the order the file declares them."""
    return [cls for cls in vars(config).values() if isinstance(cls, type) and dataclasses.is_dataclass(cls)
            and cls.__module__ == config.__name__ and all("env" in f.metadata for f in dataclasses.fields(cls))]


def _title(cls: type) -> str:
    """EngineConfig -> Engine, LoadTestConfig -> Load test."""
    words = re.findall(r"[A-Z][a-z0-9]*", cls.__name__.removesuffix("Config"))
    return " ".join([words[0], *(w.lower() for w in words[1:])]) if words else cls.__name__

HEADER = f"""\
# Configuration

<!-- Generated from attnserve/config.py and attnserve/cli.py; do not edit. Regenerate with:
     {COMMAND} -->

This page is generated. After changing a setting, regenerate it with `{COMMAND}`
(tests/test_config_docs.py fails until the page matches).

Every setting is a flag and an environment variable: the flag wins, then the environment, then the default.
A yes/no setting takes `--NAME` and `--no-NAME`, and in the environment `1`/`0`, `true`/`false`, `yes`/`no` or
`on`/`off`. A repeatable setting takes its flag once per value, and in the environment one value or, where the
table says so, several separated by commas. An empty environment variable counts as unset.
"""

# Read outside the dataclasses: (environment, default, what).
OTHER_ENVIRONMENT = (
    ("`ATTNSERVE_CACHE`", "`$XDG_CACHE_HOME/attnserve`, else `~/.cache/attnserve`",
     "where the default model's artifacts are exported on first use, and where graph calibration is recorded "
     "when the artifact directory is read-only"),
    ("`ATTNSERVE_TIMEOUT`, `ATTNSERVE_TLS_CA`, `ATTNSERVE_TLS_CLIENT_CERT`, `ATTNSERVE_TLS_CLIENT_KEY`, "
     "`ATTNSERVE_LB_POLICY`", "as for the client commands above", "also read by `attnserve encode --server`"),
)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(value: Any) -> str:
    if value is None or value == ():
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == "":
        return '`""`'
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"`{value}` ({value >> 20} MiB)"
    return f"`{value}`"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("attnserve's parser has no subcommands")


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest.upper()}`"
    return ", ".join(f"`{flag}`" for flag in action.option_strings)


def generate(parser: argparse.ArgumentParser | None = None, classes: list[type] | None = None) -> str:
    """The whole page, from attnserve's parser and config dataclasses (or those given)."""
    sections = [(cls, _title(cls)) for cls in (config_classes() if classes is None else classes)]
    if parser is None:
        from attnserve.cli import build_parser

        parser = build_parser()
    commands = _subcommands(parser)
    used, own = _sorted_flags(commands, [cls for cls, _ in sections])
    lines = [HEADER, "## Settings: flags and environment variables", ""]
    for cls, title in sections:
        lines += _settings_section(cls, title, used, list(commands))
    lines += _own_flags_section(commands, own)
    lines += ["", "## Other environment variables", "", "| environment | default | what |", "|---|---|---|"]
    lines += [f"| {env} | {default} | {what} |" for env, default, what in OTHER_ENVIRONMENT]
    return "\n".join(lines).rstrip("\n") + "\n"


def _sorted_flags(commands: dict[str, argparse.ArgumentParser], classes: list[type]
                  ) -> tuple[dict[tuple[type, str], list[str]], dict[str, list[argparse.Action]]]:
    """Each command's flags sorted into settings, (class, field) -> the commands that take it, and flags of cli.py's
    own, command -> its actions."""
    used: dict[tuple[type, str], list[str]] = {}
    own: dict[str, list[argparse.Action]] = {}
    for name, sub in commands.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            owner = _owner(action, classes)
            if owner is None:
                own.setdefault(name, []).append(action)
            else:
                used.setdefault((owner, action.dest), []).append(name)
    return used, own


def _owner(action: argparse.Action, classes: list[type]) -> type | None:
    """The class whose setting a flag is: the one that declares it rather than one that takes the same setting
    (config.same_setting); None for a flag of cli.py's own. A setting's flag carries its field's help text, with
    "(env NAME" after it: that is how cli.py's own flags of the same name (embed's --model) are told apart."""
    found = [cls for cls in classes for f in dataclasses.fields(cls)
             if f.name == action.dest and (action.help or "").startswith(f.metadata["help"])
             and f"(env {f.metadata['env']}" in (action.help or "")]
    declared = [cls for cls in found
                if not any(f.name == action.dest and "same_as" in f.metadata for f in dataclasses.fields(cls))]
    return next(iter(declared or found), None)


def _settings_section(cls: type, title: str, used: dict[tuple[type, str], list[str]], commands: list[str]
                      ) -> list[str]:
    """A class's table: the commands that take all its settings in the heading, any other taker on its row."""
    fields = [f for f in dataclasses.fields(cls) if (cls, f.name) in used]
    if not fields:
        return []
    taking = [set(used[(cls, f.name)]) for f in fields]
    heading = sorted(set.intersection(*taking) or set.union(*taking), key=commands.index)
    lines = [f"### {title} settings ({', '.join(f'`attnserve {c}`' for c in heading)})", ""]
    shared: dict[type, list[str]] = {}  # the settings cls takes from another class (config.same_setting)
    for f in dataclasses.fields(cls):
        if "same_as" in f.metadata:
            shared.setdefault(f.metadata["same_as"], []).append(f"`--{f.name.replace('_', '-')}`")
    for origin, flags in shared.items():
        lines += [f"Also the {_title(origin).lower()} setting{'s' if len(flags) > 1 else ''} "
                  f"{' and '.join([', '.join(flags[:-1]), flags[-1]] if len(flags) > 1 else flags)}.", ""]
    lines += ["| flag | environment | default | what |", "|---|---|---|---|"]
    for f in fields:
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        flag = "--" + f.name.replace("_", "-")
        flag = f"`{flag}`, `--no-{flag[2:]}`" if kind.startswith("bool") else f"`{flag}`"
        what = f.metadata["help"]
        if f.metadata.get("choices"):
            what += "; one of " + ", ".join(f"`{c}`" for c in f.metadata["choices"])
        if kind.startswith("tuple") and "repeatable" not in what:
            what += "; repeatable" + ("" if f.metadata.get("env_separator") else " (one value in the environment)")
        takers = used[(cls, f.name)]
        if len([c for c in takers if c in heading]) < len(heading):
            what += " (" + ", ".join(f"`{c}`" for c in takers if c in heading) + " only)"
        if also := [c for c in takers if c not in heading]:
            what += " (also " + ", ".join(f"`{c}`" for c in also) + ")"
        lines.append(f"| {flag} | `{f.metadata['env']}` | {_cell(_default(f.default))} | {_cell(what)} |")
    return [*lines, ""]


def _own_flags_section(commands: dict[str, argparse.ArgumentParser], own: dict[str, list[argparse.Action]]
                       ) -> list[str]:
    """The flags of cli.py's own, by command; one that every command takes alike (--log-level) is one row."""
    lines = ["## Flags of each command without an environment variable", "",
             "| command | flag | default | what |", "|---|---|---|---|"]
    shared = [a for a in next(iter(own.values()), []) if a.option_strings and all(
        any(b.option_strings == a.option_strings and b.help == a.help for b in actions) for actions in own.values())
        and len(own) == len(commands)]
    rows = [("every command", a) for a in shared] + [
        (f"`{name}`", a) for name, actions in own.items() for a in actions
        if not any(a.option_strings == s.option_strings for s in shared)]
    for name, action in rows:
        what = action.help or ""
        if action.choices and not isinstance(action.choices, dict):
            what += "; one of " + ", ".join(f"`{c}`" for c in action.choices)
        if action.required and action.option_strings:
            what += " (required)"
        if not action.option_strings:  # a positional argument
            default = "—"
        else:
            default = _default(False if isinstance(action, argparse._StoreTrueAction) else action.default)
        lines.append(f"| {name} | {_flags(action)} | {_cell(default)} | {_cell(what)} |")
    return lines


def main() -> None:
    print(generate(), end="")


if __name__ == "__main__":
    main()
