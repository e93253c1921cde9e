import json

import pytest

from protocol.errors import ProtocolError
from protocol.identify import IdentifyLimits, IdentifyResult, negotiate

LIMITS = IdentifyLimits()

DEFAULT_RESPONSE = (
    b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
    b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
    b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,"output_buffer_timeout":250}'
)


def identify(obj, limits=LIMITS) -> IdentifyResult:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return negotiate(body, limits)


def error_of(obj, limits=LIMITS) -> bytes:
    with pytest.raises(ProtocolError) as info:
        identify(obj, limits)
    assert info.value.fatal
    return info.value.payload()


def test_limits_defaults_are_nsqds():
    assert (
        IdentifyLimits(
            max_rdy_count=2500,
            max_msg_timeout_ms=900000,
            msg_timeout_ms=60000,
            max_heartbeat_interval_ms=60000,
            heartbeat_interval_ms=30000,
            output_buffer_size=16384,
            output_buffer_timeout_ms=250,
            min_output_buffer_timeout_ms=25,
            max_output_buffer_timeout_ms=30000,
            max_output_buffer_size=65536,
            tls_available=False,
            snappy_enabled=True,
            deflate_enabled=True,
            max_deflate_level=6,
            auth_required=False,
            version="1.3.0",
        )
        == LIMITS
    )


def test_default_response_is_byte_exact():
    assert identify({"feature_negotiation": True}).response(LIMITS) == DEFAULT_RESPONSE


@pytest.mark.parametrize("obj", [{}, {"feature_negotiation": False}, b"null", {"feature_negotiation": None}])
def test_without_feature_negotiation_the_answer_is_OK(obj):
    assert identify(obj).response(LIMITS) == b"OK"


def test_defaults():
    assert identify({}) == IdentifyResult(
        client_id=None,
        hostname=None,
        user_agent=None,
        feature_negotiation=False,
        heartbeat_interval_ms=30000,
        output_buffer_size=16384,
        output_buffer_timeout_ms=250,
        tls=False,
        snappy=False,
        deflate=False,
        deflate_level=6,
        sample_rate=0,
        msg_timeout_ms=60000,
    )


def test_identity_fields():
    r = identify({"client_id": "c1", "hostname": "h.example", "user_agent": "pynsq/0.9.1", "short_id": "x"})
    assert (r.client_id, r.hostname, r.user_agent) == ("c1", "h.example", "pynsq/0.9.1")
    assert identify({"client_id": ""}).client_id == ""


# -- each bound of 2.2: (field, value sent, result attribute, effective value or the error text) ----

BOUNDS = [
    ("heartbeat_interval", -1, "heartbeat_interval_ms", -1),
    ("heartbeat_interval", 0, "heartbeat_interval_ms", 30000),
    ("heartbeat_interval", 1000, "heartbeat_interval_ms", 1000),
    ("heartbeat_interval", 60000, "heartbeat_interval_ms", 60000),
    ("heartbeat_interval", 999, None, "heartbeat interval (999) is invalid"),
    ("heartbeat_interval", 5, None, "heartbeat interval (5) is invalid"),
    ("heartbeat_interval", 60001, None, "heartbeat interval (60001) is invalid"),
    ("heartbeat_interval", -2, None, "heartbeat interval (-2) is invalid"),
    ("output_buffer_timeout", -1, "output_buffer_timeout_ms", 0),
    ("output_buffer_timeout", 0, "output_buffer_timeout_ms", 250),
    ("output_buffer_timeout", 25, "output_buffer_timeout_ms", 25),
    ("output_buffer_timeout", 30000, "output_buffer_timeout_ms", 30000),
    ("output_buffer_timeout", 24, None, "output buffer timeout (24) is invalid"),
    ("output_buffer_timeout", 1, None, "output buffer timeout (1) is invalid"),
    ("output_buffer_timeout", 30001, None, "output buffer timeout (30001) is invalid"),
    ("output_buffer_timeout", -2, None, "output buffer timeout (-2) is invalid"),
    ("output_buffer_size", -1, "output_buffer_size", 1),
    ("output_buffer_size", 0, "output_buffer_size", 16384),
    ("output_buffer_size", 64, "output_buffer_size", 64),
    ("output_buffer_size", 65536, "output_buffer_size", 65536),
    ("output_buffer_size", 63, None, "output buffer size (63) is invalid"),
    ("output_buffer_size", 65537, None, "output buffer size (65537) is invalid"),
    ("output_buffer_size", -2, None, "output buffer size (-2) is invalid"),
    ("sample_rate", 0, "sample_rate", 0),
    ("sample_rate", 1, "sample_rate", 1),
    ("sample_rate", 99, "sample_rate", 99),
    ("sample_rate", 100, None, "sample rate (100) is invalid"),
    ("sample_rate", -1, None, "sample rate (-1) is invalid"),
    ("msg_timeout", 0, "msg_timeout_ms", 60000),
    ("msg_timeout", 1000, "msg_timeout_ms", 1000),
    ("msg_timeout", 900000, "msg_timeout_ms", 900000),
    ("msg_timeout", 999, None, "msg timeout (999) is invalid"),
    ("msg_timeout", 900001, None, "msg timeout (900001) is invalid"),
    ("msg_timeout", -1, None, "msg timeout (-1) is invalid"),
]


@pytest.mark.parametrize("field, value, attribute, expected", BOUNDS)
def test_bounds(field, value, attribute, expected):
    if attribute is None:
        assert error_of({field: value}) == f"E_BAD_BODY IDENTIFY {expected}".encode()
    else:
        assert getattr(identify({field: value}), attribute) == expected


def test_bounds_follow_the_limits():
    limits = IdentifyLimits(
        max_heartbeat_interval_ms=2000,
        min_output_buffer_timeout_ms=1,
        max_output_buffer_timeout_ms=50,
        max_output_buffer_size=100,
        max_msg_timeout_ms=5000,
        heartbeat_interval_ms=1500,
        output_buffer_size=80,
        output_buffer_timeout_ms=10,
        msg_timeout_ms=3000,
    )
    r = identify({"output_buffer_timeout": 1}, limits)
    assert (r.heartbeat_interval_ms, r.output_buffer_size, r.output_buffer_timeout_ms, r.msg_timeout_ms) == (
        1500,
        80,
        1,
        3000,
    )
    assert error_of({"heartbeat_interval": 2001}, limits) == b"E_BAD_BODY IDENTIFY heartbeat interval (2001) is invalid"
    assert error_of({"output_buffer_timeout": 51}, limits).endswith(b"(51) is invalid")
    assert error_of({"output_buffer_size": 101}, limits).endswith(b"(101) is invalid")
    assert error_of({"msg_timeout": 5001}, limits) == b"E_BAD_BODY IDENTIFY msg timeout (5001) is invalid"


def test_unbuffered_output_also_disables_the_flush_timer():
    r = identify({"output_buffer_size": -1, "output_buffer_timeout": 100})
    assert (r.output_buffer_size, r.output_buffer_timeout_ms) == (1, 0)


@pytest.mark.parametrize(
    "obj, first",
    [
        (
            {
                "msg_timeout": 1,
                "sample_rate": 100,
                "output_buffer_size": 1,
                "output_buffer_timeout": 1,
                "heartbeat_interval": 1,
            },
            "heartbeat interval (1)",
        ),
        (
            {"msg_timeout": 1, "sample_rate": 100, "output_buffer_size": 1, "output_buffer_timeout": 1},
            "output buffer timeout (1)",
        ),
        ({"msg_timeout": 1, "sample_rate": 100, "output_buffer_size": 1}, "output buffer size (1)"),
        ({"msg_timeout": 1, "sample_rate": 100}, "sample rate (100)"),
        ({"msg_timeout": 1, "snappy": True, "deflate": True, "feature_negotiation": True}, "msg timeout (1)"),
    ],
)
def test_validation_order(obj, first):
    assert error_of(obj) == f"E_BAD_BODY IDENTIFY {first} is invalid".encode()


# -- decoding like Go's encoding/json ---------------------------------------------------------------

DECODE_ERRORS = [
    b"",
    b"not json",
    b"{",
    b"{} x",
    b'{"a":1,}',
    b"{'a':1}",
    b"[]",
    b'"str"',
    b"1",
    b"true",
    b'{"x":NaN}',  # not JSON, even in an unknown field
    b'{"x":Infinity}',
    b'{"client_id":"a\x01"}',  # raw control character in a string
    b'{"heartbeat_interval":"1000"}',
    b'{"heartbeat_interval":1000.0}',  # Go wants an integer literal
    b'{"heartbeat_interval":1e3}',
    b'{"heartbeat_interval":1.5}',
    b'{"heartbeat_interval":true}',
    b'{"heartbeat_interval":[1000]}',
    b'{"msg_timeout":9223372036854775808}',  # past int64
    b'{"sample_rate":2147483648}',  # past int32
    b'{"sample_rate":-2147483649}',
    b'{"deflate_level":{}}',
    b'{"feature_negotiation":1}',
    b'{"feature_negotiation":"true"}',
    b'{"tls_v1":0}',
    b'{"client_id":5}',
    b'{"client_id":["a"]}',
    b'{"hostname":true}',
    b'{"Heartbeat_Interval":"x"}',  # case-folded keys are typed too
    b"[" * 100000 + b"]" * 100000,
]


@pytest.mark.parametrize("body", DECODE_ERRORS)
def test_decode_errors(body):
    assert error_of(body) == b"E_BAD_BODY IDENTIFY failed to decode JSON body"


def test_unknown_fields_are_ignored_whatever_their_type():
    r = identify(b'{"short_id":5,"long_id":[1,{"a":null}],"x":1.5,"y":"z","topology_zone":{}}')
    assert r == identify({})


def test_null_keeps_the_default_and_later_duplicates_win():
    assert identify(b'{"heartbeat_interval":null}').heartbeat_interval_ms == 30000
    assert identify(b'{"client_id":"a","client_id":"b"}').client_id == "b"
    assert identify(b'{"client_id":"a","CLIENT_ID":"b"}').client_id == "b"
    assert identify(b'{"client_id":"a","client_id":null}').client_id == "a"
    assert identify(b'{"client_id":null}').client_id is None


@pytest.mark.parametrize(
    "key, attribute, value, expected",
    [
        ("Heartbeat_Interval", "heartbeat_interval_ms", 5000, 5000),
        ("HEARTBEAT_INTERVAL", "heartbeat_interval_ms", 5000, 5000),
        ("ClIeNt_Id", "client_id", "x", "x"),
        ("FEATURE_NEGOTIATION", "feature_negotiation", True, True),
        ("Sample_Rate", "sample_rate", 7, 7),
        ("ho\u017ftname", "hostname", "h", "h"),  # long s folds to S
        ("cl\u0131ent_id", "client_id", "c", "c"),  # dotless i folds to I
        ("cl\u0130ent_id", "client_id", "c", "c"),  # dotted capital I folds to I
        ("output_bu\ufb00er_size", "output_buffer_size", 100, 16384),  # the ff ligature does not fold
        ("client id", "client_id", "c", None),
        ("clientid", "client_id", "c", None),
    ],
)
def test_keys_match_case_insensitively_like_go(key, attribute, value, expected):
    body = json.dumps({key: value}, ensure_ascii=False).encode()
    assert getattr(negotiate(body, LIMITS), attribute) == expected


def test_strings_with_invalid_utf8_or_lone_surrogates_get_replacement_characters():
    assert identify(b'{"client_id":"a\xffb"}').client_id == "a\ufffdb"
    assert identify(b'{"client_id":"a\\ud800b"}').client_id == "a\ufffdb"
    assert identify(b'{"client_id":"\\ud83d\\ude00"}').client_id == "\U0001f600"


def test_int_range_edges_decode():
    assert identify({"sample_rate": 0, "msg_timeout": 0, "deflate_level": -(1 << 63)}).deflate_level == 6
    assert error_of({"heartbeat_interval": (1 << 63) - 1}).startswith(b"E_BAD_BODY IDENTIFY heartbeat interval")


# -- negotiation ---------------------------------------------------------------------------------


def nego(limits=LIMITS, **requested):
    return identify({"feature_negotiation": True, **requested}, limits)


def test_tls_needs_a_server_certificate():
    assert nego(tls_v1=True).tls is False
    assert nego(IdentifyLimits(tls_available=True), tls_v1=True).tls is True
    assert nego(IdentifyLimits(tls_available=True)).tls is False


def test_snappy():
    assert nego(snappy=True).snappy is True
    assert nego(IdentifyLimits(snappy_enabled=False), snappy=True).snappy is False


@pytest.mark.parametrize(
    "limits, requested, deflate, level",
    [
        (LIMITS, {"deflate": True}, True, 6),
        (LIMITS, {"deflate": True, "deflate_level": 3}, True, 3),
        (LIMITS, {"deflate": True, "deflate_level": 0}, True, 6),
        (LIMITS, {"deflate": True, "deflate_level": -4}, True, 6),
        (LIMITS, {"deflate": True, "deflate_level": 9}, True, 6),  # capped, no error
        (IdentifyLimits(max_deflate_level=9), {"deflate": True, "deflate_level": 9}, True, 9),
        (IdentifyLimits(max_deflate_level=3), {"deflate": True}, True, 3),
        (IdentifyLimits(max_deflate_level=3), {}, False, 3),
        (LIMITS, {"deflate_level": 3}, False, 6),  # a level without deflate is not used
        (IdentifyLimits(deflate_enabled=False), {"deflate": True, "deflate_level": 3}, False, 6),
    ],
)
def test_deflate_level(limits, requested, deflate, level):
    r = nego(limits, **requested)
    assert (r.deflate, r.deflate_level) == (deflate, level)


def test_both_compressions_fail():
    assert error_of({"feature_negotiation": True, "snappy": True, "deflate": True}) == (
        b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"
    )


def test_both_requested_but_one_disabled_is_fine():
    r = nego(IdentifyLimits(snappy_enabled=False), snappy=True, deflate=True)
    assert (r.snappy, r.deflate) == (False, True)


def test_no_upgrades_without_feature_negotiation():
    r = identify({"tls_v1": True, "snappy": True, "deflate": True}, IdentifyLimits(tls_available=True))
    assert (r.tls, r.snappy, r.deflate) == (False, False, False)
    assert r.response(LIMITS) == b"OK"


def test_response_reports_effective_values_in_order():
    limits = IdentifyLimits(
        tls_available=True, auth_required=True, max_deflate_level=9, max_rdy_count=100, version="1.3.0-x&y"
    )
    r = nego(
        limits,
        tls_v1=True,
        deflate=True,
        deflate_level=8,
        sample_rate=10,
        msg_timeout=5000,
        output_buffer_size=-1,
        output_buffer_timeout=100,
        heartbeat_interval=-1,
    )
    assert r.response(limits) == (
        b'{"max_rdy_count":100,"version":"1.3.0-x\\u0026y","max_msg_timeout":900000,"msg_timeout":5000,'
        b'"tls_v1":true,"deflate":true,"deflate_level":8,"max_deflate_level":9,"snappy":false,'
        b'"sample_rate":10,"auth_required":true,"output_buffer_size":1,"output_buffer_timeout":0}'
    )
    assert r.heartbeat_interval_ms == -1
