#!/usr/bin/env python3
"""Installs Prometheus and promtool into the virtualenv, without root: Debian bookworm's
`prometheus` package, fetched from Debian's archive, its SHA-256 checked against the pin
below, and the two binaries taken out of it (standard library only: a .deb is an `ar`
archive holding a compressed tar).

    python3 tools/prometheus.py .venv     # .venv/prometheus/bin/{prometheus,promtool},
                                          # linked as .venv/bin/prometheus and promtool

The tests use them (`make setup` runs this): `promtool check rules` / `test rules` on
deploy/prometheus/, and a real Prometheus scraping the testbed. Debian's builds are Go
binaries linked against libc only.

Where the pinned file is gone from the archive (a point release replaced the build) or the
machine is not amd64, `apt-get download prometheus` fetches the package instead (no root
needed, apt checks it against its signed lists); that needs apt's lists on the machine.
"""

import hashlib
import io
import lzma
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

VERSION = "2.42.0+ds-5+b6"
# `apt-get download --print-uris prometheus` on bookworm (amd64).
PINNED = {
    "x86_64": (
        "https://deb.debian.org/debian/pool/main/p/prometheus/"
        "prometheus_2.42.0%2bds-5%2bb6_amd64.deb",
        19252676,
        "3b0e0255b059a7696bd4a139a4a4eb24d71df067936a61ece5093559cbc7991c",
    ),
}
BINARIES = ("prometheus", "promtool")


def download_pinned():
    """The pinned .deb's bytes, or None where there is no pin or it cannot be fetched."""
    pin = PINNED.get(platform.machine())
    if pin is None:
        return None
    url, size, sha256 = pin
    try:
        with urllib.request.urlopen(url, timeout=120) as resp:
            data = resp.read()
    except OSError as e:
        print(f"prometheus: {url}: {e}; trying apt-get download", file=sys.stderr)
        return None
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != size or digest != sha256:
        raise SystemExit(f"prometheus: {url}: {len(data)} bytes, sha256 {digest}; "
                         f"expected {size} bytes, sha256 {sha256}")
    return data


def download_apt():
    """The package as `apt-get download` fetches it (checked by apt), or exits."""
    if shutil.which("apt-get") is None:
        raise SystemExit("prometheus: no pinned package for this machine and no apt-get")
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(["apt-get", "download", "prometheus"], cwd=tmp,
                             capture_output=True, text=True)
        debs = list(Path(tmp).glob("prometheus_*.deb"))
        if run.returncode != 0 or not debs:
            raise SystemExit("prometheus: `apt-get download prometheus` failed (no apt lists? "
                             f"run `apt-get update`):\n{run.stderr}")
        return debs[0].read_bytes()


def ar_members(data):
    """{name: bytes} of an `ar` archive (the format of a .deb)."""
    if not data.startswith(b"!<arch>\n"):
        raise SystemExit("prometheus: not a .deb (no ar header)")
    members, pos = {}, 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        members[name] = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size % 2)
    return members


def data_tar(members):
    for name, body in members.items():
        if name == "data.tar.xz":
            return tarfile.open(fileobj=io.BytesIO(lzma.decompress(body)))
        if name in ("data.tar.gz", "data.tar"):
            return tarfile.open(fileobj=io.BytesIO(body))
    raise SystemExit(f"prometheus: no data.tar.xz in the package ({sorted(members)})")


def install(venv):
    venv = Path(venv)
    home = venv / "prometheus"
    data = download_pinned() or download_apt()
    tar = data_tar(ar_members(data))
    fresh = Path(tempfile.mkdtemp(prefix="prometheus.", dir=venv))
    fresh.chmod(0o755)
    (fresh / "bin").mkdir()
    for name in BINARIES:
        member = tar.getmember(f"./usr/bin/{name}")
        target = fresh / "bin" / name
        with tar.extractfile(member) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out)
        target.chmod(0o755)
    # Replace, never half-install: the new tree goes in place whole.
    if home.exists():
        shutil.rmtree(home)
    os.replace(fresh, home)
    for name in BINARIES:
        link = venv / "bin" / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path("..") / "prometheus" / "bin" / name)
        out = subprocess.run([str(link), "--version"], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"prometheus: {link} --version failed:\n{out.stderr}")
        print((out.stdout or out.stderr).splitlines()[0])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    install(sys.argv[1])
