"""What Turnstile knows about each model family, as data: one record per family
(``record.Family``) in one table (``table.FAMILIES``).

A record says how to recognise the family's chat templates and which reasoning tags they
imply, how its calls are written (a shape from ``shapes``, or the parser class it needs code
for, named), how to force a call with a grammar, which tool-call IDs and template repairs it
needs, and which markers end its turns. This package imports nothing else of Turnstile: the
chat layer (end-of-turn tokens, template patches) and the parsing layer (parsers, detection,
grammars) both read it, neither through the other.
"""

from .record import (
    THINK,
    Code,
    Family,
    JsonGrammar,
    Regions,
    Template,
    TemplatePatch,
    XmlGrammar,
    has,
)
from .registry import end_markers, families, family, names, register, template_patches, unregister

__all__ = [
    "THINK",
    "Code",
    "Family",
    "JsonGrammar",
    "Regions",
    "Template",
    "TemplatePatch",
    "XmlGrammar",
    "end_markers",
    "families",
    "family",
    "has",
    "names",
    "register",
    "template_patches",
    "unregister",
]
