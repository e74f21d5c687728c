"""route_model is bounded (issue 12, item 4): the request is capped at the model, and the parser is linear.

The hole: a 300 K-character request stalled every other call for 45 s, because the HF-id regex rescanned
a long run of id characters from every position in it and every version-looking match split all the text
before it. The cap refuses such a request before any work; the parser itself must also stay linear, so
it is run far past the cap here under a generous hang guard (it takes well under a second; the quadratic
one took minutes). `benchmarks/route_scaling.py` has the timings.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from pydantic import ValidationError

from mm_agent.fields import NAME_CHARS, REQUEST_CHARS
from mm_agent.route import RouteRequest, route_model
from security.common import run_python

HANG_GUARD_S = 60
LONG = 1_000_000  # characters: 500 times the cap


def test_a_300k_request_is_refused_at_the_model_naming_the_limit() -> None:
    with pytest.raises(ValidationError) as info:
        RouteRequest(text="fine-tune wan2.1 " * 18_000)
    text = str(info.value)
    assert "text" in text and str(REQUEST_CHARS) in text


@pytest.mark.parametrize("field", ["model", "task", "mm_version"])
def test_the_other_request_strings_are_short_single_line_names(field: str) -> None:
    with pytest.raises(ValidationError, match=str(NAME_CHARS)):
        RouteRequest(**{field: "w" * (NAME_CHARS + 1)})
    with pytest.raises(ValidationError, match="control character"):
        RouteRequest(**{field: "wan2.1\nt2v"})


def test_a_request_at_the_cap_is_still_routed() -> None:
    text = ("fine-tune wan2.1 t2v on 8 npus " * 100)[:REQUEST_CHARS]
    result = route_model(RouteRequest(text=text))
    assert result.parsed.models == ["wan2.1"] and result.parsed.npus == 8


# Each aims at one pass of the parser; the quadratic parser took from about a minute to several on these.
ADVERSARIAL = {
    "id-run-without-slash": ("a-", []),
    "digit-run": ("1", []),
    "pinned-dependency-versions": ("torch 2.1.0 ", []),
    "known-hf-ids": ("qwen/qwen2.5-vl-7b-instruct ", ["qwen2.5vl"]),
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_the_parser_handles_a_long_adversarial_text(name: str) -> None:
    unit, models = ADVERSARIAL[name]
    code = textwrap.dedent(
        f"""
        import json
        from mm_agent.registry import get_registry
        from mm_agent.route import _parse, load_vocabulary
        p = _parse(({unit!r} * {LONG})[:{LONG}], get_registry(), load_vocabulary())
        print(json.dumps({{"models": p.models, "version": p.version}}))
        """
    )
    stdout = run_python(code, HANG_GUARD_S, f"_parse on {LONG} characters of {unit!r}")
    parsed = json.loads(stdout)
    assert parsed["models"][:1] == models[:1]
    assert parsed["version"] is None  # "torch 2.1.0" is a dependency pin, not a MindSpeed-MM version
