"""The pure parts of AUTH: the query URL, the auth server's answer, RE2 patterns and the permission rules."""

from __future__ import annotations

import json
import re

import pytest

from nsqd.auth import AuthError, auth_url, compile_go_regex, parse_auth_response


def answer(**overrides) -> bytes:
    doc = {
        "ttl": 60,
        "identity": "id",
        "identity_url": "u",
        "authorizations": [{"topic": "^t$", "channels": [".*"], "permissions": ["publish"]}],
    }
    doc.update(overrides)
    return json.dumps(doc).encode()


def test_query_url_keys_in_order():
    url = auth_url("127.0.0.1:4181", remote_ip="10.0.0.7", tls=True, common_name="c n", secret=b"s&=+/\xff")
    assert url == ("http://127.0.0.1:4181/auth?common_name=c+n&remote_ip=10.0.0.7&secret=s%26%3D%2B%2F%FF&tls=true")


def test_query_url_full_address():
    url = auth_url("https://auth.example:8443/check", remote_ip="::1", tls=False, common_name="", secret=b"x")
    assert url == "https://auth.example:8443/check?common_name=&remote_ip=%3A%3A1&secret=x&tls=false"


def test_answer_fields_and_expiry():
    state = parse_auth_response(answer(ttl=30), now=100.0)
    assert (state.identity, state.identity_url, state.ttl, state.expires) == ("id", "u", 30, 130.0)
    assert not state.expired(129.9) and state.expired(130.0)
    assert state.response() == b'{"identity":"id","identity_url":"u","permission_count":1}'


def test_answer_keys_are_case_insensitive_and_nulls_ignored():
    state = parse_auth_response(b'{"TTL": 5, "Identity": "x", "identity_url": null, "Authorizations": []}', 0)
    assert (state.ttl, state.identity, state.identity_url, state.authorizations) == (5, "x", "", ())


def test_response_json_escapes_like_go():
    state = parse_auth_response(answer(identity="<a&b>"), 0)
    assert state.response().startswith(b'{"identity":"\\u003ca\\u0026b\\u003e"')


@pytest.mark.parametrize(
    "body, reason",
    [
        (answer(ttl=0), "invalid TTL 0"),
        (answer(ttl=-5), "invalid TTL"),
        (answer(ttl=1.5), "not an integer"),
        (answer(ttl="60"), "not an integer"),
        (answer(identity=7), "not a string"),
        (answer(authorizations={}), "not an array"),
        (answer(authorizations=[{"topic": ".*", "channels": [".*"], "permissions": ["admin"]}]), "unknown permission"),
        (answer(authorizations=[{"topic": "(", "channels": [], "permissions": []}]), "unable to compile topic"),
        (answer(authorizations=[{"topic": ".*", "channels": ["[a"], "permissions": []}]), "unable to compile channel"),
        (answer(authorizations=[{"topic": "(?=x)", "channels": [], "permissions": []}]), "unable to compile topic"),
        (b"<html>", "invalid JSON"),
        (b"[]", "not a JSON object"),
        (b"null", "invalid TTL 0"),
        (b'{"ttl": NaN}', "invalid JSON"),
    ],
)
def test_refused_answers(body, reason):
    with pytest.raises(AuthError, match=re.escape(reason)):
        parse_auth_response(body, 0)


@pytest.mark.parametrize(
    "pattern, text, matches",
    [
        ("orders", "xordersy", True),  # unanchored search
        ("^orders$", "xordersy", False),
        ("^orders$", "orders", True),
        (".*", "", True),
        ("^$", "", True),
        ("", "anything", True),
        ("^a.c\\z", "abc", True),
        ("\\Qa.c\\E", "abc", False),
        ("\\Qa.c\\E", "xa.cx", True),
        ("^[[:digit:]]+$", "0123", True),
        ("^[[:alpha:]_]+$", "ab_c", True),
        ("^[[:alpha:]]+$", "ab1", False),
        ("^\\d+$", "٣", False),  # RE2's \d is ASCII only
        ("(?i)^ORDERS$", "orders", True),
        ("^[]x]+$", "]x]", True),
    ],
)
def test_go_regex_semantics(pattern, text, matches):
    assert (compile_go_regex(pattern).search(text) is not None) is matches


@pytest.mark.parametrize(
    "pattern", ["(?=a)", "(?!a)", "(?<=a)b", "(?<!a)b", "(a)\\1", "(?P<n>a)(?P=n)", "[[:nope:]]", "a\\", "[a"]
)
def test_go_regex_refuses_what_re2_cannot_compile(pattern):
    with pytest.raises(re.error):
        compile_go_regex(pattern)


def _state(*authorizations):
    return parse_auth_response(answer(authorizations=list(authorizations)), 0)


@pytest.mark.parametrize(
    "authorizations, topic, channel, allowed",
    [
        ([{"topic": ".*", "channels": [".*"], "permissions": ["subscribe"]}], "t", "c", True),
        ([{"topic": ".*", "channels": [".*"], "permissions": ["subscribe"]}], "t", "", False),  # publish needed
        ([{"topic": ".*", "channels": [".*"], "permissions": ["publish"]}], "t", "", True),
        ([{"topic": ".*", "channels": [], "permissions": ["publish"]}], "t", "", False),  # no channel pattern
        ([{"topic": ".*", "channels": ["^c$"], "permissions": ["publish"]}], "t", "", False),  # "" must match
        ([{"topic": "^a$", "channels": [".*"], "permissions": ["subscribe", "publish"]}], "b", "c", False),
        (
            [
                {"topic": "^a$", "channels": ["^x$"], "permissions": ["subscribe"]},
                {"topic": "^a$", "channels": ["^c$"], "permissions": ["subscribe"]},
            ],
            "a",
            "c",
            True,
        ),  # any entry
        ([], "t", "c", False),
    ],
)
def test_permission_rules(authorizations, topic, channel, allowed):
    assert _state(*authorizations).allows(topic, channel) is allowed
