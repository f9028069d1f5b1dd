"""What one model family declares, as data: the record ``families.table.FAMILIES`` is a table of.

A family is one tool-call syntax (its name is the ``tool_format``). Its record says how to
recognise its chat templates and what reasoning tags each implies, how to parse its calls (a
parser class where the syntax needs code of its own, otherwise a ``Regions`` shape configuring
one of the shared regions), how to force a call with a grammar, which tool-call IDs its
template expects and which template repairs it needs. The registry, ``detect`` and ``grammar``
read these records and nothing else, so a family that reuses an existing shape is one record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .shapes import ListSpec, TaggedSpec, XmlSpec

THINK = ("<think>", "</think>")


def has(*needles: str) -> Callable[[str], bool]:
    """A template test: every one of ``needles`` occurs in the template source."""
    return lambda src: all(n in src for n in needles)


@dataclass(frozen=True)
class Template:
    """One recognisable kind of chat template of a family, and the reasoning it implies.

    ``matches``: the test on the template source. Reasoning is split when the template holds
    both ``think`` tags (or when ``think_if`` says so, for templates that assemble their tags
    from variables); ``think`` None: no reasoning block. ``started_after``: prompt endings that
    mean the generation prompt already opened the block (default: the open tag). Formats that
    carry their own reasoning channel (``owns_reasoning``) ignore all three.
    """

    label: str
    matches: Callable[[str], bool]
    think: tuple[str, str] | None = THINK
    started_after: tuple[str, ...] = ()
    think_if: Callable[[str], bool] | None = None


@dataclass(frozen=True)
class Code:
    """A parser class (or region class) a family's syntax needs code for, named rather than
    imported: ``cls`` in ``turnstile.parsing.<module>`` (default: the family's own module,
    named after it). The parsing registry imports it when the family is first used."""

    cls: str
    module: str | None = None


#: A region kind: a spec of one of the shared regions, or a region class (given the opener).
RegionKind = TaggedSpec | ListSpec | XmlSpec | Code


@dataclass(frozen=True, eq=False)
class Regions:
    """A parser shape needing no code: content with call regions opened by markers.

    ``opens``: opening marker -> the region it starts (a ``TaggedSpec``, ``ListSpec`` or
    ``XmlSpec`` of the shared regions, or a region class named by ``Code``). ``drops``:
    markers removed from content (section wrappers, response tags). ``markers``: further
    literal markers of the syntax besides those the openers, drops and specs name (for
    documentation and tests).
    """

    opens: Mapping[str, RegionKind]
    drops: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()

    def all_markers(self) -> tuple[str, ...]:
        """Every literal marker of the shape, each once (the parser class's ``markers``)."""
        found: list[str] = [*self.opens, *self.drops]
        for kind in self.opens.values():
            if isinstance(kind, XmlSpec):
                found += kind.markers
            elif isinstance(kind, TaggedSpec):
                found += [*kind.closes, *kind.aborts]
            elif isinstance(kind, ListSpec):
                found += [*kind.closes, *kind.prefix]
        return tuple(dict.fromkeys([*found, *self.markers]))


@dataclass(frozen=True)
class JsonGrammar:
    """Forced calls as ``before{"name": NAME, "<args_key>": ARGS}after``.

    ``separator``: what the template writes between parallel calls; None when it renders
    one call per turn.
    """

    before: str
    args_key: str
    after: str
    separator: str | None = None


@dataclass(frozen=True)
class XmlGrammar:
    """Forced calls with one tag per parameter: ``before`` + ``call_open`` (``{name}``) + for
    each required parameter ``param_open`` (``{key}``), the value, ``param_close`` + then
    ``call_close`` + ``after``. Values are written as the template does: strings raw,
    everything else as JSON."""

    before: str
    after: str
    call_open: str
    param_open: str
    param_close: str
    call_close: str
    separator: str | None = None


@dataclass(frozen=True)
class TemplatePatch:
    """A named text substitution repairing a template (applied where ``old`` occurs)."""

    name: str
    why: str
    old: str
    new: str


@dataclass(frozen=True)
class Family:
    """Everything Turnstile knows about one tool-call family (see the module docstring).

    ``name``: the ``tool_format``. ``parser``: its parser (``Code`` naming the class, a class
    registered at run time, or a ``Regions`` shape). ``ends``: the end-of-turn markers its
    chat format closes a turn with (a tokenizer's tokens with these texts stop generation).
    ``detect``: its kinds of template, tried in table order (an empty tuple: chosen only with
    ``--tool-parser``). ``grammar``: how to force a call (None: ``tool_choice`` "required"
    or a named function is refused). ``id_style``: tool-call IDs (``parsing.call_ids``).
    ``patches``: template repairs (``chat.patches``).
    """

    name: str
    parser: Code | Regions | type
    detect: tuple[Template, ...] = ()
    grammar: JsonGrammar | XmlGrammar | None = None
    id_style: str = "openai"
    patches: tuple[TemplatePatch, ...] = ()
    ends: tuple[str, ...] = ()
