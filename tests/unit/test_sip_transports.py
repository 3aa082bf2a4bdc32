"""The stream transports name themselves in what they send: a request's top Via and every Contact."""

from __future__ import annotations

from aiosipua import SipRequest, SipResponse

from gateway.protocol.sip_transports import StreamSipTransport, TlsSipTransport


class Recording:
    sent: list[bytes]

    def __init__(self) -> None:
        self.sent = []

    def write(self, data: bytes) -> None:
        self.sent.append(data)


def sent_by(transport: StreamSipTransport, message: SipRequest | SipResponse) -> str:
    writer = Recording()
    transport._connections[("127.0.0.1", 5999)] = (None, writer)  # type: ignore[assignment]
    transport._spawn = lambda coroutine: coroutine.close()  # type: ignore[method-assign,assignment,return-value]
    transport.send(message, ("127.0.0.1", 5999))
    return writer.sent[0].decode()


def test_a_bye_over_tls_says_tls_in_its_via_and_contact() -> None:
    bye = SipRequest(method="BYE", uri="sip:caller@127.0.0.1:5999;transport=tls")
    bye.headers.append("Via", "SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK1;rport")
    bye.headers.append("Via", "SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bK0")
    bye.headers.append("Contact", "<sip:127.0.0.1:5061>")
    text = sent_by(TlsSipTransport(local_addr=("127.0.0.1", 5061)), bye)
    vias = [line for line in text.split("\r\n") if line.lower().startswith("via:")]
    assert vias == ["Via: SIP/2.0/TLS 127.0.0.1:5061;branch=z9hG4bK1;rport", "Via: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bK0"]
    assert "Contact: <sip:127.0.0.1:5061;transport=tls>" in text


def test_a_response_over_tcp_keeps_the_callers_via_and_names_tcp_in_its_contact() -> None:
    ok = SipResponse(status_code=200, reason_phrase="OK")
    ok.headers.append("Via", "SIP/2.0/TCP 127.0.0.1:5999;branch=z9hG4bK2")
    ok.headers.append("Contact", "<sip:127.0.0.1:5060>")
    text = sent_by(StreamSipTransport(local_addr=("127.0.0.1", 5060)), ok)
    assert "Via: SIP/2.0/TCP 127.0.0.1:5999;branch=z9hG4bK2" in text
    assert "Contact: <sip:127.0.0.1:5060;transport=tcp>" in text
    already = SipResponse(status_code=200, reason_phrase="OK")
    already.headers.append("Contact", "<sip:127.0.0.1:5060;transport=TCP>")
    assert "Contact: <sip:127.0.0.1:5060;transport=TCP>" in sent_by(StreamSipTransport(), already)
