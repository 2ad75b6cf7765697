"""Command-line forms of a capacity search for one-off runs: ``--slo`` tiers and ``--search LOW:HIGH``.

``--slo "NAME: CONSTRAINT, CONSTRAINT"`` (repeatable, one tier each, at most MAX_TIERS) replaces the
selected entries' tiers; ``--search LOW:HIGH`` (once) turns every selected point into a capacity search
over that range. Both go through the same models as a config's ``slo:`` block and
``users: {search: [LOW, HIGH]}``. Tiers for a selection with no capacity cell are refused by the matrix
(``select``): they would be ignored.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pydantic import ValidationError

from agentsweep.contract.errors import validation_message
from agentsweep.contract.slo import (
    MAX_TIERS,
    SloError,
    SloTier,
    UserSearch,
    check_unique,
    parse_tier_text,
)
from agentsweep.errors import InputError

T = TypeVar("T")
_RANGE = re.compile(r"^\s*(\d+)\s*(?::|\.\.)\s*(\d+)\s*$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--slo",
        action="append",
        metavar="'NAME: C, C'",
        help="an SLO tier for capacity cells, e.g. 'fast: ttft p90 <= 2 s, speed p25 >= 50 tok/s' "
        "(repeatable; replaces the config's tiers)",
    )
    parser.add_argument(
        "--search",
        action=Once,
        metavar="LOW:HIGH",
        help="search the users of every selected point between LOW and HIGH (capacity cells)",
    )


class Once(argparse.Action):
    """A flag that takes one value: given twice, the command line is refused (never the last one
    silently winning)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if getattr(namespace, self.dest, None) is not None:
            parser.error(
                f"{option_string} given twice ({getattr(namespace, self.dest)!r}, then {values!r}): give it once"
            )
        setattr(namespace, self.dest, values)


def positive_int(flag: str, text: str) -> int:
    """A flag's value as a positive integer (InputError naming the flag otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0 or str(value) != text.strip().lstrip("+"):
        raise InputError(f"{flag}: {text!r} is not a positive integer")
    return value


def comma_list(flag: str, text: str | None, convert: Callable[[str, str], T]) -> list[T] | None:
    """A comma list of a flag, each item through ``convert(flag, item)``; None when not given."""
    if text is None:
        return None
    items = [part.strip() for part in text.split(",")]
    if not all(items):
        raise InputError(f"{flag}: empty item in {text!r} (use a comma list like 1,2,4)")
    return [convert(flag, item) for item in items]


def slo_tiers(texts: Sequence[str] | None) -> tuple[SloTier, ...] | None:
    """The tiers of ``--slo`` values, None when none was given."""
    if not texts:
        return None
    if len(texts) > MAX_TIERS:
        raise InputError(f"--slo given {len(texts)} times: at most {MAX_TIERS} tiers")
    tiers = []
    for text in texts:
        try:
            tiers.append(parse_tier_text(text))
        except SloError as err:
            where = f" ({err.path})" if err.path else ""
            raise InputError(f"--slo {text!r}{where}: {err}") from None
    try:
        return check_unique(tuple(tiers))
    except SloError as err:
        raise InputError(f"--slo: tier {err.path!r} given twice") from None


def user_search(text: str | None) -> UserSearch | None:
    """``--search LOW:HIGH`` as a search (None when not given)."""
    if text is None:
        return None
    match = _RANGE.match(text)
    if not match:
        raise InputError(f"--search {text!r}: expected LOW:HIGH, two user counts like 8:64")
    try:
        return UserSearch(search=(int(match.group(1)), int(match.group(2))))
    except ValidationError as err:
        _field, what = validation_message(err, UserSearch)
        raise InputError(f"--search {text!r}: {what}") from None
