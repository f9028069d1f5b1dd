"""``chat.template.dict_first_getattr`` answers what the sandbox's own ``getattr`` answers:
generated dicts and names (dict's own attributes, private and dunder names, missing keys) and
every name a template can ask of ``loop``, compared with an untouched sandbox, and whole
templates rendered both ways. (``tests/test_template_fast_path.py`` renders the corpus against
transformers' own render.)"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.exceptions import SecurityError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

from turnstile.chat.template import dict_first_getattr

pytestmark = pytest.mark.unit

NAMES = st.one_of(
    st.sampled_from(
        ["role", "content", "items", "get", "keys", "pop", "update", "copy", "clear"]
        + ["__class__", "__init__", "_private", "mro", "__dict__", "fromkeys", "setdefault"]
    ),
    st.text(max_size=6),
)
VALUES = st.one_of(st.none(), st.integers(), st.text(max_size=4), st.lists(st.integers()))
ENVS = [ImmutableSandboxedEnvironment, SandboxedEnvironment]


def _outcome(fn, *args):  # noqa: ANN001, ANN002, ANN202
    """A comparable view of an answer: the value, or the undefined's kind and hint."""
    try:
        value = fn(*args)
    except Exception as exc:  # noqa: BLE001 - the raise itself is the answer
        return ("raised", type(exc).__name__, str(exc))
    if isinstance(value, ImmutableSandboxedEnvironment().undefined):
        return ("undefined", type(value).__name__, value._undefined_hint, value._undefined_name)
    return ("value", value)


@pytest.mark.parametrize("env_class", ENVS)
@settings(max_examples=300, deadline=None)
@given(obj=st.dictionaries(NAMES, VALUES, max_size=5), name=NAMES)
def test_dict_attribute_as_the_sandbox(env_class, obj: dict, name: str) -> None:  # noqa: ANN001
    env = env_class()
    fast = dict_first_getattr(env)
    assert _outcome(fast, obj, name) == _outcome(env.getattr, obj, name)


@pytest.mark.parametrize("env_class", ENVS)
@given(obj=st.one_of(VALUES, st.dictionaries(st.text(max_size=3), VALUES)), name=st.integers())
def test_not_a_name_as_the_sandbox(env_class, obj: object, name: int) -> None:  # noqa: ANN001
    env = env_class()
    assert _outcome(dict_first_getattr(env), obj, name) == _outcome(env.getattr, obj, name)


LOOP_NAMES = [
    "index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0",
    "previtem", "nextitem", "cycle", "changed", "missing", "_after", "__class__", "__init__",
    "_iterator", "mro",
]  # fmt: skip


def _render(env_class, fast: bool, source: str, **variables: object) -> tuple:  # noqa: ANN001
    env = env_class()
    if fast:
        env.getattr = dict_first_getattr(env)
    try:
        return ("text", env.from_string(source).render(**variables))
    except (SecurityError, UndefinedError, TypeError) as exc:
        return ("raised", type(exc).__name__, str(exc))


@pytest.mark.parametrize("env_class", ENVS)
@pytest.mark.parametrize("name", LOOP_NAMES)
def test_loop_attribute_as_the_sandbox(env_class, name: str) -> None:  # noqa: ANN001
    # twice in one render: the second answer comes from the kept verdict
    source = f"{{% for x in xs %}}[{{{{ loop.{name} }}}}|{{{{ loop.{name} }}}}]{{% endfor %}}"
    want = _render(env_class, False, source, xs=["a", "b", "c"])
    assert _render(env_class, True, source, xs=["a", "b", "c"]) == want


@settings(max_examples=150, deadline=None)
@given(
    messages=st.lists(st.dictionaries(NAMES, VALUES, max_size=4), max_size=4),
    name=NAMES.filter(lambda n: n.isidentifier()),
)
def test_template_renders_as_the_sandbox(messages: list[dict], name: str) -> None:
    source = (
        "{% for m in messages %}{{ loop.index0 }}:{{ m.role }}/{{ m.content }}/"
        f"{{{{ m.{name} is defined }}}}/{{{{ m.{name} }}}};{{% if loop.last %}}end{{% endif %}}"
        "{% endfor %}"
    )
    for env_class in ENVS:
        want = _render(env_class, False, source, messages=messages)
        assert _render(env_class, True, source, messages=messages) == want
