"""A family's parser class, built from its record (``turnstile.families``): a ``Regions``
shape becomes a :class:`ShapedParser` subclass; a class named by ``Code`` is imported from its
module here (named after the family)."""

from __future__ import annotations

import importlib
from typing import ClassVar, cast

from ..families.record import Code, Family, Regions
from ..families.shapes import ListSpec, TaggedSpec, XmlSpec
from .base import Region, RegionParser
from .jsonlist import JsonCallList
from .tagged import TaggedJsonCall
from .types import ToolCallParser
from .xmlcalls import XmlCalls


def resolve(code: Code, module: str) -> type:
    """The class ``code`` names, from ``turnstile.parsing.<code.module or module>``."""
    found = importlib.import_module(f"{__package__}.{code.module or module}")
    return cast("type", getattr(found, code.cls))


class ShapedParser(RegionParser):
    """A ``RegionParser`` whose openers and regions come from a ``Regions`` shape."""

    shape: ClassVar[Regions]

    def open_region(self, marker: str) -> Region:
        kind = self.shape.opens[marker]
        if isinstance(kind, TaggedSpec):
            return TaggedJsonCall(marker, kind)
        if isinstance(kind, ListSpec):
            return JsonCallList(marker, kind)
        if isinstance(kind, XmlSpec):
            return XmlCalls(marker, kind, self.tools)
        return cast("Region", resolve(kind, kind.module or "")(marker))


def parser_class(family: Family) -> type[ToolCallParser]:
    """The class to instantiate per completion (a ``Regions`` shape's is built here)."""
    parser = family.parser
    if isinstance(parser, Code):
        return cast("type[ToolCallParser]", resolve(parser, family.name))
    if not isinstance(parser, Regions):
        return cast("type[ToolCallParser]", parser)
    title = "".join(part.title() for part in family.name.split("_"))
    cls = type(
        f"{title}ToolParser",
        (ShapedParser,),
        {
            "__doc__": f"``{family.name}`` tool calls (declared in ``turnstile.families``).",
            "__module__": __name__,
            "shape": parser,
            "openers": tuple(parser.opens),
            "drops": parser.drops,
            "markers": parser.all_markers(),
        },
    )
    return cast("type[ToolCallParser]", cls)
