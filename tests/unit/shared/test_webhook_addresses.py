"""Webhook addresses (issue 44 item 8): an IPv6 address that carries a non-public IPv4 one
(NAT64, IPv4-mapped, IPv4-compatible, 6to4, Teredo) is refused like that IPv4 address, at the
gate for literal addresses and for names that resolve to one, and by the dispatcher's check."""

from __future__ import annotations

import ipaddress

import pytest

from shared.errors import InvalidRequestError
from shared.jobs import RequestLimits, validate_request
from shared.webhook_addresses import AddressRefused, address_problem, checked_addresses
from shared.webhooks import check_webhook_url

REFUSED = [
    ("64:ff9b::a9fe:a9fe", "link-local (it embeds 169.254.169.254)"),  # NAT64 of the metadata IP
    ("64:ff9b::7f00:1", "loopback (it embeds 127.0.0.1)"),
    ("64:ff9b::a00:1", "private (it embeds 10.0.0.1)"),
    ("64:ff9b:1::a9fe:a9fe", "link-local (it embeds 169.254.169.254)"),
    ("64:ff9b:1::808:808", "a local-use NAT64 address"),
    ("::ffff:169.254.169.254", "link-local (it embeds 169.254.169.254)"),
    ("::ffff:127.0.0.1", "loopback (it embeds 127.0.0.1)"),
    ("::127.0.0.1", "loopback (it embeds 127.0.0.1)"),  # IPv4-compatible
    ("::a9fe:a9fe", "link-local (it embeds 169.254.169.254)"),
    ("2002:a9fe:a9fe::1", "link-local (it embeds 169.254.169.254)"),  # 6to4
    ("2002:c0a8:101::1", "private (it embeds 192.168.1.1)"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "private (it embeds 192.0.2.45)"),  # Teredo
    ("::808:808", "reserved"),  # IPv4-compatible: deprecated, never routed
    ("169.254.169.254", "link-local"),
    ("127.0.0.2", "loopback"),
    ("10.1.2.3", "private"),
    ("100.64.0.1", "not public"),  # carrier-grade NAT
    ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"),
    ("240.0.0.1", "private"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("fe80::1", "link-local"),
    ("fc00::1", "private"),
]


@pytest.mark.parametrize(("address", "problem"), REFUSED)
def test_every_form_of_a_non_public_address_is_refused(address: str, problem: str) -> None:
    assert address_problem(ipaddress.ip_address(address)) == problem


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "64:ff9b::808:808", "2002:808:808::1", "2606:4700:4700::1111"]
)
def test_public_addresses_and_forms_that_embed_one_pass(address: str) -> None:
    assert address_problem(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(("address", "problem"), REFUSED[:13])
def test_the_gate_refuses_a_literal_address_in_a_webhook_url(address: str, problem: str) -> None:
    url = f"http://[{address}]/hook" if ":" in address else f"http://{address}/hook"
    limits = RequestLimits(webhook_allowed_urls=("http://",))
    with pytest.raises(
        InvalidRequestError, match="webhook: .* is " + problem.split(" (", maxsplit=1)[0]
    ):
        validate_request({"text": "hi", "webhook": {"url": url}}, limits)
    allowed = RequestLimits(webhook_allowed_urls=("http://",), webhook_allow_private=True)
    assert validate_request({"text": "hi", "webhook": {"url": url}}, allowed).webhook


def test_a_host_name_that_resolves_to_loopback_is_refused_where_names_are_resolved() -> None:
    url = "http://localhost:9/hook"
    with pytest.raises(ValueError, match=r"localhost resolves to .*, which is loopback"):
        check_webhook_url(url, ("http://",), resolve_names=True)
    assert check_webhook_url(url, ("http://",))  # the worker never calls DNS at the gate
    assert check_webhook_url(url, ("http://",), allow_private=True, resolve_names=True)
    unresolvable = "http://no-such-host.invalid/hook"  # the dispatcher judges it later
    assert check_webhook_url(unresolvable, ("http://",), resolve_names=True)


def test_the_dispatchers_check_resolves_once_and_refuses_any_bad_answer() -> None:
    with pytest.raises(AddressRefused, match="loopback"):
        checked_addresses("localhost", 80, allow_private=False)
    assert ipaddress.ip_address("127.0.0.1") in checked_addresses(
        "localhost", 80, allow_private=True
    )
    with pytest.raises(OSError):
        checked_addresses("no-such-host.invalid", 80, allow_private=False)
