"""Schemathesis hooks for the API fuzz run (tests/service/test_svc_openapi_fuzz.py): one check.

The wire graph's schema states every rule JSON Schema can; the rest (refs resolve, names are
unique, the op is known and its arguments fit its signature, element counts, constant bytes) are
listed in compiler.wire_schema.SEMANTIC_RULES and written into the schema's description. A
schema-valid graph that breaks one of those is rightly rejected, so the run lets
`positive_data_acceptance` take a 422, and this check then demands that every 422 answered to
schema-valid (positive) data is an `invalid_graph` (or `over_limit`, the service's own, lower
limit on tensor sizes) whose detail is one of those documented rules.
Any other 422 to valid data (a rule the schema could have said, a target or options problem, a
request field) fails the run, as would any other status the built-in check refuses.

Loaded by schemathesis from this file (`hooks = "tests/service/schemathesis_hooks.py"` in the
generated config), never imported by pytest.
"""

from __future__ import annotations

import json
import os
import re

import schemathesis

# rule (compiler.wire_schema.SEMANTIC_RULES) -> the details compiler/graph.py writes when it is broken
SEMANTIC_DETAILS: dict[str, tuple[str, ...]] = {
    "unique-names": (r"duplicate name '",),
    "refs-resolve": (r"names no input or node \(dangling ref\)", r"nodes must be in topological order"),
    "ref-index": (r"has \d+ outputs; the ref needs an index", r"returns a list of tensors; the ref needs an index",
                  r"has a single output; drop the index", r"index -?\d+ out of range for '",
                  r"returns nothing; there is no tensor to refer to"),
    "known-op": (r"unknown (ATen|prims) op '",),
    "op-signature": (r"takes at most \d+ positional argument", r"has no argument '", r"is also given positionally",
                     r"is missing required argument '"),
    "tensor-size": (r"\d+ elements, over the limit of \d+$", r"span \d+ elements of storage, over the limit of \d+$",
                    r"has [\d,]+ elements \(shape \[.*\]\), over this service's limit of [\d,]+ per tensor$"),
    "stride-rank": (r"stride has \d+ entries for a shape of rank \d+$",),
    "constant-bytes": (r"holds \d+ bytes; shape .* need \d+$", r"constants hold \d+ bytes so far, over the limit of \d+ per graph$"),
}
_PATTERNS = [(rule, re.compile(pattern)) for rule, patterns in SEMANTIC_DETAILS.items() for pattern in patterns]


def semantic_rule(body: object) -> str | None:
    """The documented semantic rule a 422 body reports, or None when it reports anything else."""
    if not isinstance(body, dict) or body.get("error") not in ("invalid_graph", "over_limit"):
        return None
    where, detail = body.get("where") or "", body.get("detail") or ""
    if not where.startswith("graph"):
        return None
    return next((rule for rule, pattern in _PATTERNS if pattern.search(detail)), None)


@schemathesis.check
def positive_422_is_a_semantic_rule(ctx, response, case):
    """A 422 to schema-valid data must name one of the graph rules the schema documents but
    cannot state; anything else means the schema let through what the service refuses."""
    meta = case.meta
    if response.status_code != 422 or meta is None or not meta.generation.mode.is_positive:
        return None
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
    rule = semantic_rule(body)
    _record(rule)
    if rule is None:
        raise AssertionError(
            "a schema-valid request was rejected for a reason the schema does not document as a semantic "
            f"rule (compiler.wire_schema.SEMANTIC_RULES): {response.content[:500]!r}")
    return True


def _record(rule: str | None) -> None:
    """One line per positive-data 422 (the rule, or "undocumented") to FUSEWIRE_FUZZ_RULES, for the figures."""
    path = os.environ.get("FUSEWIRE_FUZZ_RULES")
    if path:
        with open(path, "a") as out:
            out.write(f"{rule or 'undocumented'}\n")
