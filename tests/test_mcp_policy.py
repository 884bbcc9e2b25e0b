"""The proxy's per-tool policies (tools.toml and annotations) and its replayed results."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from intentlog import InvalidInput
from intentlog.proxy import default_policy, parse_tools
from intentlog.proxy._lookups import NOT_FOUND, Hit
from intentlog.proxy._results import receipt_of, replay_of

GOOD = """
[proxy]
namespace = "pay"
timeout = "20s"

[tools.create_payment]
key_argument = "idempotency_key"
key_retention = "24h"
locks_in_flight = true

[tools."open-refund"]
key_argument = "reference"
deduplicates = false
timeout = 5
[tools."open-refund".lookup]
tool = "find_refund"
arguments = { reference = "{key}", amount = "{arguments.amount}", note = "ref {key}" }
found = "refund.id"
not_found_error = "no such refund"

[tools.stripe_like]
profile = "stripe"

[tools.get_balance]
read_only = true
"""


def test_a_tools_file_says_what_each_tool_promises() -> None:
    parsed = parse_tools(GOOD)
    assert parsed.namespace == "pay" and parsed.timeout == 20.0
    pay = parsed.tools["create_payment"]
    assert pay.journaled and pay.deduplicates and pay.locks_in_flight
    assert (pay.key_argument, pay.retention, pay.timeout) == ("idempotency_key", 86400.0, 20.0)
    refund = parsed.tools["open-refund"]
    assert refund.journaled and not refund.deduplicates and refund.timeout == 5.0
    assert refund.lookup is not None and refund.lookup.found == ("refund", "id")
    assert refund.lookup.render("k-1", {"amount": 300}) == {
        "reference": "k-1",
        "amount": 300,  # a whole-string placeholder keeps the argument's type
        "note": "ref k-1",
    }
    stripe = parsed.tools["stripe_like"]
    assert stripe.deduplicates and stripe.retention == 24 * 3600.0 and stripe.locks_in_flight
    assert not parsed.tools["get_balance"].journaled
    assert "looked up with 'find_refund'" in refund.describe()
    assert "UNRESOLVED" in default_policy("x", None).describe()


def test_no_annotation_makes_the_proxy_resend_a_call() -> None:
    assert not default_policy("read", {"readOnlyHint": True}).journaled
    # idempotentHint is the server's word only: a resend needs the tools file's.
    idempotent = default_policy("put", {"idempotentHint": True})
    assert "UNRESOLVED for a person" in idempotent.describe()
    hinted = ({"idempotentHint": True}, {"idempotentHint": True, "destructiveHint": False})
    for hints in (None, {}, {"readOnlyHint": False}, {"readOnlyHint": "yes"}, "junk", *hinted):
        neither = default_policy("send", hints)
        assert neither.journaled and not neither.deduplicates and neither.lookup is None


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        (
            "[tools.a]\nkey_argument = 'k'\nkey_retention = 'soon'\n",
            ":3:",
            "key_retention must be a duration",
        ),
        ("[tools.a]\ntimeout = -1\n", ":2:", "timeout must be a duration > 0"),
        ("[tools.a]\n\n\nretries = 3\n", ":4:", "unknown setting 'retries'"),
        ("[tools.a]\nread_only = true\ntimeout = 3\n", ":3:", "timeout does not apply"),
        ("[tools.a]\nread_only = 'yes'\n", ":2:", "read_only must be true or false"),
        ("[tools.a]\nprofile = 'nope'\n", ":2:", "unknown profile 'nope'"),
        (
            "[tools.a]\nlocks_in_flight = true\n",
            ":2:",
            "locks_in_flight only applies to a service that deduplicates",
        ),
        ("[tools.a]\ndeduplicates = true\n", ":2:", "set key_argument"),
        ("[tools.a]\non_error = 'maybe'\n", ":2:", "on_error must be"),
        ("[tools.a]\nlazy_receipt = true\n", ":2:", "lazy_receipt needs"),
        (
            "[tools.a.lookup]\ntool = 'a'\nfound = 'x'\narguments = { r = '{key}' }\n",
            ":2:",
            "cannot be its own lookup",
        ),
        ("[tools.a.lookup]\nfound = 'x'\n", ":1:", "lookup needs tool"),
        # Without found, any answer (an empty one too) would count as the call having landed.
        ("[tools.a.lookup]\ntool = 'b'\narguments = { r = '{key}' }\n", ":1:", "needs found"),
        ("[tools.a.lookup]\ntool = 'b'\nfound = '.'\n", ":3:", "needs found"),
        ("[tools.a.lookup]\ntool = 'b'\nfound = 3\n", ":3:", "needs found"),
        # A lookup that names nothing of the call asks the same question for every call.
        ("[tools.a.lookup]\ntool = 'b'\nfound = 'x'\n", ":1:", "names nothing of the call"),
        (
            "[tools.a.lookup]\ntool = 'b'\nfound = 'x'\nmatch = { id = 'fixed' }\n",
            ":1:",
            "names nothing of the call",
        ),
        ("[tools.a.lookup]\ntool = 'b'\nfound = 'x'\nmatch = 'id'\n", ":4:", "match must be"),
        (
            "[tools.a.lookup]\ntool = 'b'\nfound = 'x'\narguments = { q = '{arguments.n}' }\n",
            ":1:",
            "asks by the call's arguments, not by its {key}",
        ),
        (
            "[tools.a.lookup]\ntool = 'b'\nfound = 'x'\nmatch = { id = '{nope}' }\n",
            ":4:",
            "unknown placeholder",
        ),
        (
            "[tools.a.lookup]\ntool = 'b'\narguments = { k = '{nope}' }\n",
            ":3:",
            "unknown placeholder",
        ),
        (
            "[tools.a.lookup]\ntool = 'b'\nfound = 'x'\nnot_found_error = '('\n"
            "match = { r = '{key}' }\n",
            ":4:",
            "not a regular expression",
        ),
        ("[proxy]\nnamespace = 'a b'\n", ":2:", "namespace must be"),
        ("[tool.a]\n", ":1:", "unknown table or key 'tool'"),
        ("[tools]\na = 3\n", "", "[tools.a] must be a table"),
        ("[tools.a\n", "", "not valid TOML"),
    ],
)
def test_a_bad_tools_file_is_refused_naming_where_and_what(
    text: str, where: str, what: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_tools(text, "tools.toml")
    message = str(caught.value)
    assert message.startswith("tools.toml" + where), message
    assert what in message


SCHEMA = {
    "type": "object",
    "properties": {"charge_id": {"type": "string"}},
    "required": ["charge_id"],
}


def test_a_replay_fits_the_tools_output_schema_or_says_it_was_applied() -> None:
    tool = {"name": "charge", "outputSchema": SCHEMA}
    result = {"content": [{"type": "text", "text": "ok"}], "structuredContent": {"charge_id": "c1"}}
    fitting = replay_of(receipt_of(result, tool="charge", max_bytes=65536), key="k", tool=tool)
    assert fitting["structuredContent"] == {"charge_id": "c1"} and "isError" not in fitting
    assert fitting["_meta"]["intentlog/operation"]["replay"] is True
    # A person's receipt of another shape: the call was applied, and the model is told so.
    person = replay_of({"id": 7}, key="k", tool=tool, resolved_by="ops")
    assert person["isError"] is True
    assert "applied once already" in person["content"][0]["text"]
    # A result too large to keep: applied, and not repeated for its result.
    big = {
        "content": [{"type": "text", "text": "x" * 100_000}],
        "structuredContent": {"charge_id": "c"},
    }
    reduced = replay_of(receipt_of(big, tool="charge", max_bytes=65536), key="k", tool=tool)
    assert reduced["isError"] is True and reduced["_meta"]["intentlog/operation"]["reduced"]
    untyped = replay_of(receipt_of(big, tool="charge", max_bytes=65536), key="k", tool=None)
    assert untyped["isError"] is False


def test_a_receipt_never_raises_and_masks_credentials_in_text() -> None:
    nested: list[object] = []
    deep = nested
    for _ in range(500):
        deep.append([])
        deep = deep[0]  # type: ignore[assignment]
    for odd in (None, "text", 3, {"content": nested}, {"content": [{"text": object()}]}):
        assert isinstance(receipt_of(odd, tool="t", max_bytes=65536), dict)
    token = "ghp_" + "a" * 36
    kept = receipt_of(
        {"content": [{"type": "text", "text": f"your token is {token}"}]}, tool="t", max_bytes=65536
    )
    assert token not in str(kept) and kept["reduced"]


def test_the_examples_in_docs_mcp_md_are_valid() -> None:
    import json
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "mcp.md").read_text()
    blocks: dict[str, str] = {}
    for language, body in re.findall(r"```(toml|json)\n(.*?)```", text, re.DOTALL):
        blocks.setdefault(language, body)  # the first of each: the tools file, the host's
    parsed = parse_tools(blocks["toml"], "docs/mcp.md")
    assert set(parsed.tools) == {"create_payment", "open_refund", "send_receipt", "get_balance"}
    assert parsed.tools["open_refund"].lookup is not None
    assert parsed.tools["send_receipt"].on_error == "unknown"
    host = json.loads(blocks["json"])
    args = host["mcpServers"]["payments"]["args"]
    assert host["mcpServers"]["payments"]["command"] == "intentlog" and args[0] == "mcp"


def test_a_lookup_answer_is_a_hit_only_when_it_is_this_calls_record() -> None:
    """The verdict on a lookup's answer, for every shape a server may send: empty, null and
    another call's record are never a hit; with ``match`` a list is searched for this call's
    record, and a lone record or two matches that cannot be told apart are Indeterminate."""
    file = parse_tools(
        '[tools.a.lookup]\ntool = "find"\narguments = { q = "{arguments.name}" }\n'
        'found = "items"\nmatch = { name = "{arguments.name}", "meta.key" = "{key}" }\n'
        '[tools.b.lookup]\ntool = "find"\narguments = { q = "{key}" }\nfound = "item.id"\n',
        "tools.toml",
    )
    listed, single = file.tools["a"].lookup, file.tools["b"].lookup
    assert listed is not None and single is not None
    ada = {"name": "Ada", "meta": {"key": "k1"}}
    adam = {"name": "Adam", "meta": {"key": "k0"}}
    call = {"name": "Ada"}
    assert listed.judge({"items": [adam, ada]}, "k1", call) == Hit(ada)
    for empty in ({"items": None}, {"items": []}, {"items": [adam]}, {"items": False}):
        assert listed.judge(empty, "k1", call) == NOT_FOUND, empty
    # An answer of another shape cannot tell: were it "not found", a lookup whose found
    # never matches (a typo, a server that answers otherwise) would resend every call.
    for other in (None, {}, {"result": "T-1 is open"}, "text", [], 3):
        shape = listed.judge(other, "k1", call)
        assert isinstance(shape, str) and shape != NOT_FOUND and "shape" in shape, other
    # Ada's name under another key is another call's record.
    assert listed.judge({"items": [{"name": "Ada", "meta": {"key": "k0"}}]}, "k1", call) == (
        NOT_FOUND
    )
    twice = listed.judge({"items": [ada, ada]}, "k1", call)
    assert isinstance(twice, str) and "2 records at 'items' match" in twice
    alone = listed.judge({"items": adam}, "k1", call)
    assert isinstance(alone, str) and "not this call's" in alone and "'Adam'" in alone
    # Without match, anything present and not empty at found is a hit; nothing else is.
    assert single.judge({"item": {"id": "t-1"}}, "k1", {}) == Hit("t-1")
    assert single.judge({"item": {"id": 7}}, "k1", {}) == Hit(7)
    # null, "", false and 0 say "no", at found or on the way to it.
    for empty in ({"item": {"id": None}}, {"item": {"id": ""}}, {"item": None},
                  {"item": {"id": False}}, {"item": {"id": 0}}):  # fmt: skip
        assert single.judge(empty, "k1", {}) == NOT_FOUND, empty
    for other in ({"item": {}}, {}, None, {"item": "t-1"}):
        shape = single.judge(other, "k1", {})
        assert isinstance(shape, str) and shape != NOT_FOUND, other


def test_every_tools_file_in_the_docs_loads() -> None:
    """A tools file a reader copies from docs/mcp.md is one the proxy accepts."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "mcp.md").read_text()
    blocks = re.findall(r"^```toml\n(# file: (\S+)\n.*?)^```$", text, re.M | re.S)
    assert len(blocks) >= 2
    for body, name in blocks:
        file = parse_tools(body, name)
        assert file.tools, name


def test_match_dot_searches_a_list_of_plain_values_for_the_calls_own() -> None:
    file = parse_tools(
        '[tools.label.lookup]\ntool = "labels_of"\narguments = { name = "{arguments.name}" }\n'
        'found = "labels"\nmatch = { "." = "{arguments.label}" }\n',
        "tools.toml",
    )
    lookup = file.tools["label"].lookup
    assert lookup is not None
    call = {"name": "ada", "label": "urgent"}
    assert lookup.judge({"labels": ["vip", "urgent"]}, "k", call) == Hit("urgent")
    assert lookup.judge({"labels": ["vip"]}, "k", call) == NOT_FOUND  # another call's label
    with pytest.raises(InvalidInput, match=r"not a dotted path"):
        parse_tools('[tools.a.lookup]\ntool = "b"\nfound = "x"\nmatch = { ".." = "{key}" }\n',
                    "tools.toml")  # fmt: skip
