"""`gridctl model set`'s profile options: one per declared profile field (grid.events.profile_fields),
its kind and default taken from ModelProfile.

Typer reads a command's options from its signature, so `with_profile_options` writes them into
the command's `__signature__` (the command takes them as keyword arguments) and
`profile_values` turns what was given back into the fields of a profile body. A field declared
there thus has its option here without a line of this file changing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional, TypeVar, get_args, get_origin

import msgspec
import typer

from grid.cli.common import fail
from grid.events.control import ModelProfile
from grid.events.profile_fields import FIELDS, PROFILE_FIELDS, ProfileField, plain

_TYPES = {f.name: f.type for f in msgspec.structs.fields(ModelProfile)}
# What a new profile takes for each field it is not given (a required field has none).
_DEFAULTS = {f.name: f.default if f.default_factory is msgspec.NODEFAULT else f.default_factory()
             for f in msgspec.structs.fields(ModelProfile) if not f.required}


@dataclass(frozen=True)
class ProfileOption:
    spec: ProfileField
    param: str  # the command's keyword argument
    # "list" (repeated, each a value), "map" (repeated KEY=VALUE), "flag" (--x/--no-x) or "scalar".
    kind: str
    cast: type  # a scalar's type, or a map's values'


def _option(spec: ProfileField) -> ProfileOption:
    tp = plain(_TYPES[spec.name])
    origin = get_origin(tp)
    param = spec.cli_option.removeprefix("--").replace("-", "_")
    if origin is tuple:
        return ProfileOption(spec, param, "list", str)
    if origin is dict:
        return ProfileOption(spec, param, "map", plain(get_args(tp)[1]))
    if tp is bool:
        return ProfileOption(spec, param, "flag", bool)
    return ProfileOption(spec, param, "scalar", tp)


PROFILE_OPTIONS: tuple[ProfileOption, ...] = tuple(_option(spec) for spec in PROFILE_FIELDS)


def _new(name: str) -> str:
    """The default a new profile takes for `name`, shown in --help (an existing one keeps its value)."""
    value = _DEFAULTS.get(name)
    if isinstance(value, (tuple, list, dict)) and not value:
        value = "none"
    elif value is None:
        value = "none"
    elif isinstance(value, tuple):
        value = ", ".join(value)
    # Parentheses, not brackets: typer's rich help would read [..] as markup and drop it.
    return f" (new profile: {value}; existing: kept)"


def option_help(option: ProfileOption) -> str:
    name = option.spec.name
    if name not in _DEFAULTS:
        return f"{option.spec.help} (required for a new profile; existing: kept)."
    repeat = " (repeat)" if option.kind in ("list", "map") else ""
    return f"{option.spec.help}{repeat}." + _new(name)


def _parameter(option: ProfileOption) -> inspect.Parameter:
    flag, text = option.spec.cli_option, option_help(option)
    if option.kind in ("list", "map"):
        default, annotation = typer.Option([], flag, help=text), list[str]
    elif option.kind == "flag":
        default = typer.Option(None, f"{flag}/--no-{flag.removeprefix('--')}", help=text)
        annotation = Optional[bool]
    else:
        default, annotation = typer.Option(None, flag, help=text), Optional[option.cast]
    return inspect.Parameter(option.param, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


Command = TypeVar("Command", bound=Callable[..., Any])


def with_profile_options(command: Command) -> Command:
    """`command` (its first parameter the model id, then its own options and **fields) with the
    profile options after the model id, in their declared order."""
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
           for p in inspect.signature(command, eval_str=True).parameters.values()
           if p.kind is not inspect.Parameter.VAR_KEYWORD]
    clash = {o.param for o in PROFILE_OPTIONS} & {p.name for p in own}
    if clash:
        raise TypeError(f"{command.__name__} has parameters named like profile options: {sorted(clash)}")
    generated = [_parameter(o) for o in PROFILE_OPTIONS]
    command.__signature__ = inspect.Signature([own[0], *generated, *own[1:]])  # type: ignore[attr-defined]
    return command


def _pairs(values: list[str], option: str, cast: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            fail(f"{option} expects KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = cast(raw.strip())
        except ValueError:
            fail(f"{option} {item!r}: {raw!r} is not a valid {cast.__name__}")
    return out


def profile_values(given: dict[str, Any]) -> dict[str, Any]:
    """The profile fields the options in `given` (keyword arguments by parameter name) set,
    JSON-shaped; an option not given sets nothing."""
    body: dict[str, Any] = {}
    for option in PROFILE_OPTIONS:
        value = given[option.param]
        if option.kind == "list":
            if value:
                body[option.spec.name] = list(value)
        elif option.kind == "map":
            if value:
                body[option.spec.name] = _pairs(value, option.spec.cli_option, option.cast)
        elif value is not None:
            body[option.spec.name] = value
    return body


def option_of(field: str) -> str:
    """The option that sets profile field `field` ("workload_scores" -> "--workload-score")."""
    spec = FIELDS.get(field)
    return spec.cli_option if spec is not None else "--" + field.replace("_", "-")
