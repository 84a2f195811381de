"""Network namespaces for tests: "hosts" on a private bridge, each with its own network stack.

A `Fabric` is one bridge in the root network namespace and any number of `Host`s, each a network
namespace (`ip netns add`) joined to the bridge by a veth pair, with its own address on it. What a
test can do with it:

- serve from the root namespace on the bridge's own addresses (`fabric.gateway`, or more with
  `fabric.add_root_address()`), and reach them from every host;
- serve from a host on its address (or on any address added with `host.add_address`), and reach it
  from the root namespace and from every other host;
- bind the same address in several hosts (`host.add_address("198.19.0.10")` on each host's
  loopback): each host reaches its own copy, which is how a per-namespace proxy serves a
  Service's cluster IP to its own namespace only;
- give a host its own `/etc/hosts` (`host.hosts_file({"api.example.test": address})`): what a command
  run inside it with `ip netns exec` resolves names with;
- run a command inside a host (`host.run`, `host.popen`: `ip netns exec`), or run Python code in
  it (`with host.enter():` moves the calling thread into the host's namespace; sockets made there
  stay in that namespace after the block, so a server started inside keeps serving there);
- add a route on a host to a further network reached through the bridge (`host.add_route`).

Addresses. Every fabric takes one free /24 of 198.18.0.0/16 (RFC 2544's benchmarking block: never
routed on the internet and not used by real networks; a /24 that overlaps an address or route of
the root namespace is skipped), so several fabrics, of one test run or of runs going on at the
same time, never share addresses. Loopback addresses (127.0.0.0/8) cannot be used: the kernel does
not route them between namespaces. Hosts have no default route and the root namespace forwards
nothing, so a host reaches only the fabric's /24, routes a test adds, its own loopback and
addresses; nothing leaves the machine. `CLUSTER_IPS` (198.19.0.0/16, outside every fabric) is
where tests take the addresses they bind inside hosts only.

Names and cleanup. A fabric's objects are named `gwt<id>...` (netns `gwt<id>-<host>`, its files
in `/etc/netns/gwt<id>-<host>/`, bridge `gwt<id>br`, root-side veth ends `gwt<id>v<n>`), where `<id>` is random per fabric and recorded,
with the owning process (pid and start time), in /run/gwpolicy-testnet/<id>.json before anything
is made. `close()` (also on `with` exit, on failure, and at interpreter exit) deletes them and
checks that none is left. A run that was killed leaves its record behind: the next fabric made on
the machine deletes every `gwt` object whose record names a process that is gone, or that has no
record.

Why these tools: namespaces, links and addresses are made with iproute2's `ip` (the standard
tool, one `ip -batch` per namespace), not by speaking netlink by hand; a thread enters a
namespace with the one `setns(2)` call through ctypes (network namespaces are per thread, and
setns on a network namespace is allowed in a threaded process), where a netlink library such as
pyroute2 would be a new dependency for one system call. Commands run with `ip netns exec`, which
also gives them the namespace's `/etc/netns/<name>/` files (a host's own `hosts` file, for one).

Needs root, or CAP_NET_ADMIN and CAP_SYS_ADMIN (`ip netns add` mounts the namespace on
/run/netns). `unavailable()` says in words why namespaces cannot be made here; tests skip with it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

PREFIX = "gwt"
STATE_DIR = Path("/run/gwpolicy-testnet")
NETNS_DIR = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")  # per-namespace files `ip netns exec` mounts over /etc (hosts, resolv.conf)
FABRIC_SUBNETS = ipaddress.ip_network("198.18.0.0/16")
CLUSTER_IPS = ipaddress.ip_network("198.19.0.0/16")
CLONE_NEWNET = 0x40000000
_CAP_SYS_ADMIN, _CAP_NET_ADMIN = 21, 12


class NetnsError(RuntimeError):
    """A namespace, link or address could not be made; the message has the command and its error."""


def _ip(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(["ip", *args], input=stdin, capture_output=True, text=True, timeout=30)
    if check and run.returncode != 0:
        what = " ".join(args) + (f" (batch: {stdin.strip()!r})" if stdin else "")
        raise NetnsError(f"ip {what}: {run.stderr.strip() or run.stdout.strip()}")
    return run


# ---------------------------------------------------------------------------------------------
# can namespaces be made here?

_unavailable: list[str | None] = []


def unavailable() -> str | None:
    """Why network namespaces cannot be made on this machine, in words; None when they can.

    Checked once per process: the platform, iproute2, the capabilities, then one real namespace
    made and deleted (a container may hold the capabilities and still be refused)."""
    if _unavailable:
        return _unavailable[0]
    _unavailable.append(_why_unavailable())
    return _unavailable[0]


def _why_unavailable() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (Debian package iproute2; ./dev test installs it)"
    caps = _effective_caps()
    missing = [name for bit, name in ((_CAP_NET_ADMIN, "CAP_NET_ADMIN"), (_CAP_SYS_ADMIN, "CAP_SYS_ADMIN"))
               if not caps >> bit & 1]
    if missing:
        who = "not root" if os.geteuid() != 0 else "root without them"
        return (f"network namespaces need {' and '.join(missing)} ({who}; `ip netns add` mounts the "
                "namespace and makes links): run the tests as root, or in a container with those capabilities")
    probe = f"gwprobe{os.getpid()}"  # not PREFIX: no sweep ever mistakes it for a fabric
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _effective_caps() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


# ---------------------------------------------------------------------------------------------
# entering a namespace (per thread)

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(netns_path: str | Path) -> Iterator[None]:
    """Run the block with the calling thread in the network namespace at `netns_path`, then return
    the thread to the namespace it was in. Sockets made inside stay in that namespace."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)  # a failure here leaves the thread elsewhere: let it raise, never hide it
    finally:
        os.close(own)


# ---------------------------------------------------------------------------------------------
# records of fabrics, for cleanup after a killed run

def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks): tells a live process from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _records() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for p in STATE_DIR.glob("*.json"):
        try:
            out[p.stem] = json.loads(p.read_text())
        except (OSError, ValueError):
            out[p.stem] = {}
    return out


def _alive(record: dict[str, Any]) -> bool:
    pid = record.get("pid")
    return isinstance(pid, int) and _start_time(pid) is not None and _start_time(pid) == record.get("start")


def leftovers(fabric_id: str | None = None) -> list[str]:
    """Namespaces, their /etc files and root links of fabrics (all, or one), as `netns NAME`,
    `etc NAME` / `link NAME`."""
    stem = PREFIX + (fabric_id or "")
    names = [f"netns {p.name}" for p in sorted(NETNS_DIR.glob(stem + "*"))] if NETNS_DIR.is_dir() else []
    names += [f"etc {p.name}" for p in sorted(ETC_NETNS.glob(stem + "*"))] if ETC_NETNS.is_dir() else []
    links = _ip("-o", "link", "show", check=False).stdout.splitlines()
    for line in links:
        name = line.split(":", 2)[1].strip().split("@", 1)[0] if line.count(":") >= 2 else ""
        if name.startswith(stem):
            names.append(f"link {name}")
    return names


def _id_of(name: str) -> str:
    return name[len(PREFIX):len(PREFIX) + 6]


def _delete(fabric_id: str) -> None:
    """Delete every namespace and root link of one fabric (deleting a namespace deletes its veth
    pairs; the bridge goes last)."""
    for item in leftovers(fabric_id):
        kind, name = item.split(" ", 1)
        if kind == "netns":
            _ip("netns", "del", name, check=False)
        elif kind == "etc":
            shutil.rmtree(ETC_NETNS / name, ignore_errors=True)
    for item in leftovers(fabric_id):
        kind, name = item.split(" ", 1)
        if kind == "link":
            _ip("link", "del", name, check=False)
    with contextlib.suppress(FileNotFoundError):
        (STATE_DIR / f"{fabric_id}.json").unlink()


def sweep() -> list[str]:
    """Delete what fabrics of dead processes left (a killed run); the ids deleted. Holds the lock."""
    records = _records()
    found = {_id_of(item.split(" ", 1)[1]) for item in leftovers()} | set(records)
    dead = sorted(i for i in found if i and not _alive(records.get(i, {})))
    for i in dead:
        _delete(i)
    return dead


# ---------------------------------------------------------------------------------------------
# the fabric

def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 address and route of the root namespace, as networks."""
    out: list[ipaddress.IPv4Network] = []
    for args in (("-4", "-o", "addr", "show"), ("-4", "route", "show", "table", "all")):
        for line in _ip(*args, check=False).stdout.splitlines():
            for word in line.split():
                try:
                    net = ipaddress.ip_network(word, strict=False)
                except ValueError:
                    continue
                if isinstance(net, ipaddress.IPv4Network):
                    out.append(net)
    return out


class Host:
    """One network namespace on a fabric: `address` on its `eth0`, the fabric's /24 reachable."""

    def __init__(self, fabric: "Fabric", name: str, index: int, address: str) -> None:
        self.fabric, self.name, self.index, self.address = fabric, name, index, address
        self.netns = f"{PREFIX}{fabric.id}-{name}"
        self.path = NETNS_DIR / self.netns

    def __repr__(self) -> str:
        return f"Host({self.name!r}, netns={self.netns!r}, address={self.address!r})"

    def add_address(self, address: str, device: str = "lo") -> str:
        """Bind one more address in this host (a /32 on its loopback by default: only this host
        reaches it). Returns the address."""
        ip = ipaddress.ip_interface(address if "/" in address else f"{address}/32")
        _ip("-n", self.netns, "addr", "add", str(ip), "dev", device)
        return str(ip.ip)

    def hosts_file(self, names: dict[str, str]) -> None:
        """This host's own /etc/hosts (name -> address, and localhost), for commands run inside it
        (`run`, `popen`: `ip netns exec` mounts it over /etc/hosts); the fabric's close deletes it."""
        directory = ETC_NETNS / self.netns
        directory.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost", "::1 localhost"] + [f"{address} {name}" for name, address in names.items()]
        (directory / "hosts").write_text("\n".join(lines) + "\n")

    def add_route(self, network: str, via: str | None = None) -> None:
        """Reach `network` through the bridge (by default through the root namespace's address)."""
        _ip("-n", self.netns, "route", "add", network, "via", via or self.fabric.gateway)

    def enter(self) -> contextlib.AbstractContextManager[None]:
        """`with host.enter():` the calling thread is in this host's namespace for the block."""
        return entered(self.path)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(*args, **kwargs) run by the calling thread inside this host."""
        with self.enter():
            return fn(*args, **kwargs)

    def command(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def run(self, argv: Sequence[str], timeout: float = 30, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run a command inside this host (`ip netns exec`), output captured, bounded in time."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(argv), timeout=timeout, **kwargs)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start a command inside this host; the caller stops it (the fabric's close does not)."""
        return subprocess.Popen(self.command(argv), **kwargs)


class Fabric:
    """A bridge in the root namespace and `Host`s on it. Use as a context manager, or call close()."""

    MAX_HOSTS = 200

    def __init__(self, hosts: Sequence[str] = ()) -> None:
        why = unavailable()
        if why:
            raise NetnsError(why)
        self.hosts: dict[str, Host] = {}
        self._root_extra: list[str] = []
        self._closed = False
        with _locked():
            sweep()
            self.id = self._new_id()
            self.subnet = self._free_subnet()
            record = {"pid": os.getpid(), "start": _start_time(os.getpid()), "subnet": str(self.subnet)}
            (STATE_DIR / f"{self.id}.json").write_text(json.dumps(record))
        atexit.register(self.close)
        self.bridge = f"{PREFIX}{self.id}br"
        self.gateway = str(self.subnet.network_address + 1)
        try:
            _ip("-batch", "-", stdin=(f"link add {self.bridge} type bridge nf_call_iptables 0 nf_call_ip6tables 0 "
                                      "nf_call_arptables 0\n"
                                      f"addr add {self.gateway}/{self.subnet.prefixlen} dev {self.bridge}\n"
                                      f"link set {self.bridge} up\n"))
            for name in hosts:
                self.add_host(name)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _new_id() -> str:
        taken = set(_records())
        while True:
            i = secrets.token_hex(3)
            if i not in taken:
                return i

    @staticmethod
    def _free_subnet() -> ipaddress.IPv4Network:
        used = _used_networks()
        taken = {r.get("subnet") for r in _records().values() if _alive(r)}
        for net in FABRIC_SUBNETS.subnets(new_prefix=24):
            if str(net) not in taken and not any(net.overlaps(u) for u in used):
                return net
        raise NetnsError(f"no free /24 left in {FABRIC_SUBNETS} (every one overlaps a route or another fabric)")

    def __enter__(self) -> "Fabric":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def add_host(self, name: str) -> Host:
        """A new namespace on the bridge with the next address of the fabric's /24."""
        if name in self.hosts or not name.replace("-", "").isalnum() or len(name) > 40:
            raise ValueError(f"host name {name!r}: must be new, letters, digits and '-', at most 40 characters")
        index = len(self.hosts)
        if index >= self.MAX_HOSTS:
            raise NetnsError(f"at most {self.MAX_HOSTS} hosts on one fabric")
        host = Host(self, name, index, str(self.subnet.network_address + 2 + index))
        veth = f"{PREFIX}{self.id}v{index}"
        self.hosts[name] = host
        _ip("-batch", "-", stdin=(f"netns add {host.netns}\n"
                                  f"link add {veth} type veth peer name eth0 netns {host.netns}\n"
                                  f"link set {veth} master {self.bridge}\n"
                                  f"link set {veth} up\n"))
        _ip("-n", host.netns, "-batch", "-", stdin=("link set lo up\n"
                                                     f"addr add {host.address}/{self.subnet.prefixlen} dev eth0\n"
                                                     "link set eth0 up\n"))
        return host

    def add_root_address(self) -> str:
        """One more address of the fabric's /24 in the root namespace (on the bridge), from the top
        of the /24 down: a server in the test process binds it and every host reaches it."""
        address = str(self.subnet.broadcast_address - 1 - len(self._root_extra))
        if ipaddress.ip_address(address) <= self.subnet.network_address + 2 + len(self.hosts):
            raise NetnsError(f"the fabric's {self.subnet} is full")
        _ip("addr", "add", f"{address}/32", "dev", self.bridge)
        self._root_extra.append(address)
        return address

    def close(self) -> None:
        """Delete the hosts and the bridge; raise if anything of this fabric is left."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        with _locked():
            _delete(self.id)
            left = leftovers(self.id)
        if left:
            raise NetnsError(f"fabric {self.id}: could not delete {', '.join(left)}")


def forward_into(host: Host, port: int, target: tuple[str, int] | None = None,
                 address: str = "127.0.0.1") -> Callable[[], None]:
    """Serve `address:port` (a loopback address) inside `host` by relaying each connection to
    `target` (default the same address and port) in the root namespace: a server of the test
    process on loopback (an API server) reached from the hosts. Returns a function that stops the relay."""
    import socket

    with host.enter():
        server = socket.create_server((address, port))
    target = target or (address, port)
    server.settimeout(0.2)
    stop = threading.Event()

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def accept() -> None:  # this thread was made in the root namespace: its connections are made there
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                up = socket.create_connection(target, timeout=5)
            except OSError:
                conn.close()
                continue
            up.settimeout(None)
            conn.settimeout(None)
            threading.Thread(target=pump, args=(conn, up), daemon=True).start()
            threading.Thread(target=pump, args=(up, conn), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()

    def close() -> None:
        stop.set()
        t.join(2)
        server.close()

    return close


def run_in_thread(host: Host, fn: Callable[[], T], timeout: float = 30) -> T:
    """fn() in a new thread inside `host` (for code that must not move the caller's thread)."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["value"] = host.call(fn)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"{fn!r} in {host.name} did not finish within {timeout} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


__all__ = ["CLUSTER_IPS", "FABRIC_SUBNETS", "Fabric", "Host", "NetnsError", "entered", "forward_into", "leftovers",
           "run_in_thread", "sweep", "unavailable"]
