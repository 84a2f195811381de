"""The gRPC echo backend (`gwpolicy echo --grpc`, gateway/grpcecho.py) answers as the Gateway API
suite's gRPC echo server does, checked with a real grpcio client: which pod and namespace answered,
the method it ran, the metadata that reached it; UNIMPLEMENTED for EchoThree and unknown methods;
the suite's wire format; gRPC over TLS; many calls at once (the weight check sends them); the command.

Addresses: 127.0.90.0/24.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gwpolicy.gateway.grpcecho import EchoResponse, GrpcEchoServer, call, channel

ADDR = "127.0.90.1"
NS = "gateway-conformance-infra"
BIN = Path(sys.executable).parent


@pytest.fixture
def echo():
    with GrpcEchoServer("grpc-infra-backend-v1-7f9c-x2k4", NS, address=ADDR) as server:
        yield server


def test_echo_reports_pod_namespace_method_and_the_metadata_it_received(echo):
    chan = channel(f"{ADDR}:{echo.port}", authority="foo.bar.com")
    try:
        one = call(chan, "Echo", [("version", "two"), ("color", "orange")])
        two = call(chan, "EchoTwo")
    finally:
        chan.close()
    assert one.code == grpc.StatusCode.OK
    assert one.pod == "grpc-infra-backend-v1-7f9c-x2k4" and one.namespace == NS
    assert one.method == "/gateway_api_conformance.echo_basic.grpcecho.GrpcEcho/Echo"
    assert two.method == "/gateway_api_conformance.echo_basic.grpcecho.GrpcEcho/EchoTwo"
    md = one.metadata()
    assert md["version"] == ["two"] and md["color"] == ["orange"]
    # the :authority, as the suite's server lists it among the headers and in its own field
    assert md[":authority"] == ["foo.bar.com"] and one.response.assertions.authority == "foo.bar.com"
    assert echo.requests == 2 and echo.seen[-1].fully_qualified_method.endswith("/EchoTwo")


def test_echo_three_and_unknown_methods_are_unimplemented(echo):
    chan = channel(f"{ADDR}:{echo.port}")
    try:
        assert call(chan, "EchoThree").code == grpc.StatusCode.UNIMPLEMENTED
        other = chan.unary_unary("/some.Other/Echo")
        with pytest.raises(grpc.RpcError) as e:
            other(b"", timeout=5)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        chan.close()
    assert echo.requests == 0


def test_the_answer_uses_the_suites_field_numbers():
    """EchoResponse.assertions is field 1, Assertions.fully_qualified_method 1 and .context 4,
    Context.pod 4 (echo-basic's grpcecho.proto): the suite's client decodes these bytes."""
    msg = EchoResponse(assertions={"fully_qualified_method": "/x", "context": {"pod": "p"}})
    assert msg.SerializeToString() == bytes.fromhex("0a09" "0a022f78" "2203" "220170")
    header = EchoResponse(assertions={"headers": [{"key": "k", "value": "v"}], "authority": "a"})
    # Assertions.headers = 2 (Header.key 1, .value 2), .authority = 3
    assert header.SerializeToString() == bytes.fromhex("0a0b" "1206" "0a016b" "120176" "1a0161")


def test_grpc_over_tls_with_a_verified_certificate(tmp_path):
    from gwconformance import make_ca, make_cert

    ca_cert, ca_key = make_ca()
    cert, key = make_cert(["abc.example.com"], signer=(ca_cert, ca_key))
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    from cryptography.hazmat.primitives import serialization

    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    with GrpcEchoServer("grpc-infra-backend-v1-a-b", NS, address=ADDR, cert=str(tmp_path / "tls.crt"),
                        key=str(tmp_path / "tls.key")) as server:
        good = channel(f"{ADDR}:{server.port}", root_certificates=ca_pem, server_name="abc.example.com")
        other_ca, _ = make_ca()
        bad = channel(f"{ADDR}:{server.port}", root_certificates=other_ca.public_bytes(serialization.Encoding.PEM),
                      server_name="abc.example.com")
        plain = channel(f"{ADDR}:{server.port}")
        try:
            ok = call(good, "Echo")
            assert ok.code == grpc.StatusCode.OK and ok.pod == "grpc-infra-backend-v1-a-b"
            assert ok.response.assertions.tls_assertions.negotiated_protocol == "h2"
            assert call(bad, "Echo", timeout=3).code == grpc.StatusCode.UNAVAILABLE  # unknown CA
            assert call(plain, "Echo", timeout=3).code == grpc.StatusCode.UNAVAILABLE  # no TLS
        finally:
            for c in (good, bad, plain):
                c.close()
        assert server.requests == 1


def test_many_calls_at_once_all_answer(echo):
    """The weighted-backend check sends its calls 10 at a time; 200 calls from 20 threads all answer."""
    chan = channel(f"{ADDR}:{echo.port}")
    try:
        with futures.ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(lambda i: call(chan, "Echo", [("x-jitter", str(i))]), range(200)))
    finally:
        chan.close()
    assert [a.code for a in answers] == [grpc.StatusCode.OK] * 200
    assert sorted(int(a.metadata()["x-jitter"][0]) for a in answers) == list(range(200))


def test_the_command_serves_until_sigterm():
    proc = subprocess.Popen([str(BIN / "gwpolicy"), "echo", "--grpc", "--port", "0", "--address", ADDR,
                             "--pod", "grpc-infra-backend-v2-c-d", "--namespace", NS],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"h2c://127\.0\.90\.1:(\d+)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        chan = channel(f"{ADDR}:{m.group(1)}")
        try:
            answer = call(chan, "EchoTwo")
        finally:
            chan.close()
        assert answer.code == grpc.StatusCode.OK and answer.pod == "grpc-infra-backend-v2-c-d"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_the_command_refuses_a_certificate_without_a_key():
    out = subprocess.run([str(BIN / "gwpolicy"), "echo", "--grpc", "--port", "0", "--pod", "p", "--namespace", "n",
                          "--cert", "/nonexistent.pem"], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "--cert and --key go together" in out.stderr
    assert "Traceback" not in out.stderr
