"""``Wire``'s server list (``wire_servers.py``) and nkey encoding (``wire_auth.py``) without a
server; and the helpers the TLS, auth and cluster tests share: nats-servers started from a
configuration for one test and a certificate authority made with ``cryptography``."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common.infra import ManagedProcess, free_port, nats_server_binary, wait_for_port
from services.common.wire_auth import PREFIXES, KeyPair, decode_public_key, decode_seed, encode_seed, read_creds
from services.common.wire_servers import ServerPool, parse_server


# shared helpers ---------------------------------------------------------------------------
@dataclass
class Node:
    port: int
    proc: ManagedProcess

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    async def dead(self, timeout: float = 5.0) -> None:
        """Until the process has exited (its sockets closed)."""
        assert self.proc.proc is not None
        await asyncio.to_thread(self.proc.proc.wait, timeout)


class NatsServers:
    """nats-servers for one test, each from configuration text (``listen`` is added); all
    stopped at the test's end, whatever its outcome."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.nodes: list[Node] = []

    async def start(self, config: str = "", *, port: int | None = None, args: tuple[str, ...] = ()) -> Node:
        port = port or free_port()
        conf = self.directory / f"nats-{port}-{len(self.nodes)}.conf"
        conf.write_text(f"listen: 127.0.0.1:{port}\n{config}\n")
        proc = ManagedProcess("nats-server", [nats_server_binary(), "-c", str(conf), *args])
        proc.start(self.directory / f"nats-{port}.log")
        await asyncio.to_thread(wait_for_port, "127.0.0.1", port, proc)
        node = Node(port, proc)
        self.nodes.append(node)
        return node

    @staticmethod
    def plan(size: int = 3) -> list[tuple[int, tuple[str, ...]]]:
        """Ports and arguments for ``size`` nodes routed to each other (``-cluster`` / ``-routes``)."""
        ports = [(free_port(), free_port()) for _ in range(size)]
        planned: list[tuple[int, tuple[str, ...]]] = []
        for port, cport in ports:
            routes = ",".join(f"nats://127.0.0.1:{c}" for _, c in ports if c != cport)
            args = ("--cluster_name", "chorus-test", "--cluster", f"nats://127.0.0.1:{cport}", "--routes", routes)
            planned.append((port, args))
        return planned

    async def cluster(self, size: int = 3, config: str = "") -> list[Node]:
        return [await self.start(config, port=port, args=args) for port, args in self.plan(size)]

    def log(self, node: Node) -> str:
        return (self.directory / f"nats-{node.port}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for node in self.nodes:
            if node.proc.alive():
                os.kill(node.pid, signal.SIGCONT)  # a stopped server would not stop
                node.proc.stop(timeout=2)


@pytest.fixture
def nats_servers(tmp_path: Path) -> Iterator[NatsServers]:
    owned = NatsServers(tmp_path)
    yield owned
    owned.stop_all()


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


class Authority:
    """A certificate authority for one test module: certificates for servers and clients."""

    def __init__(self, directory: Path, name: str = "Chorus test CA") -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.name = subject
        self.cert = (
            self._builder(subject, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.ca = directory / f"{name.replace(' ', '-')}.pem"
        self.ca.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def _builder(self, subject: x509.Name, public: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(getattr(self, "name", subject))
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        )

    def issue(self, file: str, *, hosts: tuple[str, ...] = (), client: bool = False) -> Issued:
        """A certificate for ``hosts`` (IP addresses or names), or a client's."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = (
            self._builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, file)]), key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]),
                critical=False,
            )
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        issued = Issued(self.directory / f"{file}.pem", self.directory / f"{file}-key.pem")
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return issued


def seed(kind: str = "user") -> str:
    """A new nkey seed of ``kind`` (user, account, operator)."""
    return encode_seed(PREFIXES[kind], os.urandom(32))


# the server list ----------------------------------------------------------------------------
def test_server_urls_are_parsed_with_their_credentials() -> None:
    plain = parse_server("nats://127.0.0.1:4333")
    assert (plain.scheme, plain.host, plain.port, plain.user, plain.token) == ("nats", "127.0.0.1", 4333, None, None)
    assert parse_server("localhost").label == "nats://localhost:4222"  # bare host, default port
    assert parse_server("10.0.0.1:5222").port == 5222
    assert parse_server("tls://[::1]:4443").label == "tls://[::1]:4443"
    user = parse_server("nats://svc%20user:p%40ss@h:1")
    assert (user.user, user.password, user.token) == ("svc user", "p@ss", None)
    token = parse_server("nats://s3cret@h:1")
    assert (token.user, token.token) == (None, "s3cret")
    assert "s3cret" not in token.label and "p@ss" not in user.label
    for bad in ("ws://h:1", "http://h", "nats://h:99999"):
        with pytest.raises(ValueError):
            parse_server(bad)


def test_a_round_starts_after_the_current_server_and_learnt_ones_join() -> None:
    pool = ServerPool(["nats://a:1", "nats://b:2", "nats://c:3"], randomize=False)
    assert [s.host for s in pool.round()] == ["a", "b", "c"]
    pool.current = pool.servers[1]
    assert [s.host for s in pool.round()] == ["c", "a", "b"]  # the current one last
    added = pool.learn(["b:2", "d:4", "e:5"], tls_required=False)
    assert [s.label for s in added] == ["nats://d:4", "nats://e:5"] and all(s.discovered for s in added)
    pool.learn(["a:1", "e:5"], tls_required=False)  # d left the cluster: forgotten (given ones stay)
    assert [s.host for s in pool.servers] == ["a", "b", "c", "e"]
    shuffled = {tuple(s.host for s in ServerPool([f"nats://h{i}:1" for i in range(8)]).servers) for _ in range(20)}
    assert len(shuffled) > 1  # randomised unless asked not to


def test_a_server_learnt_by_address_is_verified_by_the_name_it_was_learnt_from() -> None:
    pool = ServerPool(["tls://nats.example.com:4222"], randomize=False)
    pool.current = pool.servers[0]
    (by_ip, by_name) = sorted(pool.learn(["10.1.2.3:4222", "n2.example.com:4222"], True), key=lambda s: s.host)
    assert by_ip.scheme == "tls" and by_ip.tls_name == "nats.example.com" and by_name.tls_name is None


# nkeys ------------------------------------------------------------------------------------
def test_nkey_seeds_decode_sign_and_reject_damage() -> None:
    # a seed and its public key as the nkeys library derives them (nkeys 0.2.1)
    known = "SUAMK2FG4MI6UE3ACF3FK3OIQBCEIEZV7NSWFFEW63UXMRLFM2XLAXK4GY"
    pair = KeyPair.from_seed(known)
    assert pair.public == "UAT6BWCSCWLUKJT6K6MBJJOEOTXZ5AJDOYKNEVRFC7VNO6OA43N4TRNO"
    assert pair.sign(b"abc") == (
        "IYI5-zG2HmmJ4GeiywvRvtlg73LkRKfK0XaP8PHhNcUSjOuzBCY4nBeeDqXNBu6zcshHfDlFwdohITqma2W2Cw"
    )
    kind, raw = decode_seed(known)
    assert kind == PREFIXES["user"] and encode_seed(kind, raw) == known
    assert decode_public_key(pair.public)[0] == PREFIXES["user"]
    for name in ("account", "operator"):
        made = seed(name)
        assert made[:2] == {"account": "SA", "operator": "SO"}[name]
        assert KeyPair.from_seed(made).public[0] == made[1]
    damaged = known[:10] + ("A" if known[10] != "A" else "B") + known[11:]
    for bad in (damaged, pair.public, "not base32!", ""):
        with pytest.raises(ValueError):
            KeyPair.from_seed(bad)


def test_a_creds_file_gives_its_jwt_and_seed() -> None:
    user_seed = seed()
    text = (
        "-----BEGIN NATS USER JWT-----\neyJhbGciOiJlZDI1NTE5In0.eyJzdWIiOiJVIn0.c2ln\n------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\nNKEY Seed printed below.\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user_seed}\n------END USER NKEY SEED------\n"
    )
    assert read_creds(text) == ("eyJhbGciOiJlZDI1NTE5In0.eyJzdWIiOiJVIn0.c2ln", user_seed)
    assert read_creds(text.replace("\n", "\r\n"))[1] == user_seed
    with pytest.raises(ValueError):
        read_creds(text.split("************")[0])  # the seed missing
